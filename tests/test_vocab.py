"""Vocabulary shortlists: budgets, segmented heads, FR-Spec and DynaSpec, greedy identity on
tiny models and SmolLM2, clusters, corpus handling, feature caching and router training."""

import json
from pathlib import Path

import pytest
import torch
from conftest import tiny_folder_and_corpus, tiny_hf_model

from quickdraft import SamplingParams, generate, generate_batch
from quickdraft.drafters.base import Batch, ShortlistContext
from quickdraft.drafters.draft_model.drafter import DraftModelDrafter
from quickdraft.drafters.registry import make_spec
from quickdraft.models.base import Slots
from quickdraft.models.llama import LlamaRunner
from quickdraft.models.toy import HeadedNGramLM, NGramLM
from quickdraft.train.corpus import Sequence, balanced_sample, read_records, tokenize
from quickdraft.train.features import DrafterSource, Features, extract
from quickdraft.train.router import RouterTraining, coverage, split, train_router
from quickdraft.vocab import (
    ClusterShortlist,
    FrequencyShortlist,
    Router,
    RouterConfig,
    SegmentedHead,
    ShortlistChoice,
    build_shortlist,
    position_budget,
)
from quickdraft.vocab.clusters import spherical_kmeans
from quickdraft.vocab.shortlist import (
    load_clusters,
    load_ranked,
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


@pytest.mark.parametrize("int8", [False, True])
def test_segmented_head_matches_the_full_head_on_its_rows(pair, int8):
    _, draft = pair
    weight = draft.head_weight
    segments = list(torch.randperm(VOCAB, generator=torch.Generator().manual_seed(1)).split(30))
    head = SegmentedHead(weight, segments, int8=int8)
    hidden = torch.randn(2, weight.shape[1])
    ids, logits = head.logits(hidden, [3, 1])
    assert torch.equal(ids, torch.cat([segments[3], segments[1]]))
    expected = hidden @ weight[ids].T
    if int8:  # quantized rows (ops.draft_linear: 4-bit codes where the kernels run): close
        assert float((logits - expected).norm() / expected.norm()) < 0.12
    else:
        assert torch.allclose(logits, expected, atol=1e-4)


def test_frequency_shortlist_takes_prefixes_of_the_ranking(pair):
    _, draft = pair
    ranked = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(2))
    shortlist = FrequencyShortlist.position_aware(ranked, 48, 5)
    assert shortlist.sizes == (48, 48, 8, 6, 4)
    shortlist.bind(draft.head_weight, draft.embed, VOCAB, int8=False)
    hidden = torch.randn(1, draft.config.hidden_size)
    for position, size in enumerate(shortlist.sizes):
        shortlist.prepare(position, torch.tensor([0]), hidden)
        ids, logits = shortlist.logits(hidden)
        assert torch.equal(ids, ranked[:size]) and logits.shape == (1, size)
    assert shortlist.mean_size_by_position() == [48, 48, 8, 6, 4]
    assert shortlist.mean_size() == pytest.approx(sum(shortlist.sizes) / 5)


def test_frequency_shortlist_drops_rows_past_the_target_vocabulary(pair):
    _, draft = pair
    shortlist = FrequencyShortlist(torch.arange(VOCAB - 1, -1, -1), [10])
    shortlist.bind(draft.head_weight, draft.embed, 95, int8=False)  # the target has 95
    shortlist.prepare(0, torch.tensor([0]), torch.zeros(1, draft.config.hidden_size))
    ids, _ = shortlist.logits(torch.zeros(1, draft.config.hidden_size))
    assert ids.tolist() == list(range(94, 84, -1))


def test_cluster_shortlist_is_the_union_of_each_rows_top_clusters(pair):
    _, draft = pair
    assignment = torch.arange(VOCAB) % 6
    router = random_router(draft.config.hidden_size, 6)
    shortlist = ClusterShortlist(assignment, router, 2, position_aware=False)
    shortlist.bind(draft.head_weight, draft.embed, VOCAB, int8=False)
    tokens, prev = torch.tensor([4, 9]), torch.randn(2, draft.config.hidden_size)
    scores = router(draft.embed[tokens], prev)
    expected = set(scores.topk(2, dim=-1).indices.flatten().tolist())
    shortlist.prepare(0, tokens, prev)
    ids, logits = shortlist.logits(torch.randn(2, draft.config.hidden_size))
    assert set(assignment[ids].tolist()) == expected
    assert sorted(ids.tolist()) == sorted(i for i in range(VOCAB) if i % 6 in expected)
    assert logits.shape == (2, ids.numel())


def test_cluster_shortlist_errors(pair):
    _, draft = pair
    router = random_router(draft.config.hidden_size, 4)
    with pytest.raises(ValueError, match="k_max"):
        ClusterShortlist(torch.arange(VOCAB) % 4, router, 5)
    with pytest.raises(ValueError, match="assignment"):
        ClusterShortlist(torch.arange(VOCAB) % 6, router, 2)
    shortlist = ClusterShortlist(torch.arange(VOCAB) % 4, router, 2)
    with pytest.raises(RuntimeError, match="bind"):
        shortlist.logits(torch.zeros(1, draft.config.hidden_size))
    shortlist.bind(draft.head_weight, draft.embed, VOCAB, int8=False)
    with pytest.raises(RuntimeError, match="prepare"):
        shortlist.logits(torch.zeros(1, draft.config.hidden_size))


