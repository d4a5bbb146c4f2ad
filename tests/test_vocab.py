"""Vocabulary shortlists: budgets, segmented heads, FR-Spec and DynaSpec, greedy identity on
tiny models and SmolLM2, clusters, corpus handling, feature caching and router training."""

import json
from pathlib import Path

import pytest
import torch
from conftest import tiny_folder_and_corpus, tiny_hf_model

from quickdraft import SamplingParams, generate
from quickdraft.drafters.base import Batch, ShortlistContext
from quickdraft.drafters.registry import make_spec
from quickdraft.models.base import Slots
from quickdraft.models.llama import LlamaRunner
from quickdraft.vocab import (
    ClusterShortlist,
    FrequencyShortlist,
    Router,
    RouterConfig,
    ShortlistChoice,
    build_shortlist,
    position_budget,
)
from quickdraft.vocab.clusters import spherical_kmeans
from quickdraft.vocab.shortlist import (
    save_clusters,
    save_frequency,
)

VOCAB = 101


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_new_tokens=n)


@pytest.fixture(scope="module")
def pair():
    hf = tiny_hf_model("llama-tied", vocab_size=VOCAB, layers=3)
    target = LlamaRunner.from_state_dict(hf.config.to_dict(), hf.state_dict())
    return target, target.truncated(1)


def random_router(hidden: int, clusters: int, seed: int = 0) -> Router:
    torch.manual_seed(seed)
    return Router(RouterConfig(hidden, clusters, width=16)).eval()


def shortlists(draft: LlamaRunner, k: int) -> dict:
    ranked = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(3))
    assignment = spherical_kmeans(draft.head_weight, 8, seed=0)
    router = random_router(draft.config.hidden_size, 8)
    return {
        "fr": FrequencyShortlist(ranked, [40]),
        "fr-pa": FrequencyShortlist.position_aware(ranked, 60, k),
        "dyna": ClusterShortlist(assignment, router, 3, position_aware=False),
        "dyna-pa": ClusterShortlist(assignment, router, 4, position_aware=True),
        "dyna-pa-parallel": ClusterShortlist(assignment, router, 4, parallel=True),
    }


def test_position_budget_follows_the_schedule():
    assert [position_budget(32, t) for t in range(6)] == [32, 32, 5, 4, 3, 2]
    assert [position_budget(2, t) for t in range(4)] == [2, 2, 1, 1]  # never below one
    with pytest.raises(ValueError, match="k_max"):
        position_budget(0, 0)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("full", ("full", 0)), ("fr:32768", ("fr", 32768)), ("dyna-pa:32", ("dyna-pa", 32))],
)
def test_a_shortlist_choice_reads_its_text(text, expected):
    choice = ShortlistChoice.parse(text)
    assert (choice.kind, choice.size) == expected
    assert ShortlistChoice.parse(str(choice)) == choice


@pytest.mark.parametrize(
    "text",
    ["fr", "fr:0", "fr:x", "full:3", "vocabtrim:10", "dyna:-1", " fr:32", "fr:32 ",
     "fr:\u0661\u0662",
     "fr:\u00b2", "fr:" + "9" * 5000, "full:"],
)  # fmt: skip
def test_a_shortlist_choice_rejects_bad_text(text):
    with pytest.raises(ValueError, match="draft_shortlist"):
        ShortlistChoice.parse(text)


def test_spec_config_validates_the_shortlist():
    with pytest.raises(ValueError, match="draft_shortlist"):
        make_spec(draft_shortlist="fr:0")
    with pytest.raises(ValueError, match="draft_model and medusa and eagle only"):
        make_spec(method="ngram", draft_shortlist="fr:10")
    spec = make_spec(draft_shortlist="dyna-pa:8")
    assert spec.options.draft_shortlist == ShortlistChoice("dyna-pa", 8)
    for method in ("eagle", "medusa"):  # heads scoring the target's own rows take them too
        spec = make_spec(method=method, draft_shortlist="fr:64")
        assert str(spec.options.draft_shortlist) == "fr:64"
        with pytest.raises(ValueError, match="draft_shortlist"):
            make_spec(method=method, draft_shortlist="fr:x")


