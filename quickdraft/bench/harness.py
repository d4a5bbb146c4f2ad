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

from quickdraft.bench.labels import parse_label
from quickdraft.bench.tasks import TaskItem
from quickdraft.config import Method, SamplingParams, SpecConfig
from quickdraft.drafters import registry
from quickdraft.drafters.registry import build_drafter
from quickdraft.engine import generate
from quickdraft.engine.api import build_engine, run_request
from quickdraft.engine.core import DEFAULT_MAX_MODEL_LEN
from quickdraft.models.base import Model
from quickdraft.models.tokenizer import same_vocabulary
from quickdraft.stats import Stats


@dataclass(frozen=True, slots=True)
class MethodRun:
    label: str
    spec: SpecConfig


def parse_methods(text: str, k: int | None = None) -> list[MethodRun]:
    """Comma-separated method labels (``bench.labels``): 'ar,draft_model,ngram,medusa,eagle',
    with '@K' for chains ('draft_model@3'; ``k`` or the method's default k otherwise) and each
    method's own forms ('medusa@4.2.1', 'eagle@6.4.10p0.1+5', 'lookahead@4.4.3',
    'draft_model@5+dyna-pa:32'). ar always runs, first."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise ValueError("methods: name at least one method, such as ar,ngram,eagle")
    runs: dict[str, MethodRun] = {}
    for part in parts:
        label, spec = parse_label(part, k)
        runs[label] = MethodRun(label, spec)
    runs.setdefault("ar", MethodRun("ar", SpecConfig(method=Method.AR)))
    return [runs["ar"]] + [run for label, run in runs.items() if label != "ar"]


@dataclass(frozen=True, slots=True)
class BenchSettings:
    max_new_tokens: int = 64
    temperature: float = 0.0
    repeats: int = 1
    seed: int = 0
    chat: bool = True
    # One engine per method for the whole run, as a server keeps one: a session's next turn
    # finds its earlier turns cached (``Engine(prefix_caching=...)``). False: a fresh engine
    # per request, every prompt prefilled whole.
    prefix_caching: bool = True
    # Items with a schema (``structured``) ask for replies valid against it; False runs them
    # unconstrained (their replies are still checked).
    constrained: bool = True

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
    # Items with a schema: whether the reply is JSON valid against it, and how many of its
    # tokens the grammar forced (None for other items).
    valid: bool | None = None
    forced_tokens: int | None = None

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
    entries = {run.label: registry.get(run.spec.method) for run in methods}
    needs_draft = [m for m in methods if entries[m.label].draft_model and m.label not in given]
    if needs_draft and draft is None:
        raise ValueError(f"draft: method {needs_draft[0].spec.method} needs --draft")
    bench = BenchRun(methods, settings, records=list(done or []))
    finished = {record.key for record in bench.records}
    same = None
    if draft is not None and draft_tokenizer is not None:
        same = same_vocabulary(tokenizer, draft_tokenizer)
    folders = {"medusa_dir": medusa_dir, "eagle_dir": eagle_dir}
    runs = []
    for run in methods:
        names = entries[run.label].option_names()
        owned = {f: v for f, v in folders.items() if v and f in names}
        runs.append(
            MethodRun(run.label, registry.with_options(run.spec, **owned)) if owned else run
        )
    bench.methods = runs
    built = {
        run.label: given[run.label]
        if run.label in given
        else build_drafter(
            run.spec,
            target,
            draft if entries[run.label].draft_model else None,
            same_tokenizer=same,
            draft_name=draft_name,
            target_name=target_name,
        )
        for run in runs
    }
    for run in runs:
        drafter = built[run.label]
        bench.drafter_vocab[run.label] = None if drafter is None else drafter.head_rows
    sampling = SamplingParams(
        temperature=settings.temperature,
        max_new_tokens=settings.max_new_tokens,
        seed=settings.seed,
    )  # the tokenizer's EOS ids end each reply
    engines = {}
    if settings.prefix_caching:
        length = min(target.max_positions, DEFAULT_MAX_MODEL_LEN)
        for run in runs:  # a row each; a prompt prefilled in one pass, as ``generate`` does
            engines[run.label] = build_engine(
                target, run.spec, built[run.label], tokenizer, max_batch=1,
                max_model_len=length, prefill_chunk=length, seed=settings.seed,
            )  # fmt: skip
    index = 0
    sessions = _Sessions(tokenizer, settings.chat)
    schemas = _Schemas(tokenizer, target.vocab_size, settings.constrained)
    for kind, items in tasks.items():
        for item in items:
            for repeat in range(settings.repeats):
                order = runs[index % len(runs) :] + runs[: index % len(runs)]
                index += 1
                for run in order:
                    prompt = sessions.prompt(item, run.label, repeat)
                    if (kind, item.id, run.label, repeat) in finished:
                        done_ids = next(r.token_ids for r in bench.records if r.key == (
                            kind, item.id, run.label, repeat))  # fmt: skip
                        sessions.replied(item, run.label, repeat, done_ids)
                        continue
                    drafter = built[run.label]
                    shortlist = getattr(drafter, "shortlist", None)
                    if shortlist is not None:
                        shortlist.reset_stats()
                    asked = schemas.sampling(item, sampling)
                    start = time.perf_counter()
                    if run.label in engines:
                        out = run_request(engines[run.label], prompt, asked)
                        engines[run.label].take_stats()  # the run's are the request's
                    else:
                        out = generate(
                            target,
                            prompt,
                            sampling=asked,
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
                    record.valid, record.forced_tokens = schemas.check(item, out.token_ids)
                    if shortlist is not None:
                        record.shortlist_size = shortlist.mean_size()
                        record.shortlist_by_position = shortlist.mean_size_by_position()
                    bench.records.append(record)
                    sessions.replied(item, run.label, repeat, out.token_ids)
                    if on_run is not None:
                        on_run(record, bench)
    return bench


class _Sessions:
    """Requests of session turns (agentic tasks): each method's run of a session keeps its
    own conversation, the turns so far with the model's own replies, and a turn's request is
    that conversation plus what the turn adds. Items outside sessions are their own request."""

    def __init__(self, tokenizer: Any, chat: bool):
        self.tokenizer = tokenizer
        self.chat = chat and getattr(tokenizer, "has_chat_template", False)
        self.messages: dict[tuple[str, str, int], list[dict[str, str]]] = {}
        self.text: dict[tuple[str, str, int], str] = {}

    def prompt(self, item: TaskItem, method: str, repeat: int) -> list[int]:
        key = (method, item.session or "", repeat)
        if item.session is None or item.turn <= 1:
            self.messages.pop(key, None)
            self.text.pop(key, None)
        if self.chat:
            return self.tokenizer.apply_chat([*self.messages.get(key, []), *item.messages])
        return self.tokenizer.encode(self.text.get(key, "") + item.prompt)

    def replied(self, item: TaskItem, method: str, repeat: int, token_ids: list[int]) -> None:
        if item.session is None:
            return
        key = (method, item.session, repeat)
        reply = self.tokenizer.decode(token_ids).strip()  # special tokens left out
        history = self.messages.setdefault(key, [])
        history += [*item.messages, {"role": "assistant", "content": reply}]
        self.text[key] = self.text.get(key, "") + item.prompt + " " + reply + "\n\n"


class _Schemas:
    """Items with a JSON schema: the sampling that asks for it (``constrained``), and each
    reply's check: valid JSON against the schema (``jsonschema``, not the grammar that made
    it), and the tokens the grammar forced along it."""

    def __init__(self, tokenizer: Any, vocab_size: int, constrained: bool):
        self.tokenizer, self.vocab_size, self.constrained = tokenizer, vocab_size, constrained
        self._grammars: Any = None

    def sampling(self, item: TaskItem, sampling: SamplingParams) -> SamplingParams:
        if item.schema is None or not self.constrained:
            return sampling
        return dataclasses.replace(sampling, json_schema=item.schema)

    def check(self, item: TaskItem, token_ids: list[int]) -> tuple[bool | None, int | None]:
        if item.schema is None:
            return None, None
        import json

        import jsonschema

        from quickdraft.constraints import Constraint, Grammars

        try:
            jsonschema.validate(json.loads(self.tokenizer.decode(token_ids)), item.schema)
            valid = True
        except (ValueError, jsonschema.ValidationError):
            valid = False
        if self._grammars is None:
            self._grammars = Grammars(self.tokenizer, self.vocab_size)
        matcher = self._grammars.matcher(Constraint("json_schema", item.schema))
        return valid, matcher.count_forced(token_ids)
