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
    if kind == "regex" and _lone_backslash(value):  # llguidance would drop it silently
        raise ValueError("regex: ends with a lone backslash (escape it as \\\\ to match one)")
    return value


def _lone_backslash(pattern: str) -> bool:
    """Whether ``pattern`` ends in an odd run of backslashes: an escape with nothing after."""
    return (len(pattern) - len(pattern.rstrip("\\"))) % 2 == 1


def _compile(kind: str, value: Any) -> str:
    import llguidance

    matcher = llguidance.LLMatcher
    try:
        if kind in ("json_schema", "json_object"):
            grammar = matcher.grammar_from_json_schema(value or '{"type": "object"}')
        elif kind == "regex":
            grammar = matcher.grammar_from_regex(value)
        elif kind == "choice":  # one lexeme: an Earley row per option stops at 2,000 options
            grammar = matcher.grammar_from_lark(
                "start: CHOICE\nCHOICE: " + " | ".join(json.dumps(option) for option in value)
            )
        else:
            from llguidance.gbnf_to_lark import any_to_lark  # GBNF converted, Lark kept

            grammar = matcher.grammar_from_lark(any_to_lark(value))
    except BaseException as error:  # the library's parse errors, and its Rust panics
        if not isinstance(error, Exception) and not is_panic(error):
            raise  # KeyboardInterrupt, SystemExit
        raise ValueError(f"{kind}: {error_line(error)}") from None
    problem = matcher.validate_grammar(grammar)
    if problem:
        raise ValueError(f"{kind}: {error_line(problem)}")
    return grammar


def is_panic(error: BaseException) -> bool:
    """A Rust panic inside llguidance (pyo3's PanicException, a BaseException)."""
    return type(error).__name__ == "PanicException"


def error_line(error: object) -> str:
    """The library's error as one short line; a panic (its text is the library's own source
    location and internals) as a plain sentence."""
    text = str(error)
    if (isinstance(error, BaseException) and is_panic(error)) or "panicked at" in text:
        return "the grammar library failed on it (an internal error); simplify it"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return " ".join(lines[:3])[:300] if lines else repr(error)
