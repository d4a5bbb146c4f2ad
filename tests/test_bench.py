import json
import re
import sys
from pathlib import Path

import pytest

from quickdraft.bench.harness import BenchSettings, parse_methods, run_bench
from quickdraft.bench.tasks import TASK_KINDS, load_tasks, parse_tasks
from quickdraft.cli import main
from quickdraft.config import Method, SamplingParams
from quickdraft.engine import generate


def test_every_task_set_has_twenty_complete_items():
    tasks = load_tasks()
    assert set(tasks) == set(TASK_KINDS)
    for kind, items in tasks.items():
        assert len(items) >= 20, kind
        assert len({item.id for item in items}) == len(items)
        for item in items:
            assert item.task == kind and item.prompt and item.source and item.license
            assert item.messages and item.messages[-1]["role"] == "user"
            assert all(m["role"] in ("user", "assistant") and m["content"] for m in item.messages)
    assert len(load_tasks(("code",), per_task=2)["code"]) == 2


def test_agentic_sessions_are_whole_and_outside_all():
    sessions = load_tasks(("agentic",), per_task=3)["agentic"]
    assert "agentic" not in parse_tasks("all") and parse_tasks("agentic") == ("agentic",)
    names = list(dict.fromkeys(item.session for item in sessions))
    assert [name.split("-")[0] for name in names] == ["tools", "sql", "edit"]
    for name in names:
        turns = [item for item in sessions if item.session == name]
        assert [item.turn for item in turns] == [1, 2, 3, 4]
        assert turns[0].messages[-1]["role"] == "user" and "cpython" in turns[0].source
        assert all(m["role"] == "user" for item in turns[1:] for m in item.messages)


def test_a_session_turn_carries_the_models_own_earlier_replies(smollm2):
    target, tokenizer = smollm2
    turns = load_tasks(("agentic",), per_task=1)["agentic"][:2]
    seen: list[list[int]] = []
    bench = run_bench(
        target, tokenizer, parse_methods("ngram@3"), {"agentic": turns},
        BenchSettings(max_new_tokens=4),
        on_run=lambda record, _: seen.append(record.token_ids),
    )  # fmt: skip
    first_ar, second_ar = (r for r in bench.records if r.method == "ar")
    reply = tokenizer.decode(first_ar.token_ids).strip()
    history = [*turns[0].messages, {"role": "assistant", "content": reply}]
    expected = tokenizer.apply_chat([*history, *turns[1].messages])
    again = generate(target, expected, sampling=SamplingParams(temperature=0.0, max_new_tokens=4))
    assert again.token_ids == second_ar.token_ids
    assert len(seen) == 4 and all(r.token_ids == second_ar.token_ids for r in bench.records[2:])
    # Each method kept one engine: the second turn found the first one's text cached.
    assert all(r.stats.cached_prompt_tokens > len(first_ar.token_ids) for r in bench.records[2:])


def test_structured_items_reply_valid_json_and_count_the_forced_tokens(smollm2, tmp_path):
    items = load_tasks(("structured",))["structured"]
    assert [item.id.split("-")[1] for item in items[:3]] == ["signature", "class", "tool"]
    assert all(item.schema and item.schema["additionalProperties"] is False for item in items)
    argv = ["bench", "--methods", "ar,suffix@4", "--tasks", "structured", "--prompts-per-task",
            "2", "--max-new-tokens", "160", "--out", str(tmp_path)]  # fmt: skip
    code = main(argv)
    assert code == 0
    data = json.loads((tmp_path / "results.json").read_text())
    for method in ("ar", "suffix k=4"):
        row = data["results"]["structured"][method]
        assert row["invalid"] == 0 and 0.1 < row["forced_share"] < 1
    assert data["results"]["structured"]["suffix k=4"]["identical_to_ar"] is True
    assert "## Structured outputs" in (tmp_path / "report.md").read_text()


