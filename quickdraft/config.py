"""User-facing configuration: how to sample, and how to speculate.

Both are frozen, slotted dataclasses checked in ``__post_init__``; every invalid value raises
``ValueError`` naming the field, so a bad request fails at the boundary and never deep inside a
tensor operation.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from enum import Enum, StrEnum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from quickdraft.constraints.spec import Constraint

# The ranges that work. Every bound is checked in __post_init__ by arithmetic alone: nothing is
# built or allocated while validating.
MIN_TEMPERATURE = 1e-5  # below it, logits / T overflows float32 for ordinary logits
MIN_TOP_P = 1e-6  # a smaller mass only ever keeps the top token; near 1e-45 it is a denormal
MAX_SEED = 2**63 - 1  # torch generators take 64-bit seeds; per-row seeds add the row index
MAX_TOKEN_ID = 2**31 - 1
MAX_NEW_TOKENS = 1_000_000
MAX_STOP_STRINGS = 64
MAX_LOGPROBS = 20  # most likely tokens reported beside each emitted one (OpenAI's top_logprobs cap)
# Draft sizes: tokens drafted per step (k), levels of a tree, children per node, and the
# tokens one verify pass may carry in all (tree nodes plus side branches). EAGLE-2's largest
# published tree has 60 nodes and lookahead's largest window 15 x 4 levels; 256 leaves room
# for a GPU and keeps a typo from asking a CPU for a week of work or a terabyte of mask.
MAX_SPECULATIVE_TOKENS = 64
MAX_TREE_DEPTH = 32
MAX_TREE_WIDTH = 64
MAX_DRAFT_TOKENS = 256
MAX_LOOKUP_NGRAM = 32
MAX_LOOKAHEAD_NGRAM = 16


class Method(StrEnum):
    """How draft tokens are proposed. ``AR`` proposes none: plain autoregressive decoding."""

    AR = "ar"
    DRAFT_MODEL = "draft_model"
    NGRAM = "ngram"
    MEDUSA = "medusa"
    EAGLE = "eagle"
    LOOKAHEAD = "lookahead"


class AcceptRule(StrEnum):
    """How the target judges a draft (``accept.py``). Rejection sampling and greedy are
    lossless; typical (Medusa-2) is lossy and never a default."""

    REJECTION_SAMPLING = "rejection_sampling"
    GREEDY = "greedy"
    TYPICAL = "typical"

    @property
    def lossless(self) -> bool:
        return self is not AcceptRule.TYPICAL


LOSSLESS_RULES = tuple(rule for rule in AcceptRule if rule.lossless)


def accept_rule(value: Any) -> AcceptRule:
    """An ``AcceptRule`` or its name, else ValueError naming ``acceptance``."""
    return _enum_value("acceptance", AcceptRule, value)  # type: ignore[return-value]


def check_batch_policy(value: Any) -> None:
    """``disable_by_batch_size``: None (always draft) or 1..2**20 requests."""
    if value is not None:
        check_range("disable_by_batch_size", value, 1, MAX_BATCH, integer=True)


def show_value(value: Any) -> str:
    """repr of a bad value, short: Python refuses to print ints past 4,300 digits."""
    try:
        text = repr(value)
    except ValueError:
        return "an integer of more than 4,300 digits"
    return text if len(text) <= 80 else text[:77] + "..."


def _check_number(name: str, value: Any, *, integer: bool = False) -> None:
    """Reject wrong types (bool included), NaN and infinities, naming the field."""
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        kind = "an integer" if integer else "a number"
        raise ValueError(f"{name} must be {kind}, got {show_value(value)} ({type(value).__name__})")
    try:
        finite = integer or math.isfinite(value)
    except OverflowError:  # an int past float's range, such as 10**400
        finite = False
    if not finite:
        raise ValueError(f"{name} must be finite, got {show_value(value)}")


def check_range(name: str, value: Any, low: float, high: float, *, integer: bool = False):
    """A number of the right type in [low, high], else ValueError naming the field."""
    _check_number(name, value, integer=integer)
    if not low <= value <= high:
        span = f"{low}..{high}" if integer else f"[{low:g}, {high:g}]"
        raise ValueError(f"{name} must be in {span}, got {show_value(value)}")


def check_temperature(name: str, value: Any) -> None:
    _check_number(name, value)
    if value > 1e30:  # logits / T is then 0 for every token: say uniform, not a number
        raise ValueError(f"{name} must be at most 1e30, got {show_value(value)}")
    if value != 0 and not value >= MIN_TEMPERATURE:
        raise ValueError(
            f"{name} must be 0 (greedy) or at least {MIN_TEMPERATURE:g}, got {show_value(value)}"
        )


def check_path(name: str, value: Any) -> None:
    """None, or a non-empty path given as str or os.PathLike (not bytes, ints or lists)."""
    if value is None:
        return
    if isinstance(value, bytes) or not isinstance(value, str | os.PathLike):
        raise ValueError(
            f"{name} must be a path (str), got {show_value(value)} ({type(value).__name__})"
        )
    if not os.fspath(value).strip():
        raise ValueError(f"{name} must be a non-empty path, got {show_value(value)}")
    if "\x00" in os.fspath(value):
        raise ValueError(f"{name}: a path cannot hold a NUL character")


def check_flag(name: str, value: Any) -> None:
    """True or False (not 0, 1 or "yes"), else ValueError naming the field."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {show_value(value)}")


