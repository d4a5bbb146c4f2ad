"""A bench run summarised per task and method: acceptance, speed against autoregressive decoding
(medians of per-prompt ratios), time split, shortlist sizes, identity with plain decoding."""

from __future__ import annotations

import math
import statistics
from typing import Any

from scipy import stats as scipy_stats

from quickdraft.bench.harness import BenchRun, RunRecord
from quickdraft.stats import Stats


def summarise(bench: BenchRun) -> dict[str, Any]:
    """Per task and method (and over all tasks): acceptance, speed, time split, identity."""
    tasks = list(dict.fromkeys(record.task for record in bench.records))
    result: dict[str, Any] = {}
    for scope in [*tasks, "all"]:
        chosen = [r for r in bench.records if scope == "all" or r.task == scope]
        result[scope] = {run.label: _summary(chosen, run.label, bench) for run in bench.methods}
    return result


def _summary(records: list[RunRecord], label: str, bench: BenchRun) -> dict[str, Any]:
    mine = [r for r in records if r.method == label]
    pooled = Stats(k=max((r.stats.k for r in mine), default=0))
    for record in mine:
        pooled.accepted_drafts.extend(record.stats.accepted_drafts)
        pooled.drafted.extend(record.stats.drafted)
    ar_records = [r for r in records if r.method == "ar"]
    ratios = _ratios(_per_item_median(mine), _per_item_median(ar_records))
    decode_ratios = _ratios(
        _per_item_median(mine, decode=True), _per_item_median(ar_records, decode=True)
    )
    reference = {
        (r.task, r.item): r.token_ids for r in records if r.method == "ar" and r.repeat == 0
    }
    identical = None
    compared = [r for r in mine if (r.task, r.item) in reference]  # a partial run may lack some
    if bench.settings.temperature == 0 and compared:
        identical = all(r.token_ids == reference[(r.task, r.item)] for r in compared)
    count = max(len(mine), 1)
    tokens = sum(len(r.token_ids) for r in mine)
    checked = [r for r in mine if r.valid is not None]  # items with a schema
    return {
        "runs": len(mine),
        "new_tokens": tokens,
        "mean_accepted_length": _finite(pooled.mean_accepted_length),
        "acceptance_by_position": [_finite(x) for x in pooled.acceptance_by_position],
        "tokens_per_s_median": _finite(
            statistics.median([r.tokens_per_second for r in mine]) if mine else float("nan")
        ),
        "speedup_over_ar": _finite(statistics.median(ratios) if ratios else float("nan")),
        "decode_tokens_per_s_median": _finite(
            statistics.median([r.decode_tokens_per_second for r in mine]) if mine else float("nan")
        ),
        "decode_speedup_over_ar": _finite(
            statistics.median(decode_ratios) if decode_ratios else float("nan")
        ),
        "time_per_run_s": {
            "prefill": sum(r.stats.time_prefill for r in mine) / count,
            "draft": sum(r.stats.time_draft for r in mine) / count,
            "verify": sum(r.stats.time_verify for r in mine) / count,
            "other": sum(r.stats.time_other for r in mine) / count,
        },
        "drafter_vocab_size": bench.drafter_vocab.get(label),
        "draft_step_ms": _finite(_draft_step_ms(mine)),
        "shortlist_size_mean": _finite(_mean_shortlist(mine)),
        "shortlist_size_by_position": _shortlist_by_position(mine),
        "identical_to_ar": identical,
        "invalid": sum(not r.valid for r in checked) if checked else None,
        "forced_share": _finite(
            sum(r.forced_tokens or 0 for r in checked)
            / max(1, sum(len(r.token_ids) for r in checked))
        )
        if checked
        else None,
    }


def paired_speed(records: list[RunRecord], label: str, reference: str) -> dict[str, Any] | None:
    """How fast ``label`` decodes against ``reference``, paired prompt by prompt: the geometric
    mean over prompts of the ratio of their decode rates (above 1: ``label`` is faster; a
    prompt run several times counts its median rate) with a 95% interval for it, Student's t
    on the log ratios (n - 1 degrees of freedom). Two configurations on the same prompts share
    each prompt's difficulty, so this resolves a few percent where medians of ratios to plain
    decoding scatter with the host's memory rate. Prompts either lacks, or where either has no
    finite rate, are left out; None under two prompts."""
    mine = _finite_rates(records, label)
    theirs = _finite_rates(records, reference)
    logs = [math.log(mine[item] / theirs[item]) for item in mine if item in theirs]
    if len(logs) < 2:
        return None
    mean = statistics.fmean(logs)
    half = scipy_stats.t.ppf(0.975, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return {
        "ratio": math.exp(mean),
        "low": math.exp(mean - half),
        "high": math.exp(mean + half),
        "prompts": len(logs),
    }


def _finite_rates(records: list[RunRecord], label: str) -> dict[tuple[str, str], float]:
    """Per prompt, the median of ``label``'s finite, positive decode rates."""
    rates: dict[tuple[str, str], list[float]] = {}
    for record in records:
        rate = record.decode_tokens_per_second
        if record.method == label and math.isfinite(rate) and rate > 0:
            rates.setdefault((record.task, record.item), []).append(rate)
    return {item: statistics.median(values) for item, values in rates.items()}


def _draft_step_ms(records: list[RunRecord]) -> float:
    """Drafting time per drafted token, pooled over the runs."""
    drafted = sum(sum(r.stats.drafted) for r in records)
    seconds = sum(r.stats.time_draft for r in records)
    return 1000 * seconds / drafted if drafted else float("nan")


def _mean_shortlist(records: list[RunRecord]) -> float:
    """Mean shortlist size per draft position, pooled over runs by their drafted tokens."""
    pairs = [
        (r.shortlist_size, sum(r.stats.drafted)) for r in records if r.shortlist_size is not None
    ]
    weight = sum(n for _, n in pairs)
    return sum(size * n for size, n in pairs) / weight if weight else float("nan")


def _shortlist_by_position(records: list[RunRecord]) -> list[float] | None:
    rows = [r.shortlist_by_position for r in records if r.shortlist_by_position]
    if not rows:
        return None
    width = max(len(row) for row in rows)
    return [statistics.fmean(row[t] for row in rows if t < len(row)) for t in range(width)]


def _per_item_median(
    records: list[RunRecord], decode: bool = False
) -> dict[tuple[str, str], float]:
    by_item: dict[tuple[str, str], list[float]] = {}
    for record in records:
        rate = record.decode_tokens_per_second if decode else record.tokens_per_second
        by_item.setdefault((record.task, record.item), []).append(rate)
    return {item: statistics.median(values) for item, values in by_item.items()}


def _ratios(speed: dict, baseline: dict) -> list[float]:
    return [speed[item] / baseline[item] for item in speed if item in baseline]


def _finite(value: float) -> float | None:
    return None if value != value else value  # NaN -> None, for JSON