def test_task_and_method_parsing():
    assert parse_tasks("all") == TASK_KINDS
    assert parse_tasks("code, math") == ("code", "math")
    with pytest.raises(ValueError, match="tasks"):
        parse_tasks("code,poetry")
    runs = parse_methods("ngram,draft_model@3,draft_model@5")
    assert [r.label for r in runs] == ["ar", "ngram k=5", "draft_model k=3", "draft_model k=5"]
    assert runs[2].spec.method is Method.DRAFT_MODEL and runs[2].spec.k == 3
    assert parse_methods("ngram", k=2)[1].spec.k == 2
    with pytest.raises(ValueError, match="methods"):
        parse_methods("medusa9")
    with pytest.raises(ValueError, match="methods"):
        parse_methods("ngram@x")
    for bad in ("ngram+fr:3", "ngram@3+fr:3"):  # a shortlist is draft_model's and eagle's
        with pytest.raises(ValueError, match=rf"'{re.escape(bad)}': ngram takes only @K"):
            parse_methods(bad)
    with pytest.raises(ValueError, match=r"ar \(plain decoding\) takes no options"):
        parse_methods("ar+fr:3")
    for bad in ("eagle@p0.05", "eagle@6.4.10p", "eagle@p"):  # no floor dropped silently
        with pytest.raises(ValueError, match=r"eagle takes @DEPTH.TOPK.TOKENS\[pMIN_PROB\]"):
            parse_methods(bad)
    with pytest.raises(ValueError, match="repeats"):
        BenchSettings(repeats=0)


def test_eagle_method_strings_set_the_tree_floor_and_grafted_lookup():
    runs = {r.label: r.spec for r in parse_methods("eagle,eagle+0,eagle@6.4.10p0.2+8")}
    options = {label: spec.options for label, spec in runs.items()}
    assert str(options["eagle"].tree) == "default" and options["eagle"].eagle_lookup is None
    assert options["eagle lookup=0"].eagle_lookup == 0
    custom = options["eagle tree=6,4,10,0.2 lookup=8"]
    assert str(custom.tree) == "6,4,10,0.2" and custom.eagle_lookup == 8
    for bad in ("eagle+x", "eagle@6.4.10p2", "eagle@6.4", "eagle+1+2", "eagle+fr:8+dyna:2"):
        with pytest.raises(ValueError, match="methods"):
            parse_methods(bad)


def test_eagle_method_strings_take_a_shortlist_beside_the_lookup():
    runs = {r.label: r.spec for r in parse_methods("eagle+dyna-pa:8,eagle@6.4.10+0+fr:4096")}
    plain = runs["eagle dyna-pa:8"].options
    assert str(plain.draft_shortlist) == "dyna-pa:8" and plain.eagle_lookup is None
    both = runs["eagle tree=6,4,10 lookup=0 fr:4096"].options
    assert str(both.draft_shortlist) == "fr:4096" and both.eagle_lookup == 0
    with pytest.raises(ValueError, match="dyna-pa:x"):
        parse_methods("eagle+dyna-pa:x")


