"""Prompts in, token ids out: text through the tokenizer, ids checked once, named on error."""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Integral

import torch

from quickdraft.config import SamplingParams
from quickdraft.models.base import Tokenizer
from quickdraft.models.tokenizer import valid_text


def encode(prompt: str | Sequence[int] | torch.Tensor, tokenizer: Tokenizer | None) -> list[int]:
    """A text (through ``tokenizer``) or one row of token ids, as a list of ids."""
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ValueError("prompt: a text prompt needs a tokenizer")
        return tokenizer.encode(valid_text("prompt", prompt))
    return as_ids(prompt)


def as_ids(prompt: Sequence[int] | torch.Tensor) -> list[int]:
    """One row of integer token ids (a list, an iterator, a 1-D integer tensor)."""
    if isinstance(prompt, torch.Tensor):
        if prompt.dim() != 1:
            raise ValueError(f"prompt must be one row of token ids, got shape {prompt.shape}")
        if prompt.dtype.is_floating_point or prompt.dtype == torch.bool:
            raise ValueError(f"prompt: token ids must be integers, got {prompt.dtype}")
        return prompt.tolist()
    if isinstance(prompt, str | bytes):
        raise ValueError("prompt: token ids must be integers, got text")
    try:
        ids = list(prompt)  # an iterator is read once, here
    except TypeError:
        raise ValueError(f"prompt must be a text or a list of token ids, got {prompt!r}") from None
    if not all(isinstance(t, Integral) and not isinstance(t, bool) for t in ids):
        raise ValueError("prompt: token ids must be integers (one row of them)")
    ids = [int(t) for t in ids]
    if any(abs(t) >= 2**63 for t in ids):
        raise ValueError("prompt: token ids must be integers below 2**63")
    return ids


def token_ids(prompt: Sequence[int] | torch.Tensor, vocab_size: int) -> list[int]:
    """``as_ids``, non-empty and inside the vocabulary."""
    ids = as_ids(prompt)
    if not ids:
        raise ValueError("prompt: empty prompt; give at least one token")
    if min(ids) < 0 or max(ids) >= vocab_size:
        raise ValueError(f"prompt: token ids must lie in [0, {vocab_size})")
    return ids


def check_request(
    prompt_ids: Sequence[int] | torch.Tensor,
    sampling: SamplingParams,
    vocab_size: int,
    max_model_len: int,
    tokenizer: Tokenizer | None,
) -> list[int]:
    """The prompt's token ids if an engine of ``max_model_len`` can take the request, else
    ValueError naming the field."""
    prompt = token_ids(prompt_ids, vocab_size)
    needed = len(prompt) + sampling.max_new_tokens
    if needed > max_model_len:
        raise ValueError(
            f"prompt: {len(prompt)} prompt tokens + max_new_tokens "
            f"{sampling.max_new_tokens} exceed the engine's max_model_len of {max_model_len}"
        )
    if sampling.stop and tokenizer is None:
        raise ValueError("stop: stop strings need a tokenizer")
    return prompt
