"""A constraint bound to a model's tokenizer: which tokens may come next, along a request's
text and along each draft path, with rollback for what a verify rejects."""

from __future__ import annotations

from typing import Any

import torch

from quickdraft.constraints.spec import Constraint, error_line, is_panic

_BITS = torch.arange(32, dtype=torch.int32)
# Tokens a new grammar is walked along before a request may use it: llguidance fails some
# grammars at their first tokens, not at compiling (a counted repetition of a million, an
# Earley row of thousands of alternatives), and such a grammar is refused, not run.
PROBE_TOKENS = 4


class Grammars:
    """A model's tokenizer as llguidance reads it (its index takes 0.3-1.4 s to build, once per
    model), from which each request gets its own ``Matcher``. ``vocab_size``: the model's
    vocabulary, padding included (padding ids are never allowed). A tokenizer that is not a
    Hugging Face one gives its llguidance form itself (``ll_tokenizer()``: the toys')."""

    def __init__(self, tokenizer: Any, vocab_size: int):
        import llguidance.hf

        self.vocab_size = vocab_size
        if hasattr(tokenizer, "ll_tokenizer"):
            self.tokenizer = tokenizer.ll_tokenizer()
        else:
            hf = getattr(tokenizer, "hf", tokenizer)
            self.tokenizer = llguidance.hf.from_tokenizer(hf, n_vocab=vocab_size)

    def matcher(self, constraint: Constraint) -> Matcher:
        """A fresh matcher at the start of the output; ValueError naming the constraint's kind
        when the grammar does not fit this tokenizer, no token can begin the output, or the
        library fails along its first tokens (``PROBE_TOKENS``)."""
        import llguidance

        try:
            # log_level 0: its warnings repeat the error it reports, on stderr
            inner = llguidance.LLMatcher(self.tokenizer, constraint.grammar, log_level=0)
        except BaseException as error:  # a Rust panic is a BaseException
            if not is_panic(error):
                raise
            raise ValueError(f"{constraint.kind}: {error_line(error)}") from None
        if inner.is_error():  # its first line: the rest draws the grammar's text
            raise ValueError(f"{constraint.kind}: {error_line(inner.get_error())}")
        matcher = Matcher(inner, self.vocab_size)
        # llguidance may say so by failing the first mask (NoExtensionBias) or by an empty one.
        if not bool(matcher.allowed().any()) or matcher.error is not None:
            raise ValueError(f"{constraint.kind}: no token of this model can begin the output")
        problem = matcher.copy().probe(PROBE_TOKENS)
        if problem is not None:
            raise ValueError(f"{constraint.kind}: too complex for the grammar library ({problem})")
        return matcher


class Matcher:
    """One request's place in its grammar."""

    def __init__(self, inner: Any, vocab_size: int):
        import llguidance.torch

        self.inner = inner
        self.vocab_size = vocab_size
        self._fill = llguidance.torch.fill_next_token_bitmask
        self._bitmask = llguidance.torch.allocate_token_bitmask(1, vocab_size)

    def copy(self) -> Matcher:
        """An independent matcher at the same place (a compiled grammar, reused)."""
        return Matcher(self.inner.deep_copy(), self.vocab_size)

    def allowed(self) -> torch.Tensor:
        """[V] bool: the tokens the grammar allows next (only the stop token once the output
        is complete; none after an error)."""
        self._fill(self.inner, self._bitmask, 0)
        bits = (self._bitmask[0].unsqueeze(1) >> _BITS) & 1
        return bits.flatten()[: self.vocab_size].bool()

    def advance(self, tokens: list[int]) -> int:
        """Consume ``tokens`` as far as the grammar allows them; how many it took."""
        if not tokens:
            return 0
        return int(self.inner.try_consume_tokens(list(tokens)))

    def probe(self, count: int) -> str | None:
        """Walk up to ``count`` tokens, each the lowest id the grammar allows: the error the
        library fails with on the way, or None. Moves this matcher (walk a copy)."""
        for _ in range(count):
            allowed = self.allowed().nonzero()
            if self.error is not None or allowed.numel() == 0 or self.done:
                break
            self.advance([int(allowed[0])])
        return None if self.error is None else error_line(self.error)

    def rollback(self, count: int) -> None:
        if count:
            self.inner.rollback(count)

    def forced(self) -> list[int]:
        """The tokens the grammar allows as the only continuation from here (a key, a bracket):
        a draft for free."""
        return list(self.inner.compute_ff_tokens())

    def count_forced(self, tokens: list[int]) -> int:
        """Advance along ``tokens`` (a reply), counting those the grammar forced (each the only
        continuation where it came): what forced drafting can give a reply."""
        index = forced = 0
        while index < len(tokens):
            run = self.forced()
            n = 0
            while n < len(run) and index + n < len(tokens) and tokens[index + n] == run[n]:
                n += 1
            step = max(n, 1)
            if self.advance(tokens[index : index + step]) < step:
                break  # past the grammar (a stop token): nothing more is forced
            forced, index = forced + n, index + step
        return forced

    def path_masks(self, tokens: list[int]) -> torch.Tensor:
        """[len(tokens) + 1, V] bool: the allowed tokens before each token of a draft path and
        after its last. Past a token the grammar refuses, nothing is allowed (the verify
        rejects that token, so what follows is never used). The matcher ends where it began."""
        masks = torch.zeros(len(tokens) + 1, self.vocab_size, dtype=torch.bool)
        taken = 0
        for i, token in enumerate(tokens):
            masks[i] = self.allowed()
            if not bool(masks[i, token]) or self.advance([token]) != 1:
                break
            taken += 1
        else:
            masks[len(tokens)] = self.allowed()
        self.rollback(taken)
        return masks

    @property
    def error(self) -> str | None:
        """Why the grammar cannot go on, once it cannot (llguidance leaves a matcher in an
        error state, rather than raising, when a grammar exceeds its per-step limits); else
        None. Nothing is allowed after it."""
        if not self.inner.is_error():
            return None
        return str(self.inner.get_error()).strip().splitlines()[0]  # then its state, at length

    @property
    def done(self) -> bool:
        """The output is complete (the grammar stopped)."""
        return bool(self.inner.is_stopped())