def test_bench_runs_every_task_on_smollm2_and_writes_the_report(smollm2, tmp_path, capsys):
    code = main(
        [
            "bench",
            "--methods",
            "ar,ngram@3",
            "--tasks",
            "all",
            "--prompts-per-task",
            "1",
            "--max-new-tokens",
            "6",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0
    data = json.loads((tmp_path / "results.json").read_text())
    assert set(data["results"]) == {*TASK_KINDS, "all"}
    row = data["results"]["all"]["ngram k=3"]
    assert row["identical_to_ar"] is True and row["runs"] == len(TASK_KINDS)
    assert row["drafter_vocab_size"] == 0 and len(row["acceptance_by_position"]) == 3
    assert data["results"]["all"]["ar"]["speedup_over_ar"] == pytest.approx(1.0)
    report = (tmp_path / "report.md").read_text()
    assert "Decoding speedup over autoregressive" in report and "| code |" in report
    assert data["results"]["all"]["ar"]["decode_speedup_over_ar"] == pytest.approx(1.0)
    for name in ("speedup_by_task.png", "acceptance_by_position.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"
    assert "wrote" in capsys.readouterr().out


def test_an_interrupted_bench_leaves_partial_results_and_the_rerun_resumes(
    smollm2, tmp_path, monkeypatch, capsys
):
    import quickdraft.bench.harness as harness

    argv = ["bench", "--methods", "ar,ngram@3", "--tasks", "code,math", "--prompts-per-task",
            "2", "--max-new-tokens", "4", "--out", str(tmp_path)]  # fmt: skip
    (tmp_path / "results.json").write_text('{"meta": {"old": true}, "results": {}}')
    real_run, calls = harness.run_request, []

    def interrupted_after_three(*args, **kwargs):
        if len(calls) == 3:
            raise KeyboardInterrupt
        calls.append(1)
        return real_run(*args, **kwargs)

    monkeypatch.setattr(harness, "run_request", interrupted_after_three)
    assert main(argv) == 130
    partial = json.loads((tmp_path / "results.json").read_text())
    assert partial["meta"]["partial"] is True and partial["meta"]["completed"] == "3/8"
    assert "Partial results" in (tmp_path / "report.md").read_text()
    assert len((tmp_path / "runs.jsonl").read_text().splitlines()) == 1 + 3

    calls.clear()

    def counted(*args, **kwargs):
        calls.append(1)
        return real_run(*args, **kwargs)

    monkeypatch.setattr(harness, "run_request", counted)
    assert main(argv) == 0
    assert len(calls) == 5  # only the runs the first attempt did not finish
    done = json.loads((tmp_path / "results.json").read_text())
    assert done["meta"]["partial"] is False and done["meta"]["completed"] == "8/8"
    assert done["results"]["all"]["ngram k=3"]["identical_to_ar"] is True
    assert "resuming: 3 runs" in capsys.readouterr().out

    other = [*argv[:-2], "--max-new-tokens", "5", "--out", str(tmp_path)]  # another bench
    calls.clear()
    assert main(other) == 0
    assert len(calls) == 8  # nothing reused from a bench with other settings
    real_generate = harness.generate

    def fresh(*args, **kwargs):
        calls.append(1)
        return real_generate(*args, **kwargs)

    monkeypatch.setattr(harness, "generate", fresh)
    calls.clear()
    assert main([*other, "--no-prefix-caching"]) == 0
    assert len(calls) == 8  # a fresh engine a request: through ``generate``


def test_a_torn_last_line_keeps_the_runs_before_it(tmp_path):
    from quickdraft.bench.harness import RunRecord
    from quickdraft.bench.runlog import RunLog
    from quickdraft.stats import Stats

    settings = {"target": "t", "methods": ["ar"]}
    log = RunLog(tmp_path, settings)
    assert log.resume() == [] and not log.replaced
    for item in ("a", "b"):
        log.append(RunRecord("code", item, "ar", 0, [1, 2], 0.5, Stats(k=0, new_tokens=2)))
    with log.path.open("a") as handle:
        handle.write('{"task": "code", "item": "c", "meth')  # the process died mid-write
    again = RunLog(tmp_path, settings)
    kept = again.resume()
    assert [r.item for r in kept] == ["a", "b"] and kept[0].stats.new_tokens == 2
    assert len(again.path.read_text().splitlines()) == 3  # header and the two whole runs
    other = RunLog(tmp_path, {**settings, "methods": ["ngram"]})
    assert other.resume() == [] and other.replaced


def test_paired_speed_is_the_geometric_mean_of_per_prompt_ratios_with_its_interval():
    import dataclasses
    import math

    from quickdraft.bench.harness import RunRecord
    from quickdraft.bench.summary import paired_speed
    from quickdraft.stats import Stats

    def run(item: str, method: str, decode_seconds: float) -> RunRecord:
        stats = Stats(k=0, new_tokens=10, time_prefill=0.5)
        return RunRecord("code", item, method, 0, list(range(10)), 0.5 + decode_seconds, stats)

    # The tree is 2x faster on one prompt and 1.25x on another (its second run there, 1.5x,
    # makes a median of 1.25x with the 1x below); prompt "c" has no reference run and prompt
    # "d" no finite rate (a reply of no decode time), so neither counts.
    records = [run("a", "eagle", 1.0), run("a", "tree", 0.5),
               run("b", "eagle", 1.0), run("b", "tree", 0.8), run("c", "tree", 1.0),
               run("d", "eagle", 1.0), run("d", "tree", 0.0)]  # fmt: skip
    records[3:3] = [dataclasses.replace(run("b", "tree", 2 / 3), repeat=1),
                    dataclasses.replace(run("b", "tree", 1.0), repeat=2)]  # fmt: skip
    paired = paired_speed(records, "tree", "eagle")
    logs = [math.log(2.0), math.log(1.25)]
    # Two prompts: the t quantile of 1 degree of freedom (12.706), stdev |a - b| / sqrt(2).
    half = 12.7062047 * abs(logs[0] - logs[1]) / math.sqrt(2) / math.sqrt(2)
    assert paired["prompts"] == 2
    assert paired["ratio"] == pytest.approx(math.sqrt(2.0 * 1.25))
    assert paired["low"] == pytest.approx(math.exp(sum(logs) / 2 - half))
    assert paired["high"] == pytest.approx(math.exp(sum(logs) / 2 + half))
    assert paired_speed(records, "eagle", "tree")["ratio"] == pytest.approx(1 / paired["ratio"])
    assert paired_speed(records[:2], "tree", "eagle") is None  # one prompt: no interval


def test_a_tree_sweep_reports_each_tree_paired_with_the_reference():
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "eagle_tree_sweep.py"
    spec = importlib.util.spec_from_file_location("sweep_under_test", path)
    sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep)
    meta = {"target": "t", "target_weights": "q4", "machine": "m", "threads": 2,
            "prompts_per_task": 3, "prompts": "calibration", "max_new_tokens": 96,
            "eagle_dir": "shipped"}  # fmt: skip
    paired = {
        "reference": "eagle",
        "rows": {
            "ar": {"ratio": 0.8, "low": 0.7, "high": 0.9, "prompts": 21},
            "eagle tree=5,3,8,0.1": {"ratio": 1.031, "low": 1.009, "high": 1.055, "prompts": 21},
            "eagle tree=9,9,9,0.1": None,
        },
    }
    report = sweep.render({"meta": meta, "rows": {}, "paired": paired})
    lines = report.splitlines()
    tree = lines.index("| eagle tree=5,3,8,0.1 | 1.031 (1.009-1.055) | 21 |")
    assert tree < lines.index("| ar | 0.800 (0.700-0.900) | 21 |")  # fastest first
    assert "| eagle tree=9,9,9,0.1 | (fewer than two prompts) | |" in lines
    assert "Paired by prompt against `eagle`" in report


def _renderers() -> dict:
    """Every committed benchmark results file and the code that renders its report."""
    import importlib.util

    from quickdraft.bench.report import markdown

    benchmarks = str(REPO / "benchmarks")
    if benchmarks not in sys.path:  # scripts import their siblings, as `python benchmarks/x.py` can
        sys.path.insert(0, benchmarks)

    def script(name: str):
        path = REPO / "benchmarks" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    def tasks_of(result: dict) -> list[str]:
        return [t for t in result["summary"] if t != "all"]

    shortlists, medusa = script("shortlists"), script("medusa_exercise3")
    return {
        "shortlists": lambda r: shortlists.render(r, tasks_of(r)),
        "medusa": lambda r: medusa.render(r, tasks_of(r)),
        "dynaspec_eagle": script("dynaspec_eagle").render,
        "eagle_tree_sweep": script("eagle_tree_sweep").render,
        "engine_batch_ab": script("engine_batch_ab").render,
        "regenerate_rate": script("regenerate_rate").render,
        "eagle_held_out": script("eagle_held_out").render,
        "quant_agreement": script("quant_agreement").render,
        "bench": lambda r: markdown(r["results"], r["meta"]),
    }


REPO = Path(__file__).resolve().parent.parent
RESULT_FILES = sorted((REPO / "benchmarks" / "results").rglob("results.json"))


@pytest.mark.parametrize(
    "path", RESULT_FILES, ids=[str(p.parent.relative_to(REPO)) for p in RESULT_FILES]
)
def test_every_committed_result_renders_to_its_report(path):
    """Each committed results.json renders, with the code that wrote it, to the report.md
    beside it: no report quotes a figure its data does not hold."""
    renderers = _renderers()
    result = json.loads(path.read_text())
    kind = path.parent.relative_to(REPO / "benchmarks" / "results").parts[0]
    render = renderers.get(kind) or renderers["bench"]  # `quickdraft bench` runs
    assert render(result) == (path.parent / "report.md").read_text()


def test_a_k_given_to_a_method_it_does_not_size_is_ignored_with_a_warning():
    """vLLM's configs give EAGLE num_speculative_tokens; quickdraft's EAGLE grows a tree, so
    the value is ignored, but never silently."""
    from quickdraft.drafters.registry import make_spec

    with pytest.warns(UserWarning, match=r"num_speculative_tokens: eagle .* 3 is ignored"):
        spec = make_spec("eagle", 3)
    assert spec == make_spec("eagle")
    with pytest.warns(UserWarning, match="lookahead_window"):
        make_spec("lookahead", 5)
    assert make_spec("ngram", 3).num_speculative_tokens == 3  # k sizes these
