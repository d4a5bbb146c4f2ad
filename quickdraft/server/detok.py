"""Streaming text for a growing list of token ids: pieces that never change once sent.

Two things can change text already decoded: a token that ends inside a multi-byte character
(it decodes to U+FFFD until the next one completes it), and a stop string that a later token
completes (the text is cut before it). The first is held until the character is whole; for the
second, the last ``longest stop - 1`` characters are held until the request finishes, since a
stop string that ends later cannot start earlier than that.

Each step decodes only the tokens since the previous piece and the ones before them (the
window that can merge with them), so a long output costs no more per step than a short one.
"""

from __future__ import annotations

import logging

from quickdraft.models.base import Tokenizer

log = logging.getLogger("quickdraft.server")


class TextStream:
    def __init__(self, tokenizer: Tokenizer, stops: tuple[str, ...] = ()):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.text = ""  # the decoded text of ids[:read]
        self.prefix = 0  # ids[prefix:read] decode to the end of ``text``, as context
        self.read = 0
        self.sent = 0  # characters of ``text`` returned as pieces
        self.hold = max((len(s) for s in stops), default=1) - 1

    def add(self, ids: list[int]) -> str:
        """The new text these tokens make safe to send (possibly empty)."""
        self.ids += ids
        decode = self.tokenizer.decode
        before = decode(self.ids[self.prefix : self.read])
        after = decode(self.ids[self.prefix :])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.text += after[len(before) :]
            self.prefix, self.read = self.read, len(self.ids)
        safe = max(self.sent, len(self.text) - self.hold)
        piece = self.text[self.sent : safe]
        self.sent = safe
        return piece

    def finish(self, final: str) -> str:
        """The rest of ``final``, the finished output's text (cut before a stop string), past
        what was sent. Sent pieces are always a prefix of it (see the module docstring)."""
        if not final.startswith(self.text[: self.sent]):  # a tokenizer that breaks the rule
            log.warning("streamed text is not a prefix of the final text; sending the rest")
        piece = final[self.sent :]
        self.sent = len(final)
        return piece
