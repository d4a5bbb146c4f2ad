"""DynaSpec's table, on an EAGLE drafter over Qwen2.5-Coder-0.5B's 151,936-token vocabulary.

The paper's setting: an EAGLE drafter whose head scores the target's own head rows (EAGLE-2's
arrangement), so the head is most of a draft step. One bench run over the seven task kinds of
``quickdraft bench``, greedy and at T = 1, every method interleaved prompt by prompt:

* full: the whole head (151,936 rows);
* fr-spec: FR-Spec at the paper's ratio (32,768 of 128,256 rows: 25.5%, here 38,819 rows);
* fr-spec-pa: FR-Spec on the position-aware budget, sized like DynaSpec-PA;
* dynaspec-f / dynaspec-pa: the paper's DynaSpec (clusters over every head row, a router on
  ``[E(x_t), H_{t-1}]``, the union of the top k_c clusters; ``k_c`` fixed, or k_max at depths
  0 and 1 then ``floor(k_max / ((t + 1) * 2))``, at least 1);
* hybrid-pa: quickdraft's earlier variant (a core of frequent tokens, the sequence's tokens
  and routed clusters over the rest) on the position-aware budget;
* with ``--ablation``, the hybrid's parts: core only, core + sequence tokens (routed clusters
  only is dynaspec-pa; all three is hybrid-pa).

Every EAGLE row drafts with the network alone (no prompt-lookup graft, ``eagle+0``), the
paper's EAGLE-2, so the rows differ only in the head's rows. Columns: mean accepted length per
task, mean shortlist size, draft time per proposal (one dynamic tree), decode and end-to-end
tokens/s, identical to autoregressive decoding (greedy). Runs are logged per temperature in
``OUT/runs-T*.jsonl`` so an interrupted bench resumes; ``--render`` rebuilds ``report.md`` from
``results.json`` with the same code.

    python benchmarks/dynaspec_eagle.py --threads 2 --eagle-dir DIR --shortlist-dir DIR \\
        --hybrid-dir DIR

``--held-out DIR`` runs the same rows on prompts of the seven kinds that neither the bench nor
the drafter's training text holds: the prompts ``quickdraft data code-prompts`` and
``doc-prompts`` wrote into DIR (``code.jsonl``, ``docs.jsonl``, as in
``benchmarks/data/README.md``) and the shortlist corpus's user turns, each past the ones its
replies were regenerated from. Shortlist sizes (k_max) are chosen there, with ``--extra``
rows, and the bench's figures stay held out.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import Progress

from quickdraft.bench.harness import BenchSettings, MethodRun, RunRecord, run_bench
from quickdraft.bench.machine import describe_machine
from quickdraft.bench.runlog import RunLog
from quickdraft.bench.summary import summarise
from quickdraft.bench.tasks import TASK_KINDS, TaskItem, load_tasks
from quickdraft.config import SpecConfig
from quickdraft.drafters.registry import make_spec
from quickdraft.models.loading import load_model
from quickdraft.train.replies import read_prompts
from quickdraft.vocab.shortlist import load_clusters

RESULTS = Path(__file__).parent / "results" / "dynaspec_eagle"
DATA = Path(__file__).parent / "data"
# Held-out prompts: each file's prompts in ``data regenerate``'s order, past the first USED,
# which the drafter's training replies answer (benchmarks/data/README.md).
HELD_OUT = {"code.jsonl": 208, "docs.jsonl": 160}
CORPUS, CORPUS_USED = DATA / "shortlist_corpus.jsonl", 300
TARGET = "qwen2.5-coder-0.5b"
PAPER_RATIO = 32768 / 128256  # FR-Spec's list against Llama-3's vocabulary
# The paper's Table (Llama-3-8B-Instruct, EAGLE-2, A6000): mean accepted length per task.
PAPER = {
    "tasks": ["MT", "Conv.", "RAG", "Math", "QA", "Summ.", "Code", "mean"],
    "full vocabulary": [3.66, 4.11, 4.03, 4.31, 3.45, 3.68, 4.77, 4.00],
    "FR-Spec (32k)": [3.38, 3.87, 3.85, 4.16, 3.32, 3.51, 4.11, 3.74],
    "DynaSpec (27.3k mean)": [3.51, 4.05, 3.91, 4.21, 3.40, 3.51, 4.71, 3.90],
}
console = Console(width=140)


def methods(args: argparse.Namespace, vocab: int, clusters: int) -> dict[str, SpecConfig]:
    """The table's rows as EAGLE configurations (the network alone)."""
    fr = round(PAPER_RATIO * vocab)
    # FR-Spec-PA starts from k_max clusters' worth of rows, so its budget follows DynaSpec-PA's.
    fr_pa = round(args.dyna_pa * vocab / clusters)

    def eagle(shortlist: str, folder: Path | None) -> SpecConfig:
        return make_spec(
            method="eagle", eagle_dir=str(args.eagle_dir), eagle_lookup=0,
            draft_shortlist=shortlist, shortlist_dir=None if folder is None else str(folder),
        )  # fmt: skip

    rows = {
        "full": eagle("full", None),
        "fr-spec": eagle(f"fr:{fr}", args.shortlist_dir),
        "fr-spec-pa": eagle(f"fr-pa:{fr_pa}", args.shortlist_dir),
        "dynaspec-f": eagle(f"dyna:{args.dyna_f}", args.shortlist_dir),
        "dynaspec-pa": eagle(f"dyna-pa:{args.dyna_pa}", args.shortlist_dir),
    }
    if args.hybrid_dir is not None:
        rows["hybrid-pa"] = eagle(f"dyna-hybrid-pa:{args.hybrid_pa}", args.hybrid_dir)
        if args.ablation:
            rows["core only"] = eagle("dyna:0", args.hybrid_dir)
            rows["core + sequence"] = eagle("dyna-hybrid:0", args.hybrid_dir)
    for text in args.extra:  # hybrid kinds read the hybrid's artifacts, the rest the faithful
        hybrid = text.startswith("dyna-hybrid") and args.hybrid_dir is not None
        rows[text] = eagle(text, args.hybrid_dir if hybrid else args.shortlist_dir)
    if args.only:
        unknown = sorted(set(args.only) - set(rows))
        if unknown:
            raise SystemExit(f"--only: no rows {unknown}; the rows are {', '.join(rows)}")
        rows = {label: spec for label, spec in rows.items() if label in args.only}
    if "full" not in rows:
        raise SystemExit("--only: keep the full row, every comparison is against it")
    return rows


