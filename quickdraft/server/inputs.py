"""A request's body and prompts as the server reads them: the body within its byte limit, and
each prompt's token ids (a chat's through the template; a completion may send several)."""

from __future__ import annotations

from fastapi import Request

from quickdraft.models.tokenizer import HFTokenizer
from quickdraft.server.protocol import ApiError, ChatRequest, CompletionRequest


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused with 413 past ``limit`` bytes (read no further)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(
            413, f"body: {declared} bytes, more than the {limit} this server takes", "body"
        )
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"body: more than the {limit} bytes this server takes", "body")
        chunks.append(chunk)
    return b"".join(chunks)


def prompt_count(req: CompletionRequest | ChatRequest) -> int:
    if isinstance(req, ChatRequest):
        return 1
    prompt = req.prompt
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
        return 1
    return len(prompt)


def prompt_ids(req: CompletionRequest | ChatRequest, tokenizer: HFTokenizer) -> list[list[int]]:
    """The token ids of each prompt (one for chat; a completion may send several)."""
    if isinstance(req, ChatRequest):
        try:
            return [tokenizer.apply_chat([m.as_template_input() for m in req.messages])]
        except Exception as error:  # no template, or one that rejects these roles
            raise ApiError(400, f"messages: {error}", "messages") from None
    prompt = req.prompt
    if isinstance(prompt, str):
        prompts: list = [prompt]
    elif prompt and isinstance(prompt[0], int):
        prompts = [prompt]
    else:
        prompts = list(prompt)
    if not prompts:
        raise ApiError(400, "prompt: give at least one prompt", "prompt")
    out = []
    for item in prompts:
        try:
            ids = tokenizer.encode(item) if isinstance(item, str) else list(item)
        except ValueError as error:  # text that is not valid UTF-8 (a lone surrogate)
            raise ApiError(400, str(error), "prompt") from None
        if not ids:
            raise ApiError(400, "prompt: an empty prompt (no tokens)", "prompt")
        out.append(ids)
    return out