def test_empty_clusters_are_never_chosen(pair):
    _, draft = pair
    assignment = torch.arange(VOCAB) % 4
    assignment[assignment == 2] = 0  # cluster 2 is empty
    shortlist = ClusterShortlist(assignment, random_router(draft.config.hidden_size, 4), 3)
    shortlist.bind(draft.head_weight, draft.embed, VOCAB, int8=False)
    shortlist.prepare(0, torch.tensor([1]), torch.randn(1, draft.config.hidden_size))
    ids, _ = shortlist.logits(torch.randn(1, draft.config.hidden_size))
    assert ids.numel() == VOCAB  # the three non-empty clusters: everything


def test_shortlist_needs_the_native_runner():
    draft = NGramLM.random(8, 3, seed=0)
    with pytest.raises(ValueError, match="shortlist"):
        DraftModelDrafter(draft, 2, shortlist=FrequencyShortlist(torch.arange(8), [4]))


@pytest.mark.parametrize("name", ["fr", "fr-pa", "dyna", "dyna-pa", "dyna-pa-parallel"])
@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_identity_with_every_shortlist(pair, name, k):
    target, draft = pair
    for prompt in ([5, 17, 3, 99, 42, 5, 17], [7]):
        expected = generate(target, prompt, sampling=greedy(30)).token_ids
        drafter = DraftModelDrafter(draft, k, shortlist=shortlists(draft, k)[name])
        out = generate(target, prompt, sampling=greedy(30), draft=drafter)
        assert out.token_ids == expected, (name, k, prompt)
        assert drafter.shortlist.mean_size() < VOCAB


def test_batched_rows_with_a_dynamic_shortlist_match_single_runs(pair):
    target, draft = pair
    prompts = torch.randint(0, VOCAB, (3, 6), generator=torch.Generator().manual_seed(5))
    drafter = DraftModelDrafter(draft, 3, shortlist=shortlists(draft, 3)["dyna-pa"])
    batch = generate_batch(target, prompts, sampling=greedy(24), draft=drafter)
    for row, ids in zip(prompts.tolist(), batch.token_ids, strict=True):
        assert ids == generate(target, row, sampling=greedy(24)).token_ids


def test_shortlisted_draft_probabilities_are_renormalised_and_zero_outside(pair):
    target, draft = pair
    shortlist = shortlists(draft, 2)["dyna"]
    drafter = DraftModelDrafter(draft, 2, shortlist=shortlist)
    seen = []

    class Spy(DraftModelDrafter):
        def propose(self, state):
            out = super().propose(state)
            seen.append(out)
            return out

    spy = Spy(draft, 2, shortlist=shortlist)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=12, seed=3)
    generate(target, [5, 17, 3], sampling=sampling, draft=spy)
    for out in seen:
        probs = out.probs[0]  # [k, V]
        assert torch.allclose(probs.sum(-1), torch.ones(2), atol=1e-5)
        assert ((probs > 0).sum(-1) < VOCAB).all()
    assert drafter.vocab_size == VOCAB


def test_smollm2_greedy_identity_with_dynamic_shortlist(smollm2):
    model, tokenizer = smollm2
    prompt = tokenizer.apply_chat("Write a Python function that reverses a list.")
    expected = generate(model, prompt, sampling=greedy(24)).token_ids
    assignment = spherical_kmeans(model.head_weight, 32, iterations=5, seed=0)
    router = random_router(model.config.hidden_size, 32)
    for shortlist in (
        ClusterShortlist(assignment, router, 8),
        FrequencyShortlist(torch.randperm(model.vocab_size), [8192]),
    ):
        drafter = DraftModelDrafter(model.truncated(8), 4, shortlist=shortlist)
        out = generate(model, prompt, sampling=greedy(24), draft=drafter)
        assert out.token_ids == expected, shortlist.name


# -- artifacts, clusters, corpus, features, router ---------------------------------------


def test_spherical_kmeans_recovers_planted_directions():
    generator = torch.Generator().manual_seed(0)
    directions = torch.nn.functional.normalize(torch.randn(5, 32, generator=generator), dim=1)
    truth = torch.arange(500) % 5
    rows = (directions[truth] + 0.05 * torch.randn(500, 32, generator=generator)) * (
        1 + 3 * torch.rand(500, 1, generator=generator)  # norms must not matter
    )
    found = spherical_kmeans(rows, 5, seed=1)
    # The same partition up to a renaming of the clusters.
    pairs = set(zip(truth.tolist(), found.tolist(), strict=True))
    assert len(pairs) == 5 and len({b for _, b in pairs}) == 5
    with pytest.raises(ValueError, match="num_clusters"):
        spherical_kmeans(rows, 0)


