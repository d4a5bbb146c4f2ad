"""``Constraint``: what a structured output must match, checked where it is made.

The grammar library is llguidance (chosen by ``benchmarks/results/grammar_libs.md``: it
compiles a schema 7-20x faster than xgrammar and is one wheel without dependencies, where
xgrammar pulls a GPU compiler; its 13-27 us per mask is under 1% of a CPU decode step even with
a mask per node of a 10-node tree). A constraint compiles to llguidance's grammar text once,
here, without a tokenizer; ``matcher.Grammars`` binds it to a model's tokenizer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

KINDS = ("json_schema", "json_object", "regex", "choice", "grammar")


@dataclass(frozen=True, slots=True)
class Constraint:
    """kind: ``json_schema`` (value: the schema, as JSON text or a dict), ``json_object`` (any
    JSON object; value unused), ``regex`` (a regular expression the whole output matches,
    Rust ``regex`` syntax as vLLM's), ``choice`` (value: the allowed outputs, a list of
    strings) or ``grammar`` (a Lark grammar, or a GBNF one, which llguidance converts).

    ``grammar`` is the llguidance grammar it compiles to. A value the library rejects is a
    ValueError naming the kind as the field (``json_schema: ...``)."""

    kind: str
    value: Any = None
    grammar: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(
                f"constraint: kind must be one of {', '.join(KINDS)}, got {self.kind!r}"
            )
        value = _normalised(self.kind, self.value)
        object.__setattr__(self, "value", value)
        object.__setattr__(self, "grammar", _compile(self.kind, value))

    @classmethod
    def json_schema(cls, schema: str | dict) -> Constraint:
        return cls("json_schema", schema)

    @classmethod
    def json_object(cls) -> Constraint:
        return cls("json_object")

    @classmethod
    def regex(cls, pattern: str) -> Constraint:
        return cls("regex", pattern)

    @classmethod
    def choice(cls, options: list[str] | tuple[str, ...]) -> Constraint:
        return cls("choice", options)

    @classmethod
    def lark(cls, grammar: str) -> Constraint:
        return cls("grammar", grammar)


def _normalised(kind: str, value: Any) -> Any:
    """The value in one canonical, hashable form (equal constraints compile once)."""
    if kind == "json_object":
        return None
    if kind == "json_schema":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as error:
                raise ValueError(
                    f"json_schema: not valid JSON ({error.msg} at {error.pos})"
                ) from None
        if not isinstance(value, dict):
            raise ValueError(f"json_schema: must be a JSON object, got {type(value).__name__}")
        # Key order kept: llguidance emits an object's properties in the schema's order.
        return json.dumps(value)
    if kind == "choice":
        if isinstance(value, str) or not isinstance(value, list | tuple) or not value:
            raise ValueError("choice: must be a non-empty list of strings")
        if not all(isinstance(option, str) and option for option in value):
            raise ValueError("choice: every option must be a non-empty string")
        return tuple(value)
    if not isinstance(value, str) or not value:
        raise ValueError(f"{kind}: must be a non-empty string")
    return value


def _compile(kind: str, value: Any) -> str:
    import llguidance

    matcher = llguidance.LLMatcher
    try:
        if kind in ("json_schema", "json_object"):
            grammar = matcher.grammar_from_json_schema(value or '{"type": "object"}')
        elif kind == "regex":
            grammar = matcher.grammar_from_regex(value)
        elif kind == "choice":
            grammar = matcher.grammar_from_lark(
                "start: " + " | ".join(json.dumps(option) for option in value)
            )
        else:
            from llguidance.gbnf_to_lark import any_to_lark  # GBNF converted, Lark kept

            grammar = matcher.grammar_from_lark(any_to_lark(value))
    except Exception as error:  # the library's own parse errors, as one line
        raise ValueError(f"{kind}: {_first_line(error)}") from None
    problem = matcher.validate_grammar(grammar)
    if problem:
        raise ValueError(f"{kind}: {_first_line(problem)}")
    return grammar


def _first_line(error: object) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return " ".join(lines[:3])[:300] if lines else repr(error)
