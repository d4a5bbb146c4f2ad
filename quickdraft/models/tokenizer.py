"""A thin adapter that gives any Hugging Face tokenizer the quickdraft ``Tokenizer`` protocol."""

from __future__ import annotations

from typing import Any


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
        return list(self.hf(text, add_special_tokens=True)["input_ids"])

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
        ids = self.hf.apply_chat_template(
            messages, tokenize=True, add_generation_prompt=add_generation_prompt
        )
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)

    def same_vocabulary(self, other: HFTokenizer) -> bool:
        return len(self) == len(other) and self.hf.get_vocab() == other.hf.get_vocab()