def parsed(name: str, value: Any, kind: type) -> Any:
    """A structured option's value: a ``kind`` as given, or read from its text by
    ``kind.parse`` (the one place that text is read); else ValueError naming the field."""
    if isinstance(value, kind):
        return value
    if isinstance(value, str):
        return kind.parse(value)  # type: ignore[attr-defined]
    raise ValueError(f"{name} must be a {kind.__name__} or its text, got {show_value(value)}")


def parse_field(options: Any, name: str, kind: type) -> None:
    """Set a frozen dataclass's field ``name`` to its parsed value (``parsed``): options
    classes call it in ``__post_init__`` for their structured fields."""
    object.__setattr__(options, name, parsed(name, getattr(options, name), kind))


def _enum_value(name: str, enum: type[Enum], value: Any) -> Enum:
    if isinstance(value, enum):
        return value
    try:
        return enum(value)
    except ValueError:
        allowed = ", ".join(m.value for m in enum)  # type: ignore[attr-defined]
        raise ValueError(f"{name} must be one of {allowed}; got {show_value(value)}") from None


# The serving engine's batch policy (``SpecConfig.disable_by_batch_size``): where speculation
# stopped paying with concurrent requests (measured: benchmarks/results/defaults.md).
DEFAULT_DISABLE_BY_BATCH_SIZE = 3
MAX_BATCH = 1 << 20


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How the target's distribution is shaped and sampled; drafts use the same function.

    temperature: 0 means greedy (argmax, ties to the lowest token id); else at least 1e-5.
    top_k: keep the k most likely tokens; 0 turns it off.
    top_p: keep the smallest most-likely set whose mass reaches top_p, in [1e-6, 1]; 1.0 turns
        it off.
    max_new_tokens: generation stops after this many new tokens (1..1,000,000).
    seed: seeds the generator for drafts, acceptance and sampling, 0..2**63-1; None draws a
        fresh seed.
    stop_token_ids: generation also ends at the first of these (it is kept in token_ids).
    ignore_eos: False (the default) also ends generation at the tokenizer's end-of-sequence
        ids when the engine has a tokenizer; True generates past them.
    stop: strings that end generation; the text is cut before the match. Needs a tokenizer.
    logprobs: None reports no log-probabilities; n in 0..20 reports, for every emitted token,
        its log-probability under the target and the n most likely tokens' (the target's raw
        distribution: log-softmax of its logits, before temperature, top-k and top-p, as
        vLLM reports by default). Speculation leaves them exact: they are read off the verify
        pass at the emitted token's own position.
    draft_steps: report every verify step's draft and verdict (``RequestOutput.new_steps``,
        ``engine.requests.StepDetail``): what a page showing speculation reads. Off by
        default: it reads the draft back to the host each step.
    constraint: a structured output (``constraints.Constraint``); or one of ``json_schema``
        (a JSON Schema, as text or a dict), ``regex``, ``choice`` (a list of strings) or
        ``grammar`` (Lark or GBNF), which become it. The target's logits are masked to what
        the grammar allows before temperature, top-k and top-p (vLLM's order), at every
        position of every verify pass: speculation samples the constrained distribution
        exactly. Needs the engine's tokenizer.
    tenant: who the request is for (a server's API key, hashed), or None (one tenant for all):
        suffix decoding's shared trie is kept per tenant (lookahead's n-gram pool is still
        one for all), and ``Stats.cached_own_tokens`` counts only cached prefixes the same
        tenant left. It never changes the tokens.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    max_new_tokens: int = 128
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()
    logprobs: int | None = None
    draft_steps: bool = False
    constraint: Constraint | None = None
    json_schema: str | dict | None = None
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None
    tenant: str | None = None

    def __post_init__(self) -> None:
        self._fold_constraint()
        check_temperature("temperature", self.temperature)
        check_range("top_k", self.top_k, 0, MAX_TOKEN_ID, integer=True)
        check_range("top_p", self.top_p, MIN_TOP_P, 1.0)
        # A huge Python int (10**30) is a valid number but no tensor scalar: store floats.
        object.__setattr__(self, "temperature", float(self.temperature))
        object.__setattr__(self, "top_p", float(self.top_p))
        check_range("max_new_tokens", self.max_new_tokens, 1, MAX_NEW_TOKENS, integer=True)
        if self.seed is not None:
            check_range("seed", self.seed, 0, MAX_SEED, integer=True)
        object.__setattr__(self, "stop_token_ids", _as_tuple("stop_token_ids", self.stop_token_ids))
        for token in self.stop_token_ids:
            check_range("stop_token_ids", token, 0, MAX_TOKEN_ID, integer=True)
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be True or False, got {show_value(self.ignore_eos)}")
        object.__setattr__(self, "stop", _as_tuple("stop", self.stop))
        if len(self.stop) > MAX_STOP_STRINGS:
            raise ValueError(f"stop holds at most {MAX_STOP_STRINGS} strings, got {len(self.stop)}")
        for text in self.stop:
            if not isinstance(text, str) or not text:
                raise ValueError(f"stop must hold non-empty strings, got {show_value(text)}")
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError(f"stop: {show_value(text)} is not valid Unicode text") from None
        if self.logprobs is not None:
            check_range("logprobs", self.logprobs, 0, MAX_LOGPROBS, integer=True)
        if not isinstance(self.draft_steps, bool):
            raise ValueError(
                f"draft_steps must be True or False, got {show_value(self.draft_steps)}"
            )
        if self.tenant is not None and not (isinstance(self.tenant, str) and self.tenant):
            raise ValueError(f"tenant must be a non-empty string, got {show_value(self.tenant)}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def _fold_constraint(self) -> None:
        """The convenience fields become ``constraint`` (checked there, errors naming the
        field); each keeps a hashable form (a schema as canonical JSON text)."""
        names = ("json_schema", "regex", "choice", "grammar")
        given = [name for name in ("constraint", *names) if getattr(self, name) is not None]
        if not given:
            return
        from quickdraft.constraints.spec import Constraint  # only for a constrained request

        if len(given) == 2 and given[0] == "constraint":  # a copy (dataclasses.replace)
            name = given[1]
            if Constraint(name, getattr(self, name)) == self.constraint:
                return
        if len(given) > 1:
            raise ValueError(f"set one constraint, got {', '.join(given)}")
        if self.constraint is not None and not isinstance(self.constraint, Constraint):
            raise ValueError(
                f"constraint must be a Constraint, got {type(self.constraint).__name__}"
            )
        if given and given[0] != "constraint":
            name = given[0]
            constraint = Constraint(name, getattr(self, name))
            object.__setattr__(self, "constraint", constraint)
            object.__setattr__(self, name, constraint.value)


def _as_tuple(name: str, value: Any) -> tuple:
    if isinstance(value, str | bytes) or not isinstance(value, tuple | list):
        raise ValueError(f"{name} must be a list or tuple, got {show_value(value)}")
    return tuple(value)


class MethodOptions:
    """The base of every method's own options: a frozen, slotted dataclass that lives beside
    the method's drafter and is registered with it (``drafters.registry``). It is validated
    on construction, every error naming its field; a structured value (a tree, a shortlist) is
    a typed value with ``parse(text)`` and ``__str__``, parsed once where text comes in."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class NoOptions(MethodOptions):
    """The options of a method that takes none (plain decoding)."""


@dataclass(frozen=True, slots=True)
class SpecConfig:
    """How to speculate.

    method: which drafter proposes tokens: a built-in ``Method`` or the name of a registered
        one (``drafters.registry``; an unknown name fails where the spec is built into a
        drafter, listing the methods there are).
    num_speculative_tokens: draft tokens per verify step (k), 1..64 (0 is not a k: use method
        ``ar``); ignored by ``ar`` and by methods that draft a tree.
    acceptance: the acceptance rule (``AcceptRule``); rejection sampling is the default.
    disable_by_batch_size: the batch policy of the serving engine: with more requests than
        this decoding at once, a step verifies no draft (plain decoding, the drafter still
        follows along), since a batch already fills the target's pass that a draft would fill;
        None always drafts. The default was measured (``benchmarks/engine_batch.py``).
        Output stays exact either way. A seeded request's tokens depend on which steps
        drafted only with a sampling drafter (draft_model): its draws include the draft's.
    adaptive_k: size each step's draft by expected goodput (``engine.goodput``), on by
        default: a chain's k up to ``num_speculative_tokens``, a tree's best nodes, or no draft
        while plain decoding is faster, from the running requests' acceptance and the
        drafter's and this host's verify costs (measured at load). Never changes what is
        generated; steps of seeded sampled requests keep the whole draft (reproducible).
    options: the method's own options (``MethodOptions``: ``EagleOptions``, ``MedusaOptions``,
        ...), None for the method's defaults. ``drafters.registry.make_spec`` builds a spec
        from flat fields as the command line and JSON configs give them (``tree="6,4,10"``).
    """

    method: str = "draft_model"
    num_speculative_tokens: int = 4
    acceptance: AcceptRule = AcceptRule.REJECTION_SAMPLING
    disable_by_batch_size: int | None = DEFAULT_DISABLE_BY_BATCH_SIZE
    options: MethodOptions | None = None
    adaptive_k: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.adaptive_k, bool):
            raise ValueError(f"adaptive_k must be true or false, got {show_value(self.adaptive_k)}")
        if isinstance(self.method, Method):
            pass
        elif not isinstance(self.method, str) or not self.method.replace("_", "").isalnum():
            raise ValueError(
                f"method must be a method's name (letters, digits and _), got "
                f"{show_value(self.method)}"
            )
        elif self.method in {m.value for m in Method}:
            object.__setattr__(self, "method", Method(self.method))
        object.__setattr__(self, "acceptance", accept_rule(self.acceptance))
        check_range(
            "num_speculative_tokens",
            self.num_speculative_tokens,
            1,
            MAX_SPECULATIVE_TOKENS,
            integer=True,
        )
        check_batch_policy(self.disable_by_batch_size)
        if self.options is not None and not isinstance(self.options, MethodOptions):
            raise ValueError(
                f"options must be a method's options (such as EagleOptions), got "
                f"{type(self.options).__name__}"
            )

    @property
    def k(self) -> int:
        """Draft tokens per step: 0 for plain autoregressive decoding."""
        return 0 if self.method is Method.AR else self.num_speculative_tokens
