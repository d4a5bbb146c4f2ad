"""Drafter vocabulary shortlists on the Qwen2.5-Coder 1.5B target / 0.5B draft pair.

DynaSpec's table over the seven task kinds of ``quickdraft bench``: full vocabulary, FR-Spec
(a static frequency list of 32,768 tokens, about 21.6% of 151,936), FR-Spec-PA, DynaSpec-F and
DynaSpec-PA, with the shipped artifacts (``quickdraft/vocab/artifacts/qwen2.5-coder-0.5b``).

Two parts, one run:

1. Draft step micro-benchmark: the drafter alone proposing k tokens on real contexts, each
   configuration interleaved with the others, repeated; median ms per proposed token. The
   DynaSpec router runs inline and, separately, on a second thread.
2. ``quickdraft bench`` over the seven tasks, greedy, every method interleaved per prompt: per
   task the mean accepted length and mean shortlist size; overall the draft step time (drafting
   time per drafted token in the real runs), decoding and end-to-end tokens/s, and identity
   with autoregressive decoding.

    python benchmarks/shortlists.py --threads 2 --prompts-per-task 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import Progress

from quickdraft.bench.harness import BenchSettings, parse_methods, run_bench
from quickdraft.bench.machine import describe_machine
from quickdraft.bench.summary import summarise
from quickdraft.bench.tasks import TASK_KINDS, load_tasks
from quickdraft.config import SamplingParams
from quickdraft.drafters.base import Batch, StepResult
from quickdraft.drafters.draft_model.drafter import DraftModelDrafter
from quickdraft.models.loading import load_model
from quickdraft.vocab import artifact_folder, build_shortlist

RESULTS = Path(__file__).parent / "results"
TARGET, DRAFT = "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"
console = Console(width=120)


def micro(draft, tokenizer, configs: dict[str, str], k: int, repeats: int) -> dict:
    """Median ms per drafted token of DraftModelDrafter.propose for each configuration.

    Configurations whose label ends in "thread" run the router on a second thread. They are
    timed in a pass of their own after the others: torch's OpenMP workers of a second Python
    thread keep spinning for a while after each call, and slowed every configuration timed
    beside them by a quarter (measured: 35 against 25 ms per token with the full head)."""
    inline = {label: text for label, text in configs.items() if not label.endswith("thread")}
    threaded = {label: text for label, text in configs.items() if label.endswith("thread")}
    result = _micro_pass(draft, tokenizer, inline, k, repeats, parallel=False)
    if threaded:
        # The inline DynaSpec-PA again beside each threaded one, for a same-pass comparison.
        twins = {f"{label} (inline twin)": text for label, text in threaded.items()}
        both = _micro_pass(draft, tokenizer, {**twins, **threaded}, k, repeats, parallel=True)
        result.update(both)
    return result


def _micro_pass(
    draft, tokenizer, configs: dict[str, str], k: int, repeats: int, parallel: bool
) -> dict:
    folder = artifact_folder(DRAFT)
    drafters = {}
    for label, text in configs.items():
        threaded = parallel and label.endswith("thread")
        shortlist = build_shortlist(text, folder, k, parallel_router=threaded)
        drafters[label] = DraftModelDrafter(draft, k, shortlist=shortlist)
    tasks = load_tasks(TASK_KINDS, 1)
    times: dict[str, list[float]] = {label: [] for label in drafters}
    for items in tasks.values():
        prompt = tokenizer.apply_chat(list(items[0].messages))
        state = Batch.from_rows([prompt], SamplingParams(temperature=0, seed=0))
        for drafter in drafters.values():
            drafter.reserve(1, state.capacity)
            drafter.begin(StepResult(state, state.lengths - 1))
            drafter.propose(state)  # warm-up
        for _ in range(repeats):
            for label, drafter in drafters.items():
                start = time.perf_counter()
                drafter.propose(state)
                times[label].append(1000 * (time.perf_counter() - start) / k)
    return {label: statistics.median(values) for label, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompts-per-task", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("-k", type=int, default=5)
    parser.add_argument("--fr", type=int, default=32768, help="FR-Spec list size")
    parser.add_argument("--fr-pa", type=int, default=None, help="FR-Spec-PA size at t = 0, 1")
    parser.add_argument("--dyna", type=int, default=2, help="DynaSpec-F clusters")
    parser.add_argument("--dyna-pa", type=int, default=8, help="DynaSpec-PA k_max")
    parser.add_argument("--micro-repeats", type=int, default=10)
    parser.add_argument("--draft-int8", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument(
        "--micro-only",
        action="store_true",
        help="only the draft step micro-benchmark, written to OUT/micro_<weights>.json",
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "shortlists")
    parser.add_argument(
        "--render",
        action="store_true",
        help="only rewrite OUT/report.md from OUT/results.json (no measuring)",
    )
    args = parser.parse_args()
    if args.render:
        result = json.loads((args.out / "results.json").read_text())
        tasks = [t for t in result["summary"] if t != "all"]
        (args.out / "report.md").write_text(render(result, tasks))
        return
    torch.set_num_threads(args.threads)

    draft, draft_tokenizer = load_model(DRAFT, int8=args.draft_int8)
    target, tokenizer = (None, draft_tokenizer) if args.micro_only else load_model(TARGET)
    clusters = _num_clusters()
    vocab = draft.embed.shape[0] if target is None else target.vocab_size
    # FR-Spec-PA gets DynaSpec-PA's expected size: k_max clusters of average size.
    fr_pa = args.fr_pa or round(args.dyna_pa * vocab / clusters)
    shortlists = {
        "full": "full",
        "fr-spec": f"fr:{args.fr}",
        "fr-spec-pa": f"fr-pa:{fr_pa}",
        # The shipped artifacts' variant: core + sequence tokens + routed clusters.
        "dynaspec-f": f"dyna-hybrid:{args.dyna}",
        "dynaspec-pa": f"dyna-hybrid-pa:{args.dyna_pa}",
    }
    # The floor: a 1,024-token list leaves the step without (almost) any head, what no
    # shortlist can go below.
    configs = {
        **shortlists,
        "head floor (fr:1024)": "fr:1024",
        "dynaspec-pa, router thread": shortlists["dynaspec-pa"],
    }
    console.print("draft step micro-benchmark ...")
    step_ms = micro(draft, draft_tokenizer, configs, args.k, args.micro_repeats)
    if args.micro_only:
        weights = "int8" if args.draft_int8 else "fp32"
        record = {
            "draft_weights": weights,
            "k": args.k,
            "threads": torch.get_num_threads(),
            "machine": describe_machine(),
            "shortlists": configs,
            "draft_step_ms": step_ms,
            "vs_full": {label: ms / step_ms["full"] - 1 for label, ms in step_ms.items()},
        }
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"micro_{weights}.json").write_text(json.dumps(record, indent=2) + "\n")
        for label, ms in step_ms.items():
            console.print(
                f"{label:>28}: {ms:6.2f} ms per drafted token ({record['vs_full'][label]:+.1%})"
            )
        return

    text = ",".join(
        ["ar"]
        + [f"draft_model@{args.k}" + ("" if s == "full" else f"+{s}") for s in shortlists.values()]
    )
    methods = parse_methods(text)
    label_of = {m.label: name for m, name in zip(methods[1:], shortlists, strict=True)}
    tasks = load_tasks(TASK_KINDS, args.prompts_per_task)
    settings = BenchSettings(max_new_tokens=args.max_new_tokens, temperature=0.0)
    total = sum(len(v) for v in tasks.values()) * len(methods)
    with Progress(console=console, transient=True) as progress:
        bar = progress.add_task("bench", total=total)
        bench = run_bench(
            target, tokenizer, methods, tasks, settings, draft=draft,
            draft_tokenizer=draft_tokenizer, draft_name=DRAFT,
            on_run=lambda r, _: progress.update(bar, advance=1, description=f"{r.task} {r.method}"),
        )  # fmt: skip
    summary = summarise(bench)
    meta = {
        "target": TARGET,
        "draft": DRAFT,
        "draft_weights": "int8" if args.draft_int8 else "fp32",
        "k": args.k,
        "clusters": clusters,
        "vocab": vocab,
        "shortlists": shortlists,
        "prompts_per_task": args.prompts_per_task,
        "max_new_tokens": args.max_new_tokens,
        "threads": torch.get_num_threads(),
        "machine": describe_machine(),
    }
    rows = {
        name: {
            task: {
                "accepted_length": summary[task][label]["mean_accepted_length"],
                "shortlist": summary[task][label]["shortlist_size_mean"],
            }
            for task in [*tasks, "all"]
        }
        for label, name in label_of.items()
    }
    overall = {
        name: {
            "draft_step_ms_bench": summary["all"][label]["draft_step_ms"],
            "draft_step_ms_micro": step_ms[name],
            "tokens_per_s": summary["all"][label]["tokens_per_s_median"],
            "decode_tokens_per_s": summary["all"][label]["decode_tokens_per_s_median"],
            "speedup_over_ar": summary["all"][label]["speedup_over_ar"],
            "decode_speedup_over_ar": summary["all"][label]["decode_speedup_over_ar"],
            "identical_to_ar": summary["all"][label]["identical_to_ar"],
            "shortlist_by_position": summary["all"][label]["shortlist_size_by_position"],
        }
        for label, name in label_of.items()
    }
    overall["ar"] = {
        "tokens_per_s": summary["all"]["ar"]["tokens_per_s_median"],
        "decode_tokens_per_s": summary["all"]["ar"]["decode_tokens_per_s_median"],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    result = {
        "meta": meta,
        "per_task": rows,
        "overall": overall,
        "head_floor_ms": step_ms["head floor (fr:1024)"],
        "router_thread_ms": step_ms["dynaspec-pa, router thread"],
        "router_inline_twin_ms": step_ms["dynaspec-pa, router thread (inline twin)"],
        "summary": summary,
    }
    (args.out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    report = render(result, list(tasks))
    (args.out / "report.md").write_text(report)
    console.print(report)


def render(result: dict, tasks: list[str]) -> str:
    meta, rows, overall = result["meta"], result["per_task"], result["overall"]
    vocab = meta["vocab"]
    lines = [
        f"# Drafter vocabulary shortlists: {meta['target']} / {meta['draft']} "
        f"({meta['draft_weights']} draft)",
        "",
        f"Machine: {meta['machine']}; {meta['threads']} threads. Greedy, k = {meta['k']}, "
        f"{meta['prompts_per_task']} prompts per task, {meta['max_new_tokens']} new tokens, chat "
        f"template; M = {meta['clusters']} clusters; vocabulary {vocab:,}. Shortlists: "
        + ", ".join(f"{n} = `{s}`" for n, s in meta["shortlists"].items())
        + ".",
        "",
        "Mean accepted length per task (tokens per target forward, bonus included) and, below "
        "it, the mean shortlist size over draft positions:",
        "",
        "| method | " + " | ".join(tasks) + " | mean over tasks | pooled |",
        "|---|" + "---|" * (len(tasks) + 2),
    ]
    for name, per_task in rows.items():
        lengths = [per_task[t]["accepted_length"] or 0 for t in tasks]
        lines.append(
            f"| {name} | "
            + " | ".join(f"{x:.2f}" for x in lengths)
            + f" | {statistics.fmean(lengths):.2f} | {per_task['all']['accepted_length']:.2f} |"
        )
    for name, per_task in rows.items():
        if per_task["all"]["shortlist"] is None:
            continue
        sizes = [per_task[t]["shortlist"] or 0 for t in tasks]
        lines.append(
            f"| {name} size | "
            + " | ".join(f"{x / 1000:.1f}k" for x in sizes)
            + f" | {statistics.fmean(sizes) / 1000:.1f}k ({statistics.fmean(sizes) / vocab:.1%})"
            f" | {per_task['all']['shortlist'] / 1000:.1f}k |"
        )
    full = overall["full"]
    lines += [
        "",
        "Overall (median tokens/s over prompts; draft step = drafting time per drafted token):",
        "",
        "| method | draft step ms (bench) | vs full | draft step ms (micro) | vs full | "
        "decode tok/s | end-to-end tok/s | vs full | identical to ar |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in overall.items():
        if name == "ar":
            continue
        lines.append(
            f"| {name} | {row['draft_step_ms_bench']:.2f} | "
            f"{row['draft_step_ms_bench'] / full['draft_step_ms_bench'] - 1:+.1%} | "
            f"{row['draft_step_ms_micro']:.2f} | "
            f"{row['draft_step_ms_micro'] / full['draft_step_ms_micro'] - 1:+.1%} | "
            f"{row['decode_tokens_per_s']:.2f} | {row['tokens_per_s']:.2f} | "
            f"{row['tokens_per_s'] / full['tokens_per_s'] - 1:+.1%} | {row['identical_to_ar']} |"
        )
    lines += [
        f"| ar | | | | | {overall['ar']['decode_tokens_per_s']:.2f} | "
        f"{overall['ar']['tokens_per_s']:.2f} | | |",
        "",
    ]
    # Runs before the head floor and the router's inline twin were measured lack them.
    if "head_floor_ms" in result:
        floor = result["head_floor_ms"]
        lines += [
            f"Head floor: a 1,024-token list (fr:1024) drafts at {floor:.2f} ms per token "
            f"({floor / full['draft_step_ms_micro'] - 1:+.1%} against the full head, micro): "
            "no shortlist can take the step further down on this machine.",
            "",
        ]
    # Runs before the inline twin compared the thread with the inline row of the first pass.
    twin = result.get("router_inline_twin_ms")
    against = (
        f" against {twin:.2f} inline in the same pass"
        if twin is not None
        else f" against {overall['dynaspec-pa']['draft_step_ms_micro']:.2f} inline"
    )
    lines += [
        f"DynaSpec-PA with the router on a second thread: {result['router_thread_ms']:.2f} ms "
        "per drafted token (micro)" + against + ".",
        "",
        "Mean shortlist size by draft position: "
        + "; ".join(
            f"{n}: " + ", ".join(f"{x / 1000:.1f}k" for x in row["shortlist_by_position"])
            for n, row in overall.items()
            if n != "ar" and row.get("shortlist_by_position")
        ),
        "",
    ]
    return "\n".join(lines)


def _num_clusters() -> int:
    from quickdraft.vocab.shortlist import load_clusters

    return int(load_clusters(artifact_folder(DRAFT)).max()) + 1


if __name__ == "__main__":
    main()