@pytest.mark.parametrize("text", ["dyna:0", "dyna-hybrid:0"])
def test_zero_clusters_route_nothing_and_leave_the_core(tmp_path, text):
    """The hybrid's ablations: ``dyna:0`` is its core alone, ``dyna-hybrid:0`` the core and
    the sequence's tokens; artifacts without a core refuse ``dyna:0`` by name."""

    vocab, hidden = 40, 8
    assert ShortlistChoice.parse(text).size == 0
    router = Router(RouterConfig(hidden, 4, width=8)).eval()
    router.save(tmp_path, inputs="hidden")
    save_frequency(tmp_path, torch.rand(vocab), {})
    assignment = torch.arange(vocab) % 4
    assignment[:10] = -1  # the core
    save_clusters(tmp_path, assignment, {})
    shortlist = build_shortlist(text, tmp_path, 3)
    shortlist.bind(torch.randn(vocab, hidden), torch.randn(vocab, hidden), vocab, False)
    shortlist.begin(torch.tensor([12, 13]))
    shortlist.prepare(0, torch.tensor([12]), torch.randn(1, hidden))
    ids, _ = shortlist.logits(torch.randn(1, hidden))
    expected = set(range(10)) | ({12, 13} if text == "dyna-hybrid:0" else set())
    assert set(ids.tolist()) == expected
    save_clusters(tmp_path, torch.arange(vocab) % 4, {})
    if text == "dyna:0":
        with pytest.raises(ValueError, match="no core"):
            build_shortlist(text, tmp_path, 3)
    for bad in ("dyna-pa:0", "fr:0", "dyna-hybrid-pa:0"):
        with pytest.raises(ValueError, match="positive size"):
            ShortlistChoice.parse(bad)


def test_roff_pages_become_plain_text():
    from quickdraft.train.roff import page_text

    page = "\n".join([
        '.\\" a comment', ".TH DEMO 1", ".de XX", "never text", "..", ".SH NAME",
        "demo \\- show \\fBthings\\fR", ".SH DESCRIPTION", "First line", "continues here.",
        ".PP", ".B bold words", "and \\(lqquoted\\(rq text", ".TS", "tab (@);", "l l.",
        "a@b", ".TE", ".IP \\-x 4", "An option.",
    ])  # fmt: skip
    assert page_text(page) == (
        "NAME\n\ndemo - show things\n\nDESCRIPTION\n\nFirst line continues here.\n\n"
        "bold words and “quoted” text\n\na@b\n\n-x An option.\n"
    )
    unknown: set[str] = set()
    page_text(".SH X\nan \\(zz odd character", unknown)
    assert unknown == {"zz"}


def test_corpus_is_deterministic_and_leaves_out_what_the_tasks_quote(tmp_path):
    import gzip

    from quickdraft.cli import main
    from quickdraft.train import sources

    tasks = tmp_path / "tasks"
    tasks.mkdir()
    quoted = {"source": "cpython==3.11.7 Lib/quoted.py, docstring; /usr/share/man/man1/seen.1.gz"}
    (tasks / "code.jsonl").write_text(json.dumps(quoted) + "\n")
    lib = tmp_path / "lib"
    (lib / "site-packages").mkdir(parents=True)
    (lib / "site-packages" / "other.py").write_text("not the standard library\n")
    for name in ("quoted", "kept", "also"):
        (lib / f"{name}.py").write_text(f"def {name}():\n    return 1\n")
    man = tmp_path / "man"
    (man / "man1").mkdir(parents=True)
    pages = ["seen.1", "tool.1", "pointer.1", *(f"sdk_{i}.1" for i in range(60))]
    for page in pages:
        text = ".so man1/tool.1\n" if page == "pointer.1" else f".SH NAME\n{page} \\- does it\n"
        with gzip.open(man / "man1" / f"{page}.gz", "wt") as handle:
            handle.write(text)
    roots = {"code": lib, "manual": man}
    first = sources.build_corpus(tmp_path / "a", task_dir=tasks, roots=roots)
    second = sources.build_corpus(tmp_path / "b", task_dir=tasks, roots=roots)
    assert first["sha256"] == second["sha256"]
    assert (tmp_path / "a" / "corpus.jsonl").read_bytes() == (
        tmp_path / "b" / "corpus.jsonl"
    ).read_bytes()
    records = [json.loads(line) for line in (tmp_path / "a" / "corpus.jsonl").open()]
    taken = {Path(r["source"]).name for r in records}
    assert {"kept.py", "also.py", "tool.1.gz"} <= taken
    assert not taken & {"quoted.py", "other.py", "seen.1.gz", "pointer.1.gz"}
    # One family (an SDK's thousands of pages) is capped.
    assert sum(name.startswith("sdk_") for name in taken) == sources.MAN_PER_FAMILY
    assert (first["sources"]["code"]["files"], first["sources"]["code"]["of"]) == (2, 2)
    capped = sources.build_corpus(tmp_path / "c", ("code",), 10, task_dir=tasks, roots=roots)
    assert capped["sources"]["code"]["files"] == 1  # whole files until the cap
    with pytest.raises(ValueError, match="sources: unknown"):
        sources.build_corpus(tmp_path / "d", ("poetry",), task_dir=tasks)
    with pytest.raises(SystemExit) as parsed:  # argparse's one line, exit 2
        main(["data", "corpus", "--out", str(tmp_path / "e"), "--sources", "poetry"])
    assert parsed.value.code == 2