def test_artifacts_round_trip(tmp_path, pair):
    _, draft = pair
    frequency = torch.rand(VOCAB)
    save_frequency(tmp_path, frequency, {"data": ["x"]})
    assert torch.equal(load_ranked(tmp_path), torch.sort(-frequency, stable=True).indices)
    assignment = torch.arange(VOCAB) % 4
    save_clusters(tmp_path, assignment, {"clusters": 4})
    assert torch.equal(load_clusters(tmp_path), assignment)
    router = random_router(draft.config.hidden_size, 4)
    router.save(tmp_path)
    loaded = Router.load(tmp_path)
    x, h = torch.randn(3, draft.config.hidden_size), torch.randn(3, draft.config.hidden_size)
    assert torch.allclose(loaded(x, h), router(x, h), atol=2e-2)  # stored in fp16
    built = build_shortlist("dyna-pa:2", tmp_path, 4)
    assert isinstance(built, ClusterShortlist) and built.position_aware
    assert build_shortlist("full", tmp_path, 4) is None
    assert build_shortlist("fr-pa:40", tmp_path, 4).sizes == (40, 40, 6, 5)
    with pytest.raises(ValueError, match="router"):
        Router.load(tmp_path / "missing")


def test_corpus_reading_and_balanced_sampling(tmp_path, smollm2):
    _, tokenizer = smollm2
    records = [
        {"kind": "chat", "messages": [{"role": "user", "content": "Hi"},
                                      {"role": "assistant", "content": "Hello there, friend."}]},
        {"kind": "text", "text": "plain words " * 50},
    ]  # fmt: skip
    (tmp_path / "c.jsonl").write_text("\n".join(json.dumps(r) for r in records))
    (tmp_path / "notes.txt").write_text("some text")
    read = read_records([tmp_path])
    assert len(read) == 3
    chat = tokenize(read[0], tokenizer, 512)
    prefix = tokenizer.apply_chat([records[0]["messages"][0]])
    assert chat.start == len(prefix) and chat.tokens[: chat.start] == prefix
    assert tokenizer.decode(chat.tokens[chat.start :]).strip().startswith("Hello there")
    sequences = [Sequence(list(range(i, i + 20)), 1, kind) for i, kind in enumerate("aab" * 5)]
    chosen = balanced_sample(sequences, 60)
    by_kind = {k: sum(19 for s in chosen if s.kind == k) for k in "ab"}
    assert by_kind["a"] >= 30 and by_kind["b"] >= 30
    # A repeated sequence is taken once, whatever the budget.
    repeated = [Sequence(list(range(20)), 1, "a") for _ in range(4)] + sequences[1:3]
    chosen = balanced_sample(repeated, 10_000)
    assert len(chosen) == 3 and sum(s.tokens == list(range(20)) for s in chosen) == 1
    with pytest.raises(ValueError, match="data"):
        read_records([tmp_path / "missing.jsonl"])
    # A chat with no reply scores nothing (its prompt's generation prefix outruns its tokens):
    # left out of a sample, and a sample of only such chats is refused by name.
    asking = tokenize({"messages": [{"role": "user", "content": "hello"}]}, tokenizer, 512)
    assert asking.start == len(asking.tokens)
    assert balanced_sample([asking, *sequences[:2]], 10_000) == sequences[:2]
    with pytest.raises(ValueError, match="data: no record has text to learn from"):
        balanced_sample([asking], 10_000)
    # Medusa's and the router's features and checkpoints are keyed by what the sample holds.
    from quickdraft.train.common import sample_digest

    edited = [Sequence([*sequences[0].tokens[:-1], 99], 1, "a"), *sequences[1:]]
    assert sample_digest(sequences) == sample_digest(list(sequences)) != sample_digest(edited)
    (tmp_path / "bad.jsonl").write_text('{"other": 1}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:1"):
        read_records([tmp_path / "bad.jsonl"])
    # A chat dataset saved as one JSON array would be trained on as its JSON text: refused.
    (tmp_path / "chats.json").write_text(json.dumps(records))
    with pytest.raises(ValueError, match=r"chats\.json is a JSON array of records"):
        read_records([tmp_path / "chats.json"])
    (tmp_path / "settings.json").write_text('{"a": [1, 2]}')  # other JSON is text, as before
    assert read_records([tmp_path / "settings.json"])[0]["kind"] == ".json"


def test_features_are_cached_and_resumable(tmp_path, pair):
    target, draft = pair
    sequences = [Sequence([1 + i, 5, 9, 13, 2 + i, 7, 30], 2, "x") for i in range(20)]
    settings = {"draft": "tiny"}
    first = extract(sequences, DrafterSource(draft, target), tmp_path, settings)
    assert len(first) == 20 * 5
    shards = sorted(tmp_path.glob("shard-*.safetensors"))
    shards[-1].unlink()  # an interrupted run: the last shard is missing
    again = extract(sequences, DrafterSource(draft, target), tmp_path, settings)
    assert torch.equal(again.prev_hidden, first.prev_hidden)
    assert torch.equal(again.target_next, first.target_next)
    # Labels: the target's argmax after each scored token; inputs: the hidden state before.
    tokens = torch.tensor([sequences[0].tokens])
    logits = target.forward(tokens, torch.arange(7)[None], target.new_cache(1, 7)).logits
    assert first.target_next[:5].tolist() == logits[0, 2:].argmax(-1).tolist()
    assert first.tokens[:5].tolist() == sequences[0].tokens[2:]
    with pytest.raises(ValueError, match="other settings"):
        extract(sequences, DrafterSource(draft, target), tmp_path, {"draft": "other"})


def synthetic_features(n: int, hidden: int, vocab: int, seed: int = 0) -> Features:
    """Next tokens whose cluster (token % 8) a router can learn from the previous hidden
    state; the token within the cluster is random."""
    generator = torch.Generator().manual_seed(seed)
    prev = torch.randn(n, hidden, generator=generator)
    cluster = (prev @ torch.randn(hidden, 8, generator=generator)).argmax(-1)
    target = cluster + 8 * torch.randint(0, vocab // 8, (n,), generator=generator)
    return Features(
        torch.randint(0, vocab, (n,), generator=generator),
        prev.half(),
        target,
        target,
        torch.arange(n) // 10,
    )


def test_a_packed_router_computes_what_the_module_does():
    torch.manual_seed(0)
    router = Router(RouterConfig(hidden_size=24, num_clusters=6, width=32)).eval()
    for parameter in router.parameters():  # not the identity LayerNorm of a fresh module
        torch.nn.init.normal_(parameter)
    packed = router.packed()
    for rows in (1, 4, 17):
        embedding, prev = torch.randn(rows, 24), torch.randn(rows, 24)
        with torch.inference_mode():
            expected, got = router(embedding, prev), packed(embedding, prev)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-4)
        assert torch.equal(got.argsort(-1), expected.argsort(-1))


def test_router_learns_and_resumes(tmp_path):
    hidden, vocab, clusters = 16, 40, 8
    features = synthetic_features(3000, hidden, vocab)
    embed = torch.randn(vocab, hidden)
    assignment = torch.arange(vocab) % clusters
    settings = RouterTraining(epochs=4, batch_size=128, lr=5e-3, width=64)
    parts = split(features, settings.validation_fraction, settings.seed)
    router, log = train_router(*parts, assignment, embed, settings, tmp_path / "a.pt")
    losses = [row["held_loss"] for row in log["history"]]
    assert losses[-1] < 0.6 * torch.log(torch.tensor(float(clusters))).item()
    held = parts[1]
    from quickdraft.train.router import scores_of

    rows = coverage(scores_of(router, held, embed), held, assignment, [1, 4, 8])
    assert rows[0]["target_recall"] > 0.5 and rows[-1]["target_recall"] == 1.0
    assert rows[-1]["vocab_share"] == pytest.approx(1.0)
    # Interrupt after two epochs, then resume: the same router as an uninterrupted run.
    short = RouterTraining(epochs=4, batch_size=128, lr=5e-3, width=64)
    checkpoint = tmp_path / "b.pt"
    saved = {}

    def stop_after_two(stage, done, total):
        if done == 2 * (total // 4) and checkpoint.exists():
            saved["state"] = torch.load(checkpoint, weights_only=False)

    train_router(*parts, assignment, embed, short, checkpoint, stop_after_two)
    state = torch.load(checkpoint, weights_only=False)
    assert state["epoch"] == 3
    state_two = saved.get("state")
    assert state_two is not None and state_two["epoch"] == 0
    torch.save({**state_two}, checkpoint)  # back to the end of epoch 1
    resumed, _ = train_router(*parts, assignment, embed, short, checkpoint)
    for (name, a), (_, b) in zip(
        router.state_dict().items(), resumed.state_dict().items(), strict=True
    ):
        assert torch.allclose(a, b, atol=1e-5), name


def test_headed_toy_reproduces_the_table():
    model = NGramLM.random(8, 3, seed=0)
    headed = HeadedNGramLM.from_ngram(model)
    tokens = torch.tensor([[3, 1, 4, 1, 5]])
    positions = torch.arange(5)[None]
    a = model.forward(tokens, positions, model.new_cache(1, 8)).logits
    b = headed.forward(tokens, positions, headed.new_cache(1, 8)).logits
    assert torch.equal(a, b)


def test_core_and_prompt_tokens_join_the_clusters_without_duplicates(pair):
    target, draft = pair
    assignment = torch.arange(VOCAB) % 5
    assignment[:10] = -1  # the core
    router = random_router(draft.config.hidden_size, 5)
    shortlist = ClusterShortlist(assignment, router, 1, position_aware=False, context=True)
    shortlist.bind(draft.head_weight, draft.embed, VOCAB, int8=False)
    prompt = torch.tensor([[3, 57, 58, 59, 60, 61, 57]])
    shortlist.begin(prompt)
    tokens, prev = torch.tensor([61]), torch.randn(1, draft.config.hidden_size)
    chosen = router(draft.embed[tokens], prev).argmax(-1).item()
    shortlist.prepare(0, tokens, prev)
    hidden = torch.randn(1, draft.config.hidden_size)
    ids, logits = shortlist.logits(hidden)
    expected = set(range(10)) | {i for i in range(VOCAB) if i % 5 == chosen} | set(range(57, 62))
    assert sorted(ids.tolist()) == sorted(expected)  # each token once
    assert torch.allclose(logits, hidden @ draft.head_weight[ids].T, atol=1e-4)
    shortlist.extend(torch.tensor([[70, 71, 57, 3]]))  # output so far joins the context
    shortlist.prepare(1, tokens, prev)
    ids, _ = shortlist.logits(hidden)
    assert sorted(ids.tolist()) == sorted(expected | {70, 71})
    for prompt in ([5, 17, 3, 99, 42, 5, 17], [7]):
        want = generate(target, prompt, sampling=greedy(24)).token_ids
        drafter = DraftModelDrafter(draft, 3, shortlist=shortlist)
        assert generate(target, prompt, sampling=greedy(24), draft=drafter).token_ids == want


def test_train_router_command_then_generate_with_its_artifacts(tmp_path, smollm2, capsys):
    from quickdraft.cli import main

    folder, corpus = tiny_folder_and_corpus(tmp_path, smollm2, "qwen2-bias")
    out = tmp_path / "artifacts"
    args = ["train", "router", "--draft", str(folder), "--target", str(folder), "--data",
            str(corpus), "--out", str(out), "--clusters", "4", "--core", "256",
            "--budget-tokens", "400", "--epochs", "2",
            "--cache", str(tmp_path / "cache")]  # fmt: skip
    assert main(args) == 0
    assert "top  1 clusters" in capsys.readouterr().out
    names = {p.name for p in out.iterdir()}
    assert names == {
        "frequency.safetensors", "clusters.safetensors", "router.json", "router.safetensors",
        "metrics.json",
    }  # fmt: skip
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["core_size"] == 256 and len(metrics["cluster_sizes"]) == 4
    assert metrics["router_coverage"][-1]["target_recall"] == pytest.approx(1.0)
    runs = {}
    for shortlist in ("full", "dyna-pa:2", "fr:300"):
        argv = ["generate", "Hello there", "--target", str(folder), "--draft", str(folder),
                "--method", "draft_model", "--no-draft-int8", "--shortlist", shortlist,
                "--shortlist-dir", str(out), "--max-new-tokens", "12", "--json"]  # fmt: skip
        assert main(argv) == 0
        runs[shortlist] = json.loads(capsys.readouterr().out)["token_ids"]
    assert runs["full"] == runs["dyna-pa:2"] == runs["fr:300"]
    assert main(["generate", "Hi", "--target", str(folder), "--draft", str(folder),
                 "--method", "draft_model", "--shortlist", "dyna-pa:2"]) == 2  # fmt: skip
    assert "shortlist_dir" in capsys.readouterr().err


def test_train_frequency_counts_every_token_of_a_corpus(tmp_path, smollm2, capsys):
    import json

    from conftest import tiny_folder_and_corpus

    from quickdraft.cli import main
    from quickdraft.vocab.shortlist import load_ranked

    folder, corpus = tiny_folder_and_corpus(tmp_path, smollm2, "llama-tied")
    source = tmp_path / "code.py"
    source.write_text("def answer():\n    return 42\n" * 50)
    out = tmp_path / "freq"
    assert main(["train", "frequency", "--model", str(folder), "--data", str(corpus),
                 str(source), "--out", str(out)]) == 0  # fmt: skip
    summary = json.loads((out / "frequency.json").read_text())
    ranked = load_ranked(out)
    occurring = summary["ids_occurring"]
    assert 0 < occurring < 49152 and summary["records"] == 25
    # The list ranks the tokens that occur first, the code's own among them.
    assert set(smollm2[1].encode("def answer")) <= set(ranked[:occurring].tolist())

    # A router's artifacts can take that list as it is instead of counting their own text.
    routed = tmp_path / "routed"
    args = ["train", "router", "--draft", str(folder), "--data", str(corpus), "--frequency",
            str(out), "--out", str(routed), "--clusters", "4", "--core", "0",
            "--budget-tokens", "400", "--epochs", "1",
            "--cache", str(tmp_path / "cache")]  # fmt: skip
    assert main(args) == 0
    assert torch.equal(load_ranked(routed), ranked)
    assert main([*args, "--frequency-data", str(source)]) == 2  # one or the other
    # A list counted with another, larger tokenizer (ids past this head) is refused by name.
    from quickdraft.vocab.shortlist import load_frequency, save_frequency

    wider = torch.cat([load_frequency(out), torch.ones(100)])
    save_frequency(tmp_path / "wider", wider, {"model": "another"})
    widened = [*args[:7], str(tmp_path / "wider"), *args[8:]]
    assert main(widened) == 2
    assert "counted with another tokenizer" in capsys.readouterr().err


def test_route_false_is_the_context_or_core_alone_and_router_inputs_are_checked(tmp_path):
    """Ablations: without routed clusters the shortlist is the sequence's tokens (no core).
    A router records what states it learnt from, and a drafter that hands it others is
    refused by name (their widths match, so nothing else would notice)."""
    from quickdraft.vocab import shortlist_for

    vocab, hidden = 40, 8
    router = Router(RouterConfig(hidden, 4, width=8)).eval()
    assignment = torch.arange(vocab) % 4
    context_only = ClusterShortlist(assignment, router, 2, context=True, route=False)
    context_only.bind(torch.randn(vocab, hidden), torch.randn(vocab, hidden), vocab, False)
    context_only.begin(torch.tensor([3, 7, 7, 11]))
    context_only.prepare(0, torch.tensor([7]), torch.randn(1, hidden))
    ids, logits = context_only.logits(torch.randn(1, hidden))
    assert sorted(ids.tolist()) == [3, 7, 11] and logits.shape == (1, 3)
    with pytest.raises(ValueError, match="route"):
        ClusterShortlist(assignment, router, 2, route=False)

    router.save(tmp_path, inputs="hidden")
    save_clusters(tmp_path, assignment, {})
    save_frequency(tmp_path, torch.rand(vocab), {})
    choice = ShortlistChoice.parse("dyna:2")
    with pytest.raises(ValueError, match=r"learnt from hidden states.*--eagle-dir"):
        shortlist_for(choice, tmp_path, None, 3, inputs="eagle")
    assert shortlist_for(choice, tmp_path, None, 3, inputs="hidden") is not None
    assert Router.load(tmp_path).inputs == "hidden"


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
    # An interrupted rebuild leaves the corpus there was, and no partial file.
    before = (tmp_path / "a" / "corpus.jsonl").read_bytes()

    def interrupt(kind: str, taken: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        sources.build_corpus(tmp_path / "a", task_dir=tasks, roots=roots, progress=interrupt)
    assert (tmp_path / "a" / "corpus.jsonl").read_bytes() == before
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["corpus.json", "corpus.jsonl"]


def test_regenerate_reads_no_file_it_cannot_name_and_never_truncates_another_kind(tmp_path, capsys):
    from quickdraft.cli import main
    from quickdraft.train.replies import answered, read_prompts

    reply = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    line = json.dumps(reply) + "\n"
    replies = tmp_path / "replies.jsonl"
    replies.write_text(line + "\n" + line.replace('"q"', '"r"') + '{"messages": [')
    assert len(answered(replies)) == 2  # a blank line kept, the torn tail dropped
    assert replies.read_text() == line + "\n" + line.replace('"q"', '"r"')
    prompts = tmp_path / "prompts.jsonl"  # chats that end asking: not replies
    prompts.write_text(json.dumps({"messages": [{"role": "user", "content": "q"}]}) + "\n" * 2)
    text = prompts.read_text()
    with pytest.raises(ValueError, match=r"out: .*prompts.jsonl:1 is not a reply"):
        answered(prompts)
    assert prompts.read_text() == text
    for bad in ("hi", 5, [1]):
        prompts.write_text(json.dumps({"messages": bad}) + "\n")
        with pytest.raises(ValueError, match=r"prompts: .*prompts.jsonl:1: 'messages' must be|"
                           r"prompts: .*prompts.jsonl:1: messages\[0\] must be"):  # fmt: skip
            read_prompts(prompts)
    for name in ("latin1.jsonl", "latin1.txt"):
        (tmp_path / name).write_bytes(b"\xff\xfe caf\xe9\n")
        with pytest.raises(ValueError, match=f"prompts: .*{name} is not UTF-8 text"):
            read_prompts(tmp_path / name)
    argv = ["data", "regenerate", "--target", "smollm2-135m", "--prompts", str(prompts),
            "--out", str(prompts)]  # fmt: skip
    assert main(argv) != 0  # refused before any model loads
    assert "out: " in capsys.readouterr().err and prompts.read_text() == '{"messages": [1]}\n'
    # A whole last line that is no reply is another kind of file, not a torn write: refused,
    # the file unchanged (it was emptied), and named by the option that gave it.
    asking = json.dumps({"messages": [{"role": "user", "content": "q"}]}) + "\n"
    prompts.write_text(asking)
    for option in ("out", "answered"):
        with pytest.raises(ValueError, match=f"{option}: .*prompts.jsonl:1 is not a reply"):
            answered(prompts, option=option)
    assert prompts.read_text() == asking
    # Records split at newlines only: U+2028 and U+0085 are valid inside a JSON string.
    odd = {"prompt": "one\u2028line\x85still", "kind": "text"}
    prompts.write_text(json.dumps(odd, ensure_ascii=False) + "\n")
    assert read_prompts(prompts)[0]["messages"][0]["content"] == odd["prompt"]
    (tmp_path / "lines.txt").write_text("first\u2028half\nsecond\n")
    assert len(read_prompts(tmp_path / "lines.txt")) == 2
    (tmp_path / "upper.JSONL").write_text(json.dumps({"prompt": "x"}) + "\n")
    assert read_prompts(tmp_path / "upper.JSONL")[0]["messages"][0]["content"] == "x"
    for bad in (None, ["a", "b"], 3):
        prompts.write_text(json.dumps({"prompt": bad}) + "\n")
        with pytest.raises(ValueError, match=r"prompts: .*:1: 'prompt' must be a string"):
            read_prompts(prompts)


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
    # The prompt file rebuilt elsewhere: one prompt more, every position shifted. Only the new
    # prompt is answered; none twice.
    prompts.write_text(
        "".join(json.dumps(r) + "\n" for r in [{"kind": "chat", "prompt": "new"}, *records])
    )
    assert main(argv) == 0
    turns = [json.dumps(json.loads(line)["messages"][:-1]) for line in out.read_text().splitlines()]
    assert len(turns) == 7 == len(set(turns)) and '"new"' in turns[-1]
    # A prompt repeated in the file (the corpora repeat some turns) is asked once when greedy.
    twice = {"kind": "chat", "prompt": "twice"}
    prompts.write_text("".join(json.dumps(r) + "\n" for r in [twice, *records, twice]))
    assert main(argv) == 0
    turns = [json.dumps(json.loads(line)["messages"][:-1]) for line in out.read_text().splitlines()]
    assert len(turns) == 8 == len(set(turns)) and '"twice"' in turns[-1]
    assert main([*argv[:5], str(tmp_path / "none.jsonl"), *argv[6:]]) == 2


def test_regenerate_leaves_out_prompts_longer_than_the_context(tmp_path, smollm2):
    """A prompt with no room for a reply is counted and left out; one with room for part of
    a reply gets that part; the others are answered as usual."""
    from quickdraft.models.loading import load_model
    from quickdraft.train.replies import regenerate

    folder, _ = tiny_folder_and_corpus(tmp_path, smollm2, "llama-tied")
    model, tokenizer = load_model(folder)  # 512 positions
    texts = {"long": "word " * 600, "edge": "word " * 480, "short": "hello"}
    prompts = [
        {"index": i, "line": i + 1, "kind": kind, "messages": [{"role": "user", "content": t}]}
        for i, (kind, t) in enumerate(texts.items())
    ]
    out = tmp_path / "replies.jsonl"
    sampling = SamplingParams(temperature=0, max_new_tokens=64, ignore_eos=True)
    counts = regenerate(model, tokenizer, prompts, out, sampling, name="tiny", batch_size=2)
    assert counts["too_long"] == 1 and counts["answered"] == 2
    written = {json.loads(line)["kind"]: json.loads(line) for line in out.read_text().splitlines()}
    assert set(written) == {"edge/generated", "short/generated"}
    edge = len(tokenizer.apply_chat(prompts[1]["messages"]))
    assert edge + 64 > 512 and counts["tokens"] == 64 + (512 - edge)  # the edge: up to the end


def test_a_resumed_sampled_regenerate_asks_the_copies_still_unanswered(tmp_path, smollm2):
    """Sampled replies to a repeated prompt differ, so every copy is asked; a run resumed
    after one copy's reply asks the other two (it skipped all three)."""
    from quickdraft.models.loading import load_model
    from quickdraft.train.replies import regenerate

    folder, _ = tiny_folder_and_corpus(tmp_path, smollm2, "llama-tied")
    model, tokenizer = load_model(folder)
    turns = [{"role": "user", "content": "x"}]
    prompts = [{"index": i, "line": i + 1, "kind": "text", "messages": turns} for i in range(3)]
    out = tmp_path / "replies.jsonl"
    first = {"messages": [*turns, {"role": "assistant", "content": "a reply"}]}
    out.write_text(json.dumps(first) + "\n")
    sampling = SamplingParams(temperature=0.8, max_new_tokens=4, seed=1)
    counts = regenerate(model, tokenizer, prompts, out, sampling, name="tiny", batch_size=2)
    assert counts["skipped"] == 1 and counts["answered"] == 2
    assert len(out.read_text().splitlines()) == 3


def test_regenerate_stores_the_eagle_features_extraction_would(tmp_path, smollm2):
    """With --eagle-features the replies' EAGLE-3 features land in the store `train eagle`
    reads, under the keys of the sequences their records make: training then extracts
    nothing, and what it reads is what a prefill would give (tokens up to the reply's last,
    features within an fp16 step of a prefill's)."""
    from quickdraft.cli import main
    from quickdraft.drafters.eagle.net import EagleConfig
    from quickdraft.models.loading import load_model
    from quickdraft.train.eagle_features import extract, store_folder

    folder, _ = tiny_folder_and_corpus(tmp_path, smollm2, "llama-tied")
    prompts = tmp_path / "prompts.jsonl"
    texts = ["def f():", "hello there, how are you today?", "sum 1 and 2", "x" * 40, "why"]
    prompts.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts))
    out, cache = tmp_path / "replies.jsonl", tmp_path / "cache"
    argv = ["data", "regenerate", "--target", str(folder), "--prompts", str(prompts), "--out",
            str(out), "--max-new-tokens", "7", "--batch-size", "2", "--eagle-features",
            "--context", "4", "--cache", str(cache)]  # fmt: skip
    assert main(argv) == 0
    model, tokenizer = load_model(folder)
    layers = EagleConfig.for_target(model.config, "eagle3", 1).feature_layers
    store = store_folder(cache, str(folder), 4, layers, None)
    shards = sorted(store.glob("shard-*.pt"))
    assert len(shards) == 1
    records = [json.loads(line) for line in out.read_text().splitlines()]
    sequences = [tokenize(r, tokenizer, 512) for r in records]
    recorded = extract(model, sequences, layers, 4, store)
    assert sorted(store.glob("shard-*.pt")) == shards  # nothing left to extract
    # What a prefill of the ids the target was fed gives: the prompt, then the reply but its
    # last token (a random model's reply need not tokenize back to the ids it generated).
    fed = []
    for record, sequence, tokens in zip(records, sequences, recorded.tokens, strict=True):
        prompt = tokenizer.apply_chat(record["messages"][:-1])
        assert sequence.start == len(prompt) and len(tokens) > 4  # reply tokens were kept
        fed.append(Sequence(prompt[: len(prompt) - 4] + tokens.tolist(), len(prompt), "k"))
    fresh = extract(model, fed, layers, 4, tmp_path / "fresh")
    for i in range(len(fed)):
        assert recorded.start[i] == fresh.start[i] == 4
        assert torch.equal(recorded.tokens[i], fresh.tokens[i])
        for field in ("hidden", "taps"):
            torch.testing.assert_close(
                getattr(recorded, field)[i].float(),
                getattr(fresh, field)[i].float(),
                atol=1e-3,
                rtol=1e-3,
            )  # fmt: skip: within an fp16 step
    assert main([*argv, "--context", "-1"]) == 2  # one line naming the flag, before loading
    assert main([*argv[:-5], "--context", "4"]) == 2  # --context without --eagle-features
    # A finished run has nothing to answer: it says so, with no features stored.
    assert main(argv) == 0 and sorted(store.glob("shard-*.pt")) == shards


def test_regenerate_stopped_by_sigterm_keeps_what_it_wrote(tmp_path, smollm2):
    """A background run stopped with SIGTERM (the shell ignores SIGINT there) exits as Ctrl-C
    does (130), and the store holds the features of every reply the output file holds."""
    import signal
    import subprocess
    import sys
    import time

    from quickdraft.drafters.eagle.net import EagleConfig
    from quickdraft.models.loading import load_model
    from quickdraft.train.eagle_features import _index, sequence_key, store_folder

    folder, _ = tiny_folder_and_corpus(tmp_path, smollm2, "llama-tied")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"tell me {i}"}) + "\n" for i in range(40)))
    out, cache = tmp_path / "replies.jsonl", tmp_path / "cache"
    argv = [sys.executable, "-m", "quickdraft", "data", "regenerate", "--target", str(folder),
            "--prompts", str(prompts), "--out", str(out), "--max-new-tokens", "300",
            "--batch-size", "2", "--eagle-features", "--context", "4",
            "--cache", str(cache)]  # fmt: skip
    run = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while not (out.exists() and out.read_text().count("\n") >= 2) and run.poll() is None:
        assert time.monotonic() < deadline, "no reply written in time"
        time.sleep(0.2)
    run.send_signal(signal.SIGTERM)
    assert run.wait(timeout=120) == 130, run.stderr.read()
    lines = out.read_text().splitlines()
    assert 2 <= len(lines) < 40
    model, tokenizer = load_model(folder)
    layers = EagleConfig.for_target(model.config, "eagle3", 1).feature_layers
    index, _ = _index(store_folder(cache, str(folder), 4, layers, None))
    for line in lines:
        assert sequence_key(tokenize(json.loads(line), tokenizer, 512)) in index


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


