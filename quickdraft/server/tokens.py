"""A token's own bytes and text, for logprobs: what OpenAI's ``token`` and ``bytes`` fields
hold. Decoding one token alone is wrong for two kinds of tokenizer: SentencePiece drops the
leading space its "▁" stands for, and a byte-level token that ends inside a multi-byte
character decodes to U+FFFD. So the bytes are read off the token's piece (byte-level pieces
through GPT-2's byte map, SentencePiece's "▁" and <0xNN> byte tokens), and the text is those
bytes decoded, U+FFFD standing in only for bytes of a character the token does not complete.

Both are cached per token id: a response with top_logprobs asks for tens of thousands.
"""

from __future__ import annotations

import functools
import re

from quickdraft.models.tokenizer import HFTokenizer

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class TokenTexts:
    def __init__(self, tokenizer: HFTokenizer):
        from transformers.convert_slow_tokenizer import bytes_to_unicode

        self.hf = tokenizer.hf
        self.special = set(self.hf.all_special_ids)
        decoder = self.hf.backend_tokenizer.decoder if self.hf.is_fast else None
        self.byte_level = decoder is not None and "ByteLevel" in repr(decoder)
        self.byte_map = {char: byte for byte, char in bytes_to_unicode().items()}

    @functools.lru_cache(maxsize=1 << 18)  # noqa: B019 (one instance per server)
    def bytes(self, token_id: int) -> bytes:
        piece = self.hf.convert_ids_to_tokens(token_id)
        if piece is None:
            return b""
        if token_id in self.special:
            return piece.encode()
        if self.byte_level and all(char in self.byte_map for char in piece):
            return bytes(self.byte_map[char] for char in piece)
        match = _BYTE_TOKEN.fullmatch(piece)
        if match:
            return bytes([int(match.group(1), 16)])
        return piece.replace("\u2581", " ").encode()

    def text(self, token_id: int) -> str:
        return self.bytes(token_id).decode("utf-8", errors="replace")
