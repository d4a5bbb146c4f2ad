"""The method registry: each method's name, its typed options and its builder, and nothing else.

Adding a method is one module (its drafter, its ``MethodOptions`` and a builder) and one
``register`` call. What other parts of quickdraft know of a method they keep in their own
tables, keyed by its name: the bench its label syntax (``bench.labels``), the picker its
candidates and priors (``pick.candidates``), interop its vLLM and SGLang configs
(``interop.launch``). A method missing from those tables still runs there with their generic
defaults.

``make_spec`` is where flat, textual options come in (the command line, JSON configs, the
server): each field goes to the method's options class, which parses it once.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from quickdraft.config import (
    AcceptRule,
    Method,
    MethodOptions,
    NoOptions,
    SpecConfig,
    show_value,
)
from quickdraft.drafters import lookahead, ngram
from quickdraft.drafters.base import BuildContext, Drafter
from quickdraft.drafters.draft_model import drafter as draft_model
from quickdraft.drafters.draft_model.options import DraftModelOptions
from quickdraft.drafters.eagle import build as eagle
from quickdraft.drafters.eagle.options import EagleOptions
from quickdraft.drafters.medusa import drafter as medusa
from quickdraft.drafters.medusa.options import MedusaOptions
from quickdraft.drafters.suffix import drafter as suffix
from quickdraft.drafters.suffix.options import SuffixOptions
from quickdraft.models.base import Model

Builder = Callable[[SpecConfig, BuildContext], Drafter]


@dataclass(frozen=True, slots=True)
class MethodEntry:
    """One method.

    name:        its name in ``SpecConfig.method``, the CLI's --method and bench labels.
    options:     its ``MethodOptions`` class; ``SpecConfig.options`` of this method is one.
    build:       (spec with its options, context) -> the drafter; None for plain decoding.
    description: one line for --help and the docs.
    default_k:   draft tokens per step when none is given.
    draft_model: whether it drafts with a separate draft model (--draft), which the builder
                 then finds in ``BuildContext.draft``.
    sized_by:    for a method whose draft k does not size (a tree, a window), what does: a
                 k given to it is ignored with a warning saying so. Empty: k sizes it.
    """

    name: str
    options: type[MethodOptions]
    build: Builder | None
    description: str
    default_k: int = 4
    draft_model: bool = False
    sized_by: str = ""

    @property
    def drafts(self) -> bool:
        return self.build is not None

    def option_names(self) -> tuple[str, ...]:
        return tuple(field.name for field in dataclasses.fields(self.options))


_REGISTRY: dict[str, MethodEntry] = {}


def register(entry: MethodEntry) -> None:
    """Add a method (replacing one of the same name: a re-run notebook cell, say)."""
    if not entry.name or not entry.name.replace("_", "").isalnum():
        raise ValueError(f"method name must be letters, digits and _, got {entry.name!r}")
    if not (isinstance(entry.options, type) and issubclass(entry.options, MethodOptions)):
        raise ValueError(f"{entry.name}: options must be a MethodOptions dataclass")
    _REGISTRY[entry.name] = entry


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)


def names() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def entries() -> tuple[MethodEntry, ...]:
    return tuple(_REGISTRY.values())


def get(name: Any) -> MethodEntry:
    """The entry of ``name``; a ValueError listing the methods when there is none."""
    entry = _REGISTRY.get(str(name)) if isinstance(name, str) else None
    if entry is None:
        shown = repr(str(name)) if isinstance(name, str) else type(name).__name__
        raise ValueError(f"method must be one of {', '.join(_REGISTRY)}; got {shown}")
    return entry


# -- specs ------------------------------------------------------------------------------------


def options_for(entry: MethodEntry, fields: dict[str, Any]) -> MethodOptions:
    """``entry``'s options from flat fields (text or typed values); a field of another
    method's options is an error naming the methods it belongs to, unless it is at a default
    of a method that takes it (``draft_shortlist="full"`` for ngram), as on the command line."""
    own, defaults = set(entry.option_names()), _defaults()
    fields = {
        name: value
        for name, value in fields.items()
        if name in own or not _at_a_default(value, defaults.get(name, set()))
    }
    check_option_names(entry, fields)
    return entry.options(**fields)


def _at_a_default(value: Any, defaults: set[str]) -> bool:
    try:
        return str(value) in defaults
    except ValueError:  # an integer too long to print is nobody's default
        return False


def _defaults() -> dict[str, set[str]]:
    """Each option's defaults as text, over the methods that take it."""
    defaults: dict[str, set[str]] = {}
    for entry in entries():
        for field in dataclasses.fields(entry.options):
            defaults.setdefault(field.name, set()).add(str(field.default))
    return defaults