def test_data_regenerate_writes_the_targets_replies_and_resumes(tmp_path, smollm2):
    """Chats whose replies are the target's own greedy output, kinds in turn; a second run
    skips what is answered, and a line cut off mid-write is answered again."""

    from quickdraft.cli import main
    from quickdraft.models.loading import load_model

    folder, _ = tiny_folder_and_corpus(tmp_path, smollm2, "llama-tied")
    prompts = tmp_path / "prompts.jsonl"
    records = [
        {"kind": "code", "messages": [{"role": "user", "content": f"def f{i}():"},
                                      {"role": "assistant", "content": "reference"}]}
        for i in range(3)
    ] + [{"kind": "chat", "prompt": f"hello {i}"} for i in range(3)]  # fmt: skip
    prompts.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "replies.jsonl"
    argv = ["data", "regenerate", "--target", str(folder), "--prompts", str(prompts), "--out",
            str(out), "--max-new-tokens", "5", "--batch-size", "2"]  # fmt: skip
    assert main([*argv, "--limit", "3"]) == 0
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["kind"] for r in written] == ["chat/generated", "code/generated", "chat/generated"]
    model, tokenizer = load_model(folder)
    for record in written:
        prompt = record["messages"][:-1]
        assert record["messages"][-1]["role"] == "assistant" and prompt[-1]["role"] == "user"
        ids = generate(
            model,
            tokenizer.apply_chat(prompt),
            sampling=SamplingParams(
                temperature=0, max_new_tokens=5, stop_token_ids=tokenizer.eos_token_ids
            ),
        ).token_ids
        assert record["messages"][-1]["content"] == tokenizer.decode(ids)  # fmt: skip
    with out.open("a") as handle:
        handle.write('{"index": 3, "kind": "cut')  # an interrupted write
    assert main(argv) == 0
    again = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["index"] for r in again) == list(range(6)) and again[:3] == written
    assert main([*argv[:5], str(tmp_path / "none.jsonl"), *argv[6:]]) == 2


def test_code_prompts_are_standard_library_functions_the_tasks_do_not_quote(tmp_path):
    """HumanEval-form prompts from a standard library (here a tiny one): public functions
    with a docstring only, none from a file the task sets quote, the same for the same seed."""
    from quickdraft.cli import main
    from quickdraft.train.sources import code_prompts

    lib = tmp_path / "Lib"
    (lib / "test").mkdir(parents=True)
    doc = '    """' + "Return the thing this function is documented to return." + '"""\n'
    (lib / "kept.py").write_text(
        "def shown(a, b=2):\n" + doc + "    return a\n\n"
        "def _private():\n" + doc + "\nclass C:\n    def method(self):\n" + "    " + doc
        + "\ndef undocumented():\n    return 1\n"
    )  # fmt: skip
    (lib / "quoted.py").write_text("def quoted():\n" + doc)
    (lib / "test" / "test_x.py").write_text("def check():\n" + doc)
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    quote = {"source": "cpython==3.11 Lib/quoted.py"}
    (tasks / "code.jsonl").write_text(json.dumps(quote) + "\n")
    prompts = code_prompts(10, seed=1, task_dir=tasks, root=lib)
    assert sorted(p["source"] for p in prompts) == ["Lib/kept.py:1 shown", "Lib/kept.py:9 method"]
    shown = next(p for p in prompts if p["source"].endswith("shown"))
    assert shown["prompt"] == (
        "Complete the following Python function:\n\ndef shown(a, b=2):\n" + doc
    )
    assert {p["kind"] for p in prompts} == {"code"}
    assert code_prompts(10, seed=1, task_dir=tasks, root=lib) == prompts
    out = tmp_path / "prompts.jsonl"
    assert main(["data", "code-prompts", "--out", str(out), "--count", "4"]) == 0
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(written) == 4 and all(r["prompt"].startswith("Complete the") for r in written)
    assert main(["data", "code-prompts", "--out", str(tmp_path), "--count", "4"]) == 2


