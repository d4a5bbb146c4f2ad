"""A thin adapter that gives any Hugging Face tokenizer the quickdraft ``Tokenizer`` protocol."""

from __future__ import annotations

from typing import Any


def valid_text(name: str, text: str) -> str:
    """``text`` if it is a str that encodes as UTF-8 (bytes undecodable from the command line
    arrive as lone surrogates), else ValueError naming the field."""
    if not isinstance(text, str):
        raise ValueError(f"{name} must be text, got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(
            f"{name}: not valid UTF-8 text (byte {error.start} of the input)"
        ) from None
    return text


class HFTokenizer:
    """encode/decode as quickdraft uses them, plus what the CLI and drafters need."""

    def __init__(self, tokenizer: Any, eos_token_ids: tuple[int, ...] = ()):
        self.hf = tokenizer
        ids = set(eos_token_ids)
        if tokenizer.eos_token_id is not None:
            ids.add(int(tokenizer.eos_token_id))
        self.eos_token_ids = tuple(sorted(ids))

    def __len__(self) -> int:
        return len(self.hf)

    def encode(self, text: str) -> list[int]:
        return list(self.hf(valid_text("prompt", text), add_special_tokens=True)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        return self.hf.decode(ids, skip_special_tokens=True)

    @property
    def has_chat_template(self) -> bool:
        return getattr(self.hf, "chat_template", None) is not None

    def apply_chat(
        self, messages: str | list[dict[str, str]], add_generation_prompt: bool = True
    ) -> list[int]:
        """Token ids of a chat (one user message, or role/content dicts), ready for the
        assistant's reply unless ``add_generation_prompt`` is False (a finished chat)."""
        if not self.has_chat_template:
            raise ValueError("chat: this tokenizer has no chat template")
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        for message in messages:
            valid_text("messages", message.get("content", ""))
        ids = self.hf.apply_chat_template(
            messages, tokenize=True, add_generation_prompt=add_generation_prompt
        )
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)

    def same_vocabulary(self, other: HFTokenizer) -> bool:
        return len(self) == len(other) and self.hf.get_vocab() == other.hf.get_vocab()


def same_vocabulary(a: Any, b: Any) -> bool:
    """Whether two tokenizers map text to the same ids (padded model vocabularies may differ);
    False when that cannot be told (tokenizers other than Hugging Face ones)."""
    if a is b:
        return True
    if isinstance(a, HFTokenizer) and isinstance(b, HFTokenizer):
        return a.same_vocabulary(b)
    return False