def check_option_names(entry: MethodEntry, fields: dict[str, Any]) -> None:
    """Every name in ``fields`` is one of ``entry``'s options; else an error naming the
    methods it belongs to."""
    own = set(entry.option_names())
    for name in fields:
        if name in own:
            continue
        owners = [other.name for other in entries() if name in other.option_names()]
        if not owners:
            raise ValueError(f"{name}: no method has this option")
        which = "method " + owners[0] if len(owners) == 1 else "methods " + " and ".join(owners)
        raise ValueError(f"{name} applies to {which} only")


def given_options(fields: dict[str, Any]) -> dict[str, Any]:
    """The fields a front end really set: those None (unset) are dropped. A command line
    passes each of its flags; one of another method's options at a default is then dropped by
    ``options_for``, and at any other value is an error from ``make_spec``."""
    return {name: value for name, value in fields.items() if value is not None}


def make_spec(
    method: str = Method.DRAFT_MODEL,
    num_speculative_tokens: int | None = None,
    acceptance: AcceptRule | str = AcceptRule.REJECTION_SAMPLING,
    disable_by_batch_size: int | object | None = ...,
    adaptive_k: bool = True,
    **options: Any,
) -> SpecConfig:
    """A spec from flat fields, as the command line, JSON configs and the server give them:
    ``make_spec("eagle", tree="6,4,10,0.1", draft_shortlist="fr:38818")``. Each option goes
    to the method's options class and is parsed there, once; k defaults to the method's."""
    entry = get(method)
    if num_speculative_tokens is not None and entry.sized_by:
        # vLLM's configs give EAGLE a k; here it grows a tree. Ignored, but never silently,
        # and a k that is no k at all is refused as for any method.
        SpecConfig(entry.name, num_speculative_tokens)
        warnings.warn(
            f"num_speculative_tokens: {entry.name} does not draft k tokens a step, so "
            f"{num_speculative_tokens} is ignored ({entry.sized_by})",
            stacklevel=2,
        )
        num_speculative_tokens = None
    given = disable_by_batch_size is not ...
    policy = {"disable_by_batch_size": disable_by_batch_size} if given else {}
    return SpecConfig(
        entry.name,
        entry.default_k if num_speculative_tokens is None else num_speculative_tokens,
        acceptance,  # type: ignore[arg-type]  # SpecConfig checks and converts it
        options=options_for(entry, options),
        adaptive_k=adaptive_k,
        **policy,  # type: ignore[arg-type]
    )


def spec_fields(spec: SpecConfig) -> dict[str, Any]:
    """``spec`` as flat fields that differ from the defaults, structured options as their
    text: the JSON form of ``--speculative-config``; ``make_spec(**spec_fields(s)) == s``."""
    entry, options = resolve(spec)
    data: dict[str, Any] = {"method": entry.name}
    plain = SpecConfig(entry.name, entry.default_k)
    for name in ("num_speculative_tokens", "acceptance", "disable_by_batch_size", "adaptive_k"):
        value = getattr(spec, name)
        if value != getattr(plain, name):
            data[name] = str(value) if isinstance(value, AcceptRule) else value
    defaults = entry.options()
    for field in dataclasses.fields(options):
        value = getattr(options, field.name)
        if value != getattr(defaults, field.name):
            simple = value is None or isinstance(value, bool | int | float | str)
            data[field.name] = value if simple else str(value)
    return data


