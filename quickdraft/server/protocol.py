"""The OpenAI request shapes the server takes, checked field by field, and the error body it
answers with: ``{"error": {"message", "type", "param", "code"}}`` naming the field.

Parsing is strict (a string is not a number, a bool is not an int); fields the server does not
know are ignored, as OpenAI's own clients send some; fields that would change the output
distribution and are not implemented (penalties, logit bias, echo, tools) are refused rather
than ignored, since ignoring them would return text the caller did not ask for.
"""

from __future__ import annotations

import json
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from quickdraft.config import SamplingParams, show_value
from quickdraft.constraints import Constraint

MAX_N = 16  # choices a request may ask for: each is a request in the engine


class ApiError(Exception):
    """An HTTP error with OpenAI's body. ``param`` names the offending field."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        *,
        kind: str = "invalid_request_error",
        code: str | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = (
            status,
            message,
            param,
            kind,
            code,
        )

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }


class _Strict(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class StreamOptions(_Strict):
    include_usage: bool = False


class QuickdraftOptions(_Strict):
    """The request's ``quickdraft`` object (an extension): ``method``, a method of the
    registry to run this request with instead of the served one (``GET /v1/methods`` lists
    those this server can run); ``steps``, every verify step's draft and verdict in the
    response (streamed: with each chunk). Unknown keys are refused, unlike the top level's:
    nobody else sends this object, so an unknown key is a typo."""

    model_config = ConfigDict(extra="forbid")  # merged with _Strict's: strict too
    method: str | None = None
    steps: bool | None = None  # null means the default, as everywhere in a request


class _Common(_Strict):
    """Fields both endpoints share."""

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # an extension (vLLM's): 0 or -1 turn it off
    seed: int | None = None
    stop: str | list[str] | None = None
    # OpenAI's clients may send null for any optional field: null means the default.
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    n: int | None = Field(None, ge=1, le=MAX_N)
    user: str | None = None
    # Extensions (vLLM's names): generate past EOS; return the token ids beside the text.
    ignore_eos: bool | None = None
    return_token_ids: bool | None = None
    quickdraft: QuickdraftOptions | None = None
    # Structured outputs, vLLM's request extensions: the older guided_* fields and the newer
    # structured_outputs object ({"json": ..., "regex": ..., "choice": ..., "grammar": ...}).
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    structured_outputs: dict[str, Any] | None = None
    # Would change the distribution: accepted only at their no-op values.
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None

    @property
    def choices_per_prompt(self) -> int:
        return 1 if self.n is None else self.n

    @property
    def method(self) -> str | None:
        return None if self.quickdraft is None else self.quickdraft.method

    @property
    def steps(self) -> bool:
        return self.quickdraft is not None and bool(self.quickdraft.steps)


class CompletionRequest(_Common):
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = None
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = None


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def as_template_input(self) -> dict[str, str]:
        content = self.content
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        role = "system" if self.role == "developer" else self.role
        return {"role": role, "content": content or ""}


class ChatRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    response_format: dict[str, Any] | None = None


def read_json(body: bytes) -> dict[str, Any]:
    """The request body as a JSON object, else a 400 saying what is wrong with it."""
    try:
        data = json.loads(body)
    except ValueError as error:  # not UTF-8, not JSON, or an integer of over 4,300 digits
        raise ApiError(400, f"body: not valid JSON ({error})", "body") from None
    except RecursionError:
        raise ApiError(400, "body: JSON nested too deeply", "body") from None
    if not isinstance(data, dict):
        raise ApiError(400, f"body must be a JSON object, got {type(data).__name__}", "body")
    return data


_Request = TypeVar("_Request", bound=_Strict)
_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}


def parse(kind: type[_Request], data: dict[str, Any]) -> _Request:
    """``kind`` from the JSON object, or a 400 naming the first bad field (``messages.0.role``)."""
    try:
        return kind.model_validate(data)
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        parts = [
            str(p)
            for p in first["loc"]
            if isinstance(p, int)
            or (p.isidentifier() and p not in _TYPE_TAGS and not p.startswith("function"))
        ]
        param = ".".join(parts) or "body"
        given = first.get("input")
        detail = first["msg"]
        if first["type"] != "missing":
            detail += f", got {show_value(given)} ({type(given).__name__})"
        raise ApiError(400, f"{param}: {detail}", param) from None
    except RecursionError:
        raise ApiError(400, "body: JSON nested too deeply", "body") from None


def refuse_unsupported(request: _Common) -> None:
    """Fields that would change the output, accepted only at their no-op values."""
    refused: list[tuple[str, bool]] = [
        ("presence_penalty", request.presence_penalty not in (None, 0)),
        ("frequency_penalty", request.frequency_penalty not in (None, 0)),
        ("logit_bias", bool(request.logit_bias)),
    ]
    if isinstance(request, CompletionRequest):
        refused += [
            ("echo", bool(request.echo)),
            ("suffix", request.suffix is not None),
            ("best_of", request.best_of not in (None, 1, request.choices_per_prompt)),
        ]
    if isinstance(request, ChatRequest):
        refused += [("tools", bool(request.tools))]
    for name, present in refused:
        if present:
            raise ApiError(400, f"{name} is not supported by this server", name)
    if request.stream_options is not None and not request.stream:
        raise ApiError(400, "stream_options: only allowed with stream: true", "stream_options")


# vLLM's structured_outputs keys and guided_* fields, by the constraint kind they ask for.
_VLLM_KINDS = {"json": "json_schema", "regex": "regex", "choice": "choice", "grammar": "grammar"}


def structured_output(request: CompletionRequest | ChatRequest) -> tuple[str, str, Any] | None:
    """(field, kind, value) of the request's structured output, from OpenAI's
    ``response_format`` (chat) or vLLM's extensions; None when it asks for none; a 400 naming
    the field for more than one. The schema is always enforced (``strict`` false asks for
    less, and gets it too). ``server.grammar`` compiles it, within bounds."""
    given = _structured_outputs(request)
    return given[0] if given else None


def _structured_outputs(request: CompletionRequest | ChatRequest) -> list[tuple[str, str, Any]]:
    """(field, kind, value) of the structured output the request asks for; a 400 for more
    than one, or for an unknown key of ``structured_outputs``."""
    given: list[tuple[str, str, Any]] = []  # (field, kind, value)
    for key, kind in _VLLM_KINDS.items():
        value = getattr(request, f"guided_{key}")
        if value is not None:
            given.append((f"guided_{key}", kind, value))
    outputs = request.structured_outputs or {}
    for key, value in outputs.items():
        if key not in _VLLM_KINDS:
            known = ", ".join(_VLLM_KINDS)
            raise ApiError(
                400, f"structured_outputs.{key}: not one of {known}", "structured_outputs"
            )
        if value is not None:
            given.append((f"structured_outputs.{key}", _VLLM_KINDS[key], value))
    if isinstance(request, ChatRequest) and request.response_format is not None:
        given += _response_format(request.response_format)
    if len(given) > 1:
        fields = ", ".join(field for field, _, _ in given)
        raise ApiError(400, f"set one structured output, got {fields}", given[1][0])
    return given


def _response_format(response_format: dict[str, Any]) -> list[tuple[str, str, Any]]:
    kind = response_format.get("type", "text")
    if kind == "text":
        return []
    if kind == "json_object":
        return [("response_format", "json_object", None)]
    if kind != "json_schema":
        raise ApiError(
            400,
            "response_format.type must be text, json_object or json_schema, got "
            + show_value(kind),
            "response_format.type",
        )
    spec = response_format.get("json_schema")
    if not isinstance(spec, dict) or "schema" not in spec:
        raise ApiError(
            400,
            'response_format.json_schema: must be an object with the schema under "schema"',
            "response_format.json_schema",
        )
    return [("response_format.json_schema.schema", "json_schema", spec["schema"])]


# Our field names to the API's, for errors SamplingParams raises.
_API_NAMES = {"max_new_tokens": "max_tokens"}


def sampling_for(
    request: CompletionRequest | ChatRequest,
    prompt_tokens: int,
    max_model_len: int,
    choice: int,
    *,
    constraint: Constraint | None = None,
    tenant: str | None = None,
) -> SamplingParams:
    """The request's sampling for one choice: choice i of a seeded request gets seed + i, so
    that n choices differ and each is reproducible. ``max_tokens`` defaults to 16 for
    completions (OpenAI's default) and to the rest of the context for chat. constraint: the
    request's structured output, compiled (``server.grammar``); tenant: its API key's."""
    chat = isinstance(request, ChatRequest)
    limit_name = "max_tokens"
    if chat and request.max_completion_tokens is not None:
        limit_name = "max_completion_tokens"
    max_tokens = request.max_completion_tokens if chat else None
    max_tokens = max_tokens if max_tokens is not None else request.max_tokens
    room = max_model_len - prompt_tokens
    if room < 1:
        raise ApiError(
            400,
            f"prompt: {prompt_tokens} tokens leave no room in the context of {max_model_len}",
            "messages" if chat else "prompt",
        )
    if max_tokens is None:
        max_tokens = room if chat else min(16, room)
    elif max_tokens < 1 or max_tokens > room:
        raise ApiError(
            400,
            f"{limit_name} must be in 1..{room} ({prompt_tokens} prompt tokens, context "
            f"{max_model_len}), got {show_value(max_tokens)}",
            limit_name,
        )
    logprobs: int | None
    if chat:
        if request.top_logprobs is not None and not request.logprobs:
            raise ApiError(400, "top_logprobs needs logprobs: true", "top_logprobs")
        logprobs = (request.top_logprobs or 0) if request.logprobs else None
    else:
        logprobs = request.logprobs
    top_k = request.top_k
    if top_k == -1:
        top_k = 0
    seed = request.seed
    if seed is not None and seed >= 0:
        seed = seed + choice
    stop = request.stop
    try:
        return SamplingParams(
            temperature=1.0 if request.temperature is None else request.temperature,
            top_k=0 if top_k is None else top_k,
            top_p=1.0 if request.top_p is None else request.top_p,
            max_new_tokens=max_tokens,
            seed=seed,
            stop=() if stop is None else ((stop,) if isinstance(stop, str) else tuple(stop)),
            ignore_eos=bool(request.ignore_eos),
            logprobs=logprobs,
            draft_steps=request.steps,
            constraint=constraint,
            tenant=tenant,
        )
    except ValueError as error:
        message = str(error)
        field = message.split()[0].rstrip(":")
        param = _API_NAMES.get(field, field)
        if chat and param == "logprobs":
            param = "top_logprobs"
        if param == "seed" and request.seed is not None and request.seed >= 0:
            limit = 2**63 - 1 - (request.choices_per_prompt - 1)
            message = f"seed must be in 0..{limit} with n = {request.choices_per_prompt}"
        raise ApiError(400, message.replace(field, param, 1), param) from None