def answered_turns() -> set[str]:
    """The user turns every training reply file here answers (any target's): the prompt
    files are rebuilt per machine, whose standard library and man pages shift positions, so
    a held-out prompt is also checked by its text."""
    turns = set()
    for path in sorted(DATA.glob("*_replies_*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            messages = json.loads(line)["messages"]
            turns.update(m["content"] for m in messages if m["role"] == "user")
    return turns


def held_out_tasks(folder: Path, per_task: int) -> dict[str, list[TaskItem]]:
    """``per_task`` prompts of each bench task kind that no training reply answers."""
    answered = answered_turns()
    records = []
    for name, used in HELD_OUT.items():
        if not (folder / name).is_file():
            raise SystemExit(
                f"--held-out: no {name} in {folder}; write it as benchmarks/data/README.md says"
            )
        records += read_prompts(folder / name)[used:]
    records += read_prompts(CORPUS)[CORPUS_USED:]
    tasks: dict[str, list[TaskItem]] = {kind: [] for kind in TASK_KINDS}
    for record in records:
        if record["messages"][-1]["content"] in answered:
            continue
        chosen = tasks.get(record["kind"])
        if chosen is not None and len(chosen) < per_task:
            messages = tuple(record["messages"])
            item_id = f"held-out-{record['kind']}-{len(chosen) + 1:03d}"
            chosen.append(
                TaskItem(item_id, record["kind"], messages[-1]["content"], messages, "", "")
            )
    return tasks


def _identical(flag: bool | None) -> str:
    """Identity with plain decoding is checked at T = 0; sampled runs are judged by the
    chi-square tests instead (``quickdraft conformance``), so their column says so."""
    return "n/a (sampled)" if flag is None else str(flag)


def run(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    target, tokenizer = load_model(TARGET, quant=args.quant)
    vocab = target.vocab_size
    clusters = int(load_clusters(args.shortlist_dir).max()) + 1
    specs = methods(args, vocab, clusters)
    runs = [MethodRun("ar", SpecConfig(method="ar"))] + [
        MethodRun(label, spec) for label, spec in specs.items()
    ]
    if args.held_out is None:
        tasks = load_tasks(TASK_KINDS, args.prompts_per_task)
    else:
        tasks = held_out_tasks(args.held_out, args.prompts_per_task)
    meta = {
        "prompts": "bench" if args.held_out is None else "held out",
        "target": TARGET,
        "target_weights": args.quant or "float",
        "vocab": vocab,
        "clusters": clusters,
        "eagle_dir": str(args.eagle_dir),
        "shortlist_dir": str(args.shortlist_dir),
        "hybrid_dir": None if args.hybrid_dir is None else str(args.hybrid_dir),
        "shortlists": {label: str(spec.options.draft_shortlist) for label, spec in specs.items()},
        "prompts_per_task": args.prompts_per_task,
        "max_new_tokens": args.max_new_tokens,
        "threads": torch.get_num_threads(),
        "machine": describe_machine(),
    }
    result: dict = {"meta": meta, "temperatures": {}}
    args.out.mkdir(parents=True, exist_ok=True)
    for temperature in args.temperatures:
        bench = _bench_at(temperature, args, target, tokenizer, runs, tasks, meta)
        result["temperatures"][f"{temperature:g}"] = table(bench, list(tasks), specs)
        # Written after each temperature: a session that ends during the next one keeps this.
        (args.out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def _bench_at(temperature: float, args, target, tokenizer, runs, tasks, meta: dict):
    """One temperature's bench, resumed from and logged to ``OUT/T<temperature>/runs.jsonl``."""
    settings = BenchSettings(
        max_new_tokens=args.max_new_tokens, temperature=temperature, seed=args.seed
    )
    # The log's header leaves the machine out: a run may resume on another session's host.
    header = {**meta, "temperature": temperature, "machine": None}
    return logged_bench(
        args.out / f"T{temperature:g}", header, f"T={temperature:g}", target, tokenizer, runs,
        tasks, settings,
    )  # fmt: skip


def logged_bench(folder: Path, header: dict, label: str, target, tokenizer, runs, tasks,
                 settings: BenchSettings, target_name: str = TARGET, **options):  # fmt: skip
    """``run_bench`` with a progress bar, each run logged to ``folder/runs.jsonl`` and the
    runs already there (under the same ``header``) kept, so an interrupted bench resumes.
    ``options`` go to ``run_bench`` (``eagle_dir``, say)."""
    log = RunLog(folder, header)
    done = log.resume()
    total = sum(len(v) for v in tasks.values()) * len(runs)
    with Progress(console=console, transient=True) as progress:
        bar = progress.add_task("bench", total=total, completed=len(done))

        def logged(record: RunRecord, _bench) -> None:
            log.append(record)
            progress.update(bar, advance=1, description=f"{label} {record.task} {record.method}")

        return run_bench(
            target, tokenizer, runs, tasks, settings, target_name=target_name, done=done,
            on_run=logged, **options,
        )  # fmt: skip


def measure_then_render(parser, args, needed: tuple[str, ...], measure, render) -> None:
    """A bench script's end: measure into ``args.out`` unless ``--render`` (then each of
    ``needed`` must be given), then write ``report.md`` from ``results.json`` and show it."""
    if not args.render:
        missing = [name for name in needed if getattr(args, name) is None]
        if missing:
            flags = " and ".join("--" + name.replace("_", "-") for name in needed)
            parser.error(f"{flags} are needed to measure")
        measure(args)
    report = render(json.loads((args.out / "results.json").read_text()))
    (args.out / "report.md").write_text(report)
    console.print(report)


def table(bench, tasks: list[str], specs: dict[str, SpecConfig]) -> dict:
    """Per row: accepted length and shortlist size per task; draft ms per proposal, speeds and
    identity overall."""
    summary = summarise(bench)
    rows = {}
    for label in ["ar", *specs]:
        mine = [r for r in bench.records if r.method == label]
        steps = sum(r.stats.verify_steps for r in mine)
        drafting = sum(r.stats.time_draft for r in mine)
        overall = summary["all"][label]
        rows[label] = {
            "accepted_length": {t: summary[t][label]["mean_accepted_length"] for t in tasks},
            "shortlist": {t: summary[t][label]["shortlist_size_mean"] for t in tasks},
            "accepted_length_pooled": overall["mean_accepted_length"],
            "shortlist_pooled": overall["shortlist_size_mean"],
            "shortlist_by_depth": overall["shortlist_size_by_position"],
            "draft_ms_per_proposal": 1000 * drafting / steps if steps else None,
            "tokens_per_s": overall["tokens_per_s_median"],
            "decode_tokens_per_s": overall["decode_tokens_per_s_median"],
            "speedup_over_ar": overall["speedup_over_ar"],
            "decode_speedup_over_ar": overall["decode_speedup_over_ar"],
            "identical_to_ar": overall["identical_to_ar"],
        }
    return {"tasks": tasks, "rows": rows}


def _mean(values: list[float | None]) -> float:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else float("nan")


def render(result: dict) -> str:
    meta = result["meta"]
    vocab = meta["vocab"]
    lines = [
        f"# DynaSpec on an EAGLE drafter: {meta['target']} ({vocab:,}-token vocabulary, "
        f"{meta.get('target_weights', 'float')} weights)",
        "",
        f"Machine: {meta['machine']}; {meta['threads']} threads. {meta['prompts_per_task']} "
        f"{meta.get('prompts', 'bench')} prompts per task, {meta['max_new_tokens']} new tokens, "
        "chat template; EAGLE "
        f"drafter `{meta['eagle_dir']}`, network alone (no prompt-lookup graft); "
        f"M = {meta['clusters']} clusters (`{meta['shortlist_dir']}`). Shortlists: "
        + ", ".join(f"{n} = `{s}`" for n, s in meta["shortlists"].items())
        + ".",
        "",
    ]
    for temperature, part in result["temperatures"].items():
        tasks, rows = part["tasks"], part["rows"]
        full = rows["full"]
        lines += [
            f"## T = {temperature}",
            "",
            "Mean accepted length per task (tokens per target forward, bonus included), the "
            "mean shortlist size over draft calls, and the share of the full head's accepted "
            "length:",
            "",
            "| method | " + " | ".join(tasks) + " | mean | vs full | mean shortlist |",
            "|---|" + "---|" * (len(tasks) + 3),
        ]
        full_mean = _mean(list(full["accepted_length"].values()))
        for label, row in rows.items():
            if label == "ar":
                continue
            lengths = [row["accepted_length"][t] for t in tasks]
            size = row["shortlist_pooled"]
            shown = f"{vocab:,} (100%)" if size is None else f"{size:,.0f} ({size / vocab:.1%})"
            lines.append(
                f"| {label} | " + " | ".join(f"{x:.2f}" for x in lengths)
                + f" | {_mean(lengths):.2f} | {_mean(lengths) / full_mean:.1%} | {shown} |"
            )  # fmt: skip
        lines += [
            "",
            "Speed (medians over prompts; draft ms = drafting time per proposal, one tree):",
            "",
            "| method | draft ms | vs full | decode tok/s | end-to-end tok/s | vs full | "
            "vs ar | identical to ar |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for label, row in rows.items():
            if label == "ar":
                ar = row
                lines.append(
                    f"| ar | | | {ar['decode_tokens_per_s']:.2f} | {ar['tokens_per_s']:.2f} | "
                    f"{ar['tokens_per_s'] / full['tokens_per_s'] - 1:+.1%} | | |"
                )
                continue
            lines.append(
                f"| {label} | {row['draft_ms_per_proposal']:.1f} | "
                f"{row['draft_ms_per_proposal'] / full['draft_ms_per_proposal'] - 1:+.1%} | "
                f"{row['decode_tokens_per_s']:.2f} | {row['tokens_per_s']:.2f} | "
                f"{row['tokens_per_s'] / full['tokens_per_s'] - 1:+.1%} | "
                f"{row['speedup_over_ar']:.2f}x | {_identical(row['identical_to_ar'])} |"
            )
        lines += [
            "",
            "Mean shortlist size by draft depth: "
            + "; ".join(
                f"{label}: " + ", ".join(f"{x / 1000:.1f}k" for x in row["shortlist_by_depth"])
                for label, row in rows.items()
                if row.get("shortlist_by_depth")
            ),
            "",
        ]
    lines += [
        "## The paper's table (Llama-3-8B-Instruct, EAGLE-2, 128k vocabulary, A6000)",
        "",
        "| method | " + " | ".join(PAPER["tasks"]) + " |",
        "|---|" + "---|" * len(PAPER["tasks"]),
    ]
    for label, values in PAPER.items():
        if label != "tasks":
            lines.append(f"| {label} | " + " | ".join(f"{x:.2f}" for x in values) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--quant", choices=["int8"], default=None,
        help="the target's weights in int8 (about 3x faster a step on CPU, so the draft is a "
        "larger share of it); outputs are compared with the int8 target's own decoding",
    )  # fmt: skip
    parser.add_argument("--eagle-dir", type=Path, default=None)
    parser.add_argument("--shortlist-dir", type=Path, default=None, help="faithful artifacts")
    parser.add_argument("--hybrid-dir", type=Path, default=None, help="hybrid artifacts")
    parser.add_argument("--prompts-per-task", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    parser.add_argument("--dyna-f", type=int, default=8, help="DynaSpec-F clusters")
    parser.add_argument("--dyna-pa", type=int, default=16, help="DynaSpec-PA k_max")
    parser.add_argument("--hybrid-pa", type=int, default=8, help="hybrid k_max")
    parser.add_argument("--ablation", action="store_true", help="the hybrid's parts too")
    parser.add_argument(
        "--extra", nargs="+", default=[], help="more rows, each a shortlist such as dyna-pa:8"
    )
    parser.add_argument("--only", nargs="+", default=[], help="run only these rows (and ar)")
    parser.add_argument(
        "--held-out", type=Path, default=None, help="a folder of held-out prompt files (above)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--render", action="store_true", help="only rebuild OUT/report.md")
    args = parser.parse_args()
    measure_then_render(parser, args, ("eagle_dir", "shortlist_dir"), run, render)


if __name__ == "__main__":
    main()