def with_options(spec: SpecConfig, **fields: Any) -> SpecConfig:
    """``spec`` with some of its method's options changed (``tree="3,1,3"``)."""
    entry, options = resolve(spec)
    check_option_names(entry, fields)
    return dataclasses.replace(spec, options=dataclasses.replace(options, **fields))


def resolve(spec: SpecConfig) -> tuple[MethodEntry, MethodOptions]:
    """The spec's method and its options (the defaults when ``spec.options`` is None); a
    ValueError when the method is unknown or the options are another method's."""
    if not isinstance(spec, SpecConfig):
        raise ValueError(f"spec must be a SpecConfig, got {type(spec).__name__}")
    entry = get(spec.method)
    options = entry.options() if spec.options is None else spec.options
    if not isinstance(options, entry.options):
        raise ValueError(
            f"options: method {entry.name} takes {entry.options.__name__}, got "
            f"{show_value(options)}"
        )
    return entry, options


def check_draft(entry: MethodEntry, given: bool) -> None:
    """A draft model is given exactly when the method drafts with one."""
    if given and not entry.draft_model:
        raise ValueError(
            f"draft: a draft model is used by methods that draft with one "
            f"({', '.join(e.name for e in entries() if e.draft_model)}), not {entry.name}"
        )
    if entry.draft_model and not given:
        raise ValueError(f"draft: method {entry.name} needs a draft model (--draft MODEL)")


def build_drafter(
    spec: SpecConfig,
    target: Model,
    draft: Model | None = None,
    *,
    same_tokenizer: bool | None = None,
    draft_name: str | None = None,
    target_name: str | None = None,
) -> Drafter | None:
    """The drafter for ``spec.method``, or None for plain autoregressive decoding.

    same_tokenizer: whether the draft's tokenizer equals the target's, when the caller knows
    (``models.tokenizer.same_vocabulary``); it lets padded vocabulary sizes differ.
    draft_name: the draft model's alias, which finds the shortlist artifacts shipped for it.
    target_name: the target's alias, which finds the Medusa heads and EAGLE drafter shipped
    for it; None takes the alias the target was loaded from (``Model.name``).
    """
    entry, options = resolve(spec)
    if entry.build is None:  # plain decoding: a draft model given is simply unused
        return None
    check_draft(entry, draft is not None)
    context = BuildContext(
        target,
        draft,
        same_tokenizer,
        draft_name or (draft.name if draft is not None else None),
        target_name or target.name,
    )
    return entry.build(dataclasses.replace(spec, options=options), context)


# -- the built-in methods ---------------------------------------------------------------------

register(
    MethodEntry(
        "ar",
        NoOptions,
        None,
        "plain autoregressive decoding: no drafts, the baseline",
        sized_by="plain decoding drafts nothing",
    )
)
register(
    MethodEntry(
        "draft_model",
        DraftModelOptions,
        draft_model.build,
        "a smaller model of the same tokenizer drafts k tokens (optionally on a shortlist)",
        draft_model=True,
    )
)
register(
    MethodEntry(
        "ngram",
        ngram.NGramOptions,
        ngram.build,
        "prompt lookup: copies what followed the last n tokens earlier in the text",
        default_k=5,
    )
)
register(
    MethodEntry(
        "medusa",
        MedusaOptions,
        medusa.build,
        "Medusa heads on the target draft a tree (trained per target)",
        sized_by="its tree option sizes the draft",
    )
)
register(
    MethodEntry(
        "eagle",
        EagleOptions,
        eagle.build,
        "an EAGLE drafter on the target's features grows a dynamic tree (trained per target)",
        sized_by="its tree option, DEPTH,TOPK,TOKENS, sizes the draft",
    )
)
register(
    MethodEntry(
        "lookahead",
        lookahead.LookaheadOptions,
        lookahead.build,
        "lookahead decoding: Jacobi iteration and an n-gram pool, nothing trained",
        sized_by="lookahead_window and lookahead_ngram size the draft",
    )
)
register(
    MethodEntry(
        "suffix",
        SuffixOptions,
        suffix.build,
        "suffix decoding: frequent continuations of the text and of earlier requests' outputs",
        default_k=8,
    )
)