def test_doc_prompts_ask_about_passages_the_tasks_do_not_quote(tmp_path):
    """Summarization and passage-question prompts over a tiny standard library and man tree:
    module and function docstrings and DESCRIPTION sections, never a file the task sets quote
    (nor its man pages in other languages), half of each kind, the same for the same seed."""
    import gzip

    from quickdraft.cli import main
    from quickdraft.train.sources import document_prompts

    lib = tmp_path / "Lib"
    lib.mkdir()
    long_doc = "This module does a documented thing. " * 10
    (lib / "kept.py").write_text(
        f'"""{long_doc}"""\n\ndef shown(a):\n    """{"Return a, as documented. " * 10}"""\n'
        f'\ndef short():\n    """Too short."""\n'
    )
    (lib / "quoted.py").write_text(f'"""{long_doc}"""\n')
    man = tmp_path / "man"
    page = (
        ".TH TOOL 1\n.SH NAME\ntool \\- does things\n.SH DESCRIPTION\n"
        + "Tool reads its input and writes what it was asked to. " * 8
        + "\n.PP\n\\-v, \\-\\-verbose say more\n.SH SEE ALSO\nother(1)\n"
    )
    for name in ("tool.1.gz", "quoted.1.gz"):
        (man / "man1").mkdir(parents=True, exist_ok=True)
        with gzip.open(man / "man1" / name, "wt") as handle:
            handle.write(page)
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    quotes = [
        {"source": "cpython==3.11 Lib/quoted.py, module docstring"},
        {"source": "/usr/share/man/man1/quoted.1.gz (Debian package x 1), section DESCRIPTION"},
    ]
    (tasks / "rag.jsonl").write_text("".join(json.dumps(q) + "\n" for q in quotes))
    prompts = document_prompts(10, seed=1, task_dir=tasks, root=lib, man_root=man)
    sources = sorted(p["source"] for p in prompts)
    assert sources == [
        str(man / "man1" / "tool.1.gz") + ", section DESCRIPTION",
        "kept.py, docstring of shown",
        "kept.py, module docstring",
    ]
    assert [p["kind"] for p in prompts] == ["summarization", "summarization", "rag"]
    summary = prompts[0]["prompt"]
    assert summary.startswith("Summarise the following text in two sentences:\n\n")
    assert summary.endswith("\n\nSummary:")
    question = prompts[2]["prompt"]
    assert question.startswith("Answer the question using only the passage.\n\nPassage:\n")
    assert question.endswith("?\n\nAnswer:") and "\n\nQuestion: What " in question
    tool = next(p for p in prompts if "tool.1" in p["source"])["prompt"]
    assert "Tool reads its input" in tool and "SEE ALSO" not in tool
    assert document_prompts(10, seed=1, task_dir=tasks, root=lib, man_root=man) == prompts
    out = tmp_path / "documents.jsonl"
    assert main(["data", "doc-prompts", "--out", str(out), "--count", "4"]) == 0
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["kind"] for r in written] == ["summarization", "summarization", "rag", "rag"]
    assert main(["data", "doc-prompts", "--out", str(tmp_path), "--count", "4"]) == 2


def test_a_shortlist_context_reads_each_slot_s_text_once():
    """``ShortlistContext`` keeps per slot how much of its text the shortlist has read: joined
    requests (in any slots) bring their whole text, running ones what they gained since; a
    batch whose requests all joined since the last draft starts the context afresh."""

    class Recording:
        uses_context = True

        def __init__(self):
            self.calls = []

        def begin(self, tokens):
            self.calls.append(("begin", sorted(tokens.tolist())))

        def extend(self, tokens):
            self.calls.append(("extend", sorted(tokens.tolist())))

    shortlist = Recording()
    context = ShortlistContext(shortlist)  # type: ignore[arg-type]
    context.reserve(4, torch.device("cpu"))
    tokens = torch.tensor([[1, 2, 0], [3, 4, 5], [6, 0, 0], [7, 8, 0]])
    lengths = torch.tensor([2, 3, 1, 2])
    params = SamplingParams()

    def batch(slots: list[int]) -> Batch:
        n = len(slots)
        return Batch(
            tokens[slots], lengths[slots], Slots.of(slots), (params,) * n, (None,) * n,
            torch.Generator(),
        )  # fmt: skip

    context.begin(batch([0, 2]))
    context.catch_up(batch([0, 2]))
    tokens[0, 2], lengths[0] = 9, 3  # slot 0 gained a token; slot 1 joins
    context.begin(batch([1]))
    context.catch_up(batch([0, 1, 2]))
    context.begin(batch([3]))  # the others left: slot 3 runs alone
    context.catch_up(batch([3]))
    assert shortlist.calls == [("begin", [1, 2, 6]), ("extend", [3, 4, 5, 9]), ("begin", [7, 8])]
