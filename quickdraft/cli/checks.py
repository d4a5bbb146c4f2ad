"""`quickdraft conformance`, `theory` and `demo`: exactness, theory, toy runs."""

from __future__ import annotations

import argparse
import time

from rich.progress import Progress
from rich.table import Table
from rich.text import Text

from quickdraft.cli.common import console

# The samples at which the test suite's deliberately broken rules and drafters all fail
# (p < 1e-6); fewer give a pass that proves little.
POWERFUL_SAMPLES = 50_000


def _conformance(args: argparse.Namespace) -> int:
    import math
    import sys

    from quickdraft.config import MAX_SEED
    from quickdraft.conformance import full_cases, quick_cases, run_case

    if not (math.isfinite(args.alpha) and 0 < args.alpha < 1):
        raise ValueError(f"alpha must be a p-value threshold in (0, 1), got {args.alpha}")
    if not 0 <= args.seed <= MAX_SEED:
        raise ValueError(f"seed must be in 0..{MAX_SEED}, got {args.seed}")
    from quickdraft.conformance import MIN_SAMPLES
    from quickdraft.engine.core import MAX_BATCH  # a case's requests share one engine

    if not MIN_SAMPLES <= args.samples <= MAX_BATCH:
        raise ValueError(f"--samples must be in {MIN_SAMPLES}..{MAX_BATCH}, got {args.samples}")
    if args.samples < POWERFUL_SAMPLES:
        print(
            f"warning: --samples {args.samples} gives the test little power: the suite's broken "
            f"rules are caught at {POWERFUL_SAMPLES:,}; a pass here proves little",
            file=sys.stderr,
        )
    start = time.perf_counter()
    cases = full_cases() if args.full else quick_cases()
    results = []
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("conformance", total=len(cases))
        for case in cases:
            results.append(run_case(case, samples=args.samples, seed=args.seed))
            progress.advance(task)
    table = Table(
        title=f"Conformance: joint distribution of the first k+1 tokens, "
        f"{args.samples:,} samples per row"
    )
    for column in (
        "rule",
        "T",
        "top_k",
        "top_p",
        "k",
        "shortlist",
        "draft",
        "accepted length",
        "bins",
        "p-value",
        "TV",
        "",
    ):
        table.add_column(
            column, justify="left" if column == "rule" else "right", no_wrap=column == "rule"
        )
    failed = 0
    for result in results:
        case, ok = result.case, result.p_value >= args.alpha
        failed += not ok
        table.add_row(
            case.rule.value,
            f"{case.temperature:g}",
            str(case.top_k),
            f"{case.top_p:g}",
            str(case.k),
            case.shortlist,
            _draft_shape(case.tree, case.k)
            + ("" if case.target == "float" else f", {case.target} target"),
            f"{result.mean_accepted_length:.2f}",
            str(result.bins),
            f"{result.p_value:.3g}",
            f"{result.total_variation:.4f}",
            "[green]pass[/green]" if ok else "[red]FAIL[/red]",
        )
    console.print(table)
    elapsed = time.perf_counter() - start
    console.print(
        f"{len(results) - failed}/{len(results)} rows pass at p >= {args.alpha:g}; {elapsed:.1f} s"
    )
    return 1 if failed else 0


def _theory(args: argparse.Namespace) -> int:
    from quickdraft.theory import CostModel
    from quickdraft.theory_report import TOLERANCE, build_report, write_report

    report = build_report(CostModel(args.draft_cost, args.verify_slope), args.steps, args.seed)
    paths = write_report(report, args.out)
    table = Table(
        title=f"Optimal draft length (draft cost {args.draft_cost:g}, "
        f"verify slope {args.verify_slope:g})"
    )
    for column in ("alpha", "optimal N", "tokens / target call", "speedup"):
        table.add_column(column, justify="right")
    for row in report.optimal:
        table.add_row(
            f"{row.alpha:g}",
            str(row.optimal_n),
            f"{row.tokens_per_step:.2f}",
            f"{row.speedup:.2f}x",
        )
    console.print(table)
    table = Table(
        title=f"Acceptance against KL(target || draft), {args.steps:,} speculative steps each"
    )
    for column in ("draft distance", "KL", "1 - TV (exact)", "measured", "gap", "trials"):
        table.add_column(column, justify="right")
    for point in sorted(report.acceptance, key=lambda p: p.kl):
        table.add_row(
            f"{point.distance:g}",
            f"{point.kl:.4f}",
            f"{point.expected:.4f}",
            f"{point.measured:.4f}",
            f"{point.measured - point.expected:+.4f}",
            f"{point.trials:,}",
        )
    console.print(table)
    console.print(
        f"monotone decreasing: {report.monotone}; largest gap {report.max_gap:.4f} "
        f"(tolerance {TOLERANCE})"
    )
    for path in paths:
        console.print(f"wrote {path}")
    return 0 if report.passed else 1


def _demo(args: argparse.Namespace) -> int:
    from quickdraft.config import Method, SamplingParams, SpecConfig
    from quickdraft.engine import generate
    from quickdraft.models.toy import NGramLM, ToyTokenizer

    target = NGramLM.random(26, order=3, seed=args.seed, sharpness=3.0)
    draft = target.perturbed(0.25)
    tokenizer = ToyTokenizer(26)
    console.print(
        "Toy trigram target (26 letters) and a perturbed copy as draft model. "
        "[bold cyan]Cyan[/bold cyan]: draft tokens the target accepted.\n"
    )
    for temperature in (0.0, 1.0):
        sampling = SamplingParams(temperature=temperature, max_new_tokens=64, seed=args.seed)
        for spec in (SpecConfig(method=Method.AR), SpecConfig(num_speculative_tokens=4)):
            out = generate(
                target, "spec", sampling=sampling, spec=spec, draft=draft, tokenizer=tokenizer
            )
            text = Text()
            for token, drafted in zip(out.token_ids, out.from_draft, strict=True):
                text.append(tokenizer.decode([token]), style="bold cyan" if drafted else None)
            console.print(f"[bold]{spec.method!s}[/bold], temperature {temperature:g}:")
            console.print(text)
            console.print(out.stats.summary() + "\n")
    return 0


def _draft_shape(tree: str, k: int) -> str:
    """'chain' or the tree: 'sampled tree (10 nodes)' / 'top-k tree (7 nodes)' / 'EAGLE
    dynamic tree (6 nodes)'."""
    if not tree:
        return "chain"
    from quickdraft.toys import eagle_row, lookahead_row, toy_tree

    if tree.startswith("eagle"):
        shape, lookup = eagle_row(tree)
        floor = f", p >= {shape.min_prob:g}" if shape.min_prob else ""
        extra = floor + (f", + {lookup} lookup" if lookup else "")
        return f"EAGLE dynamic tree ({shape.tokens} nodes{extra})"
    if tree.startswith("lookahead"):
        config = lookahead_row(tree)
        return f"lookahead W={config.window} N={config.ngram} G={config.candidates}"
    if tree.startswith("suffix"):
        return f"suffix decoding (chains of up to {k})"

    kind = "sampled" if tree.startswith("sample") else "top-k"
    return f"{kind} tree ({toy_tree(tree).num_nodes} nodes)"
