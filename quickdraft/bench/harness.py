"""Run methods over task sets, interleaved prompt by prompt, and summarise what they measured.

The machine's speed drifts, so every prompt runs every method back to back (in an order rotated
from prompt to prompt), and speedups are medians of per-prompt ratios to autoregressive decoding
measured in the same run. At temperature 0 every output is checked against autoregressive
decoding, token for token.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from quickdraft.bench.tasks import TaskItem
from quickdraft.config import Method, SamplingParams, SpecConfig
from quickdraft.drafters import build_drafter
from quickdraft.engine import generate, same_vocabulary
from quickdraft.models.base import Model
from quickdraft.stats import Stats

DEFAULT_K = {Method.DRAFT_MODEL: 4, Method.NGRAM: 5}


@dataclass(frozen=True, slots=True)
class MethodRun:
    label: str
    spec: SpecConfig


def parse_methods(text: str, k: int | None = None) -> list[MethodRun]:
    """'ar,draft_model,ngram,medusa,eagle', each optionally with '@K' ('draft_model@3'; for
    medusa the tree's widths, 'medusa@4.2.1'; for eagle its dynamic tree's depth, top-k and
    tokens with an optional minimum path probability, 'eagle@4.4.12', 'eagle@6.4.10p0.1'; for
    lookahead W.N.G, 'lookahead@4.4.3') and, for draft_model, '+SHORTLIST'
    ('draft_model@5+dyna-pa:32', see ``quickdraft.vocab``), for eagle '+N', the prompt-lookup
    tokens grafted onto its tree ('eagle+0': the network alone); ar always first."""
    runs: dict[str, MethodRun] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        part, _, shortlist = part.partition("+")
        name, _, k_text = part.partition("@")
        try:
            method = Method(name)
        except ValueError:
            allowed = ", ".join(m.value for m in Method)
            raise ValueError(f"methods: unknown method {name!r}; choose from {allowed}") from None
        if method is Method.AR:
            runs["ar"] = MethodRun("ar", SpecConfig(method=Method.AR))
            continue
        if method is Method.LOOKAHEAD:
            label = "lookahead" + (f" W.N.G={k_text}" if k_text else "")
            try:
                values = [int(v) for v in k_text.split(".")] if k_text else []
                if values and len(values) != 3:
                    raise ValueError
            except ValueError:
                raise ValueError(
                    f"methods: {part!r}: lookahead takes @W.N.G, such as lookahead@4.4.3"
                ) from None
            names = ("lookahead_window", "lookahead_ngram", "lookahead_candidates")
            try:
                spec = SpecConfig(method=method, **dict(zip(names, values, strict=False)))
            except ValueError as error:
                raise ValueError(f"methods: {part!r}: {error}") from None
            runs[label] = MethodRun(label, spec)
            continue
        if method is Method.EAGLE:
            run = _eagle_run(part, k_text, shortlist)
            runs[run.label] = run
            continue
        if method is Method.MEDUSA:
            tree = k_text.replace(".", ",") if k_text else "default"
            label = name + (f" tree={k_text}" if k_text else "")
            try:
                runs[label] = MethodRun(label, SpecConfig(method=method, tree=tree))
            except ValueError as error:
                raise ValueError(f"methods: {part!r}: {error}") from None
            continue
        try:
            chosen = int(k_text) if k_text else (DEFAULT_K[method] if k is None else k)
        except ValueError:
            raise ValueError(f"methods: {part!r}: the number after @ must be an integer") from None
        label = f"{name} k={chosen}" + (f" {shortlist}" if shortlist else "")
        try:
            spec = SpecConfig(
                method=method, num_speculative_tokens=chosen, draft_shortlist=shortlist or "full"
            )
        except ValueError as error:
            raise ValueError(f"methods: {part!r}: {error}") from None
        runs[label] = MethodRun(label, spec)
    runs.setdefault("ar", MethodRun("ar", SpecConfig(method=Method.AR)))
    return [runs["ar"]] + [run for label, run in runs.items() if label != "ar"]


def _eagle_run(part: str, tree_text: str, lookup_text: str) -> MethodRun:
    """``eagle[@D.K.N[pMIN_PROB]][+LOOKUP]``: the dynamic tree (``eagle@6.4.10p0.1`` is
    ``--tree 6,4,10,0.1``) and the prompt-lookup tokens grafted on (``+0``: none)."""
    shape, _, min_prob = tree_text.partition("p")
    tree = shape.replace(".", ",") + (f",{min_prob}" if min_prob else "") if shape else "default"
    settings: dict = {"tree": tree}
    label = "eagle" + (f" tree={tree}" if tree_text else "")
    if lookup_text:
        try:
            settings["eagle_lookup"] = int(lookup_text)
        except ValueError:
            raise ValueError(
                f"methods: {part!r}: eagle takes +N, the prompt-lookup tokens grafted onto "
                "its tree, such as eagle@6.4.10p0.1+5"
            ) from None
        label += f" lookup={lookup_text}"
    try:
        return MethodRun(label, SpecConfig(method=Method.EAGLE, **settings))
    except ValueError as error:
        raise ValueError(f"methods: {part!r}: {error}") from None


@dataclass(frozen=True, slots=True)
class BenchSettings:
    max_new_tokens: int = 64
    temperature: float = 0.0
    repeats: int = 1
    seed: int = 0
    chat: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.repeats, int) or self.repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {self.repeats}")
        SamplingParams(
            temperature=self.temperature, max_new_tokens=self.max_new_tokens, seed=self.seed
        )


@dataclass(slots=True)
class RunRecord:
    task: str
    item: str
    method: str
    repeat: int
    token_ids: list[int]
    seconds: float
    stats: Stats
    # Mean drafter shortlist size over the run's draft positions, and per position (None
    # without a shortlist).
    shortlist_size: float | None = None
    shortlist_by_position: list[float] | None = None

    @property
    def key(self) -> tuple[str, str, str, int]:
        return (self.task, self.item, self.method, self.repeat)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # the Stats inside becomes a dict too

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> RunRecord:
        return cls(**{**record, "stats": Stats(**record["stats"])})

    @property
    def tokens_per_second(self) -> float:
        """End to end: prefill included."""
        return len(self.token_ids) / self.seconds if self.seconds > 0 else float("nan")

    @property
    def decode_tokens_per_second(self) -> float:
        """After prefill, which speculation does not change."""
        decode = self.seconds - self.stats.time_prefill
        return len(self.token_ids) / decode if decode > 0 else float("nan")


@dataclass(slots=True)
class BenchRun:
    """Everything a bench run measured, plus what it needs to describe itself."""

    methods: list[MethodRun]
    settings: BenchSettings
    records: list[RunRecord] = field(default_factory=list)
    drafter_vocab: dict[str, int | None] = field(default_factory=dict)


def run_bench(
    target: Model,
    tokenizer: Any,
    methods: list[MethodRun],
    tasks: dict[str, list[TaskItem]],
    settings: BenchSettings,
    *,
    draft: Model | None = None,
    draft_tokenizer: Any = None,
    draft_name: str | None = None,
    target_name: str | None = None,
    medusa_dir: str | None = None,
    eagle_dir: str | None = None,
    drafters: dict[str, Any] | None = None,
    on_run: Callable[[RunRecord, BenchRun], None] | None = None,
    done: list[RunRecord] | None = None,
) -> BenchRun:
    """Every method on every item, ``settings.repeats`` times, interleaved item by item.

    Drafters are built once per method (packing a shortlisted head is not per-request work);
    ``draft_name`` finds the shortlist artifacts shipped for the draft, ``target_name`` the
    Medusa heads and EAGLE drafter shipped for the target (``medusa_dir`` and ``eagle_dir``
    override them). ``drafters`` gives
    prebuilt drafters by method label (a pruned draft model, say); the others are built from
    their specs. ``on_run(record, bench)`` follows every run, with the bench so far.
    ``done``: records of an interrupted run of the same bench, kept and not run again
    (``on_run`` is not called for them)."""
    given = dict(drafters or {})
    needs_draft = [
        m for m in methods if m.spec.method is Method.DRAFT_MODEL and m.label not in given
    ]
    if needs_draft and draft is None:
        raise ValueError("draft: method draft_model needs --draft")
    bench = BenchRun(methods, settings, records=list(done or []))
    finished = {record.key for record in bench.records}
    same = None
    if draft is not None and draft_tokenizer is not None:
        same = same_vocabulary(tokenizer, draft_tokenizer)
    folders = {Method.MEDUSA: ("medusa_dir", medusa_dir), Method.EAGLE: ("eagle_dir", eagle_dir)}
    for method, (field_name, folder) in folders.items():
        if folder is None:
            continue
        methods = [
            MethodRun(m.label, dataclasses.replace(m.spec, **{field_name: folder}))
            if m.spec.method is method
            else m
            for m in methods
        ]
    bench.methods = methods
    built = {
        run.label: given[run.label]
        if run.label in given
        else build_drafter(
            run.spec,
            target,
            draft if run.spec.method is Method.DRAFT_MODEL else None,
            same_tokenizer=same,
            draft_name=draft_name,
            target_name=target_name,
        )
        for run in methods
    }
    for run in methods:
        drafter = built[run.label]
        bench.drafter_vocab[run.label] = {
            Method.AR: None,
            Method.NGRAM: 0,
            Method.MEDUSA: target.vocab_size,
            Method.LOOKAHEAD: 0,
        }.get(run.spec.method, getattr(drafter, "vocab_size", None))
        if run.spec.method is Method.EAGLE:  # it scores its draft vocabulary only
            bench.drafter_vocab[run.label] = int(drafter.draft_vocab.numel())
    sampling = SamplingParams(
        temperature=settings.temperature,
        max_new_tokens=settings.max_new_tokens,
        seed=settings.seed,
    )  # the tokenizer's EOS ids end each reply
    index = 0
    for kind, items in tasks.items():
        for item in items:
            prompt = _prompt_ids(item, tokenizer, settings.chat)
            for repeat in range(settings.repeats):
                order = methods[index % len(methods) :] + methods[: index % len(methods)]
                index += 1
                for run in order:
                    if (kind, item.id, run.label, repeat) in finished:
                        continue
                    drafter = built[run.label]
                    shortlist = getattr(drafter, "shortlist", None)
                    if shortlist is not None:
                        shortlist.reset_stats()
                    start = time.perf_counter()
                    out = generate(
                        target,
                        prompt,
                        sampling=sampling,
                        spec=run.spec,
                        draft=drafter,
                        tokenizer=tokenizer,
                    )
                    record = RunRecord(
                        kind,
                        item.id,
                        run.label,
                        repeat,
                        out.token_ids,
                        time.perf_counter() - start,
                        out.stats,
                    )
                    if shortlist is not None:
                        record.shortlist_size = shortlist.mean_size()
                        record.shortlist_by_position = shortlist.mean_size_by_position()
                    bench.records.append(record)
                    if on_run is not None:
                        on_run(record, bench)
    return bench


def _prompt_ids(item: TaskItem, tokenizer: Any, chat: bool) -> list[int]:
    if chat and getattr(tokenizer, "has_chat_template", False):
        return tokenizer.apply_chat(list(item.messages))
    return tokenizer.encode(item.prompt)