def test_guide_prompts_ask_the_python_faq_and_about_its_guides(tmp_path):
    """The FAQ's questions as they are (qa) and chat requests about tutorial, HOWTO and
    library sections (conversation), alternately, titles read from the reST with their markup
    dropped and never from an indented example or comment; generic sections and the pages of
    modules the task sets quote are left out; the same for the same seed; a missing
    documentation tree is one clear error."""
    from quickdraft.cli import main
    from quickdraft.train.guide_prompts import CHAT_FORMS, guide_prompts

    docs = tmp_path / "_sources"
    for folder in ("faq", "library", "tutorial", "whatsnew"):
        (docs / folder).mkdir(parents=True)
    (docs / "faq" / "general.rst.txt").write_text(
        "General FAQ\n===========\n\nWhy is it called Python at all?\n"
        "-------------------------------\n\nBecause.\n\nShort?\n------\n"
        "\n.. XXX an old question\n   Is this one obsolete now, really?\n"
        "   ----------------------------------\n"
    )
    (docs / "library" / "json.rst.txt").write_text(
        ":mod:`!json` --- JSON encoder and decoder\n"
        "=========================================\n\nBasic Usage\n-----------\n\n"
        "Examples\n--------\n\n.. code-block:: python\n\n    def f():\n"
        '        """\n        A docstring\n        """\n'
    )
    (docs / "library" / "quoted.rst.txt").write_text(":mod:`quoted`\n=============\n")
    (docs / "tutorial" / "intro.rst.txt").write_text("Using ``for`` loops\n*******************\n")
    (docs / "whatsnew" / "3.11.rst.txt").write_text("What's New\n==========\n")
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "code.jsonl").write_text(json.dumps({"source": "cpython==3.11 Lib/quoted.py"}) + "\n")
    prompts = guide_prompts(10, task_dir=tasks, seed=3, root=docs)
    assert prompts[0] == {"kind": "qa", "prompt": "Why is it called Python at all?",
                          "source": "Doc/faq/general.rst.txt"}  # fmt: skip
    assert [p["kind"] for p in prompts] == ["qa", "conversation", "conversation", "conversation"]
    topics = {"the json module", "basic Usage in the json module", "using for loops"}
    asked = {p["prompt"] for p in prompts[1:]}
    assert len(asked) == 3 and asked <= {f.format(topic=t) for f in CHAT_FORMS for t in topics}
    assert {t for t in topics if any(f"{t} " in a or f"{t}?" in a for a in asked)} == topics
    assert guide_prompts(10, task_dir=tasks, seed=3, root=docs) == prompts
    for missing in (tmp_path / "missing", tasks):
        with pytest.raises(ValueError, match=r"python3\.11-doc"):
            guide_prompts(1, task_dir=tasks, root=missing)
    out = tmp_path / "guide.jsonl"
    if Path("/usr/share/doc/python3.11/html/_sources").is_dir():
        assert main(["data", "guide-prompts", "--out", str(out), "--count", "4"]) == 0
        assert len(out.read_text().splitlines()) == 4


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
