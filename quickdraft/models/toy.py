"""Toy language models whose next-token distribution is known exactly.

An :class:`NGramLM` of order n looks up its logits in a table indexed by the previous n-1 tokens
(positions before the start read as a beginning-of-sequence symbol). It implements the
:class:`~quickdraft.models.base.Model` protocol, so the engine, the drafters and the acceptance
rules run on it exactly as on a transformer, batched; and because the table is the whole model,
the distribution of any continuation can be enumerated and compared with what the engine samples.

``perturbed(distance)`` makes a draft model for it: the logits move linearly towards an
independent random table, from identical (0.0) to unrelated (1.0). KL(target || draft) grows
monotonically with the distance (it is convex in it with its minimum at 0).
"""

from __future__ import annotations

import string

import torch

from quickdraft.models.base import Cache, ModelOutput


class TokenCache(Cache):
    """The cache of a toy model: the tokens themselves, which is all an n-gram needs."""

    def __init__(self, batch_size: int, capacity: int):
        super().__init__(batch_size, capacity)
        self.tokens = torch.zeros(batch_size, capacity, dtype=torch.long)
        self._rows = torch.arange(batch_size).unsqueeze(1)  # [B, 1] as in ``KVCache``
        self._gathered = False  # a gathered view: ``tokens`` is the full buffer

    def write(self, tokens: torch.Tensor, positions: torch.Tensor) -> None:
        """tokens, positions: [B, T]."""
        if self._gathered:
            self.tokens[self._rows, positions] = tokens
        else:
            self.tokens.scatter_(1, positions, tokens)

    def read(self, positions: torch.Tensor) -> torch.Tensor:
        """The tokens at ``positions`` [B, S] of each row."""
        if self._gathered:
            return self.tokens[self._rows, positions]
        return self.tokens.gather(1, positions)

    def _narrow_buffers(self, start: int, count: int) -> None:
        self.tokens = self.tokens[start : start + count]
        self._rows = torch.arange(count).unsqueeze(1)

    def _select_buffers(self, index: torch.Tensor) -> None:
        self._rows, self._gathered = index.unsqueeze(1), True

    def _keep_path(self, path: torch.Tensor) -> None:
        source = self.lengths.unsqueeze(1) + path
        target = self.lengths.unsqueeze(1) + torch.arange(path.shape[1])
        self.tokens[self._rows, target] = self.tokens[self._rows, source]


class NGramLM:
    """An n-gram language model with a logit table [(V+1)^(n-1), V]; id V is the BOS symbol."""

    def __init__(
        self,
        table: torch.Tensor,
        order: int,
        *,
        max_positions: int = 1 << 16,
        hidden_size: int = 16,
        seed: int = 0,
    ):
        if order < 1:
            raise ValueError(f"order must be >= 1, got {order}")
        vocab = table.shape[-1]
        if table.shape != ((vocab + 1) ** (order - 1), vocab):
            raise ValueError(
                f"table must have shape [(V+1)^(order-1), V] = "
                f"[{(vocab + 1) ** (order - 1)}, {vocab}], got {list(table.shape)}"
            )
        self.table = table.float()
        self.order = order
        self.vocab_size = vocab
        self.max_positions = max_positions
        self.name: str | None = None
        self.device = torch.device("cpu")
        self.seed = seed
        generator = torch.Generator().manual_seed(seed + 1)
        # Fixed random features per context: the "hidden state" drafters may read.
        self.features = torch.randn(table.shape[0], hidden_size, generator=generator)
        self.powers = (vocab + 1) ** torch.arange(order - 2, -1, -1)  # [n-1], most recent last

    @classmethod
    def random(
        cls, vocab_size: int, order: int, seed: int, sharpness: float = 2.0, **kwargs
    ) -> NGramLM:
        """A table of N(0, sharpness^2) logits drawn from ``seed``: larger is more peaked."""
        if vocab_size < 2:
            raise ValueError(f"vocab_size must be >= 2, got {vocab_size}")
        generator = torch.Generator().manual_seed(seed)
        table = sharpness * torch.randn(
            (vocab_size + 1) ** (order - 1), vocab_size, generator=generator
        )
        return cls(table, order, seed=seed, **kwargs)

    def perturbed(self, distance: float, seed: int = 1) -> NGramLM:
        """A draft model at ``distance`` in [0, 1] from this one (0 = identical)."""
        if not 0.0 <= distance <= 1.0:
            raise ValueError(f"distance must be in [0, 1], got {distance}")
        other = NGramLM.random(
            self.vocab_size,
            self.order,
            seed=self.seed + 1000 + seed,
            sharpness=float(self.table.std()),
        )
        table = (1.0 - distance) * self.table + distance * other.table
        return NGramLM(table, self.order, max_positions=self.max_positions, seed=self.seed)

    def new_cache(self, batch_size: int, capacity: int) -> TokenCache:
        return TokenCache(batch_size, capacity)

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: Cache,
        tree_mask: torch.Tensor | None = None,
    ) -> ModelOutput:
        """tokens, positions: [B, T]. Writes tokens at the slots after each row's length."""
        index = self._context_index(tokens, cache, tree_mask)
        return ModelOutput(logits=self.table[index], hidden=self.features[index])

    def _context_index(
        self, tokens: torch.Tensor, cache: Cache, tree_mask: torch.Tensor | None
    ) -> torch.Tensor:
        """Writes ``tokens`` into the cache; the table row [B, T] of each new position. With a
        tree mask [T, T], a new token's context is the committed prefix, then its ancestors."""
        if not isinstance(cache, TokenCache):
            raise ValueError(f"cache must be a TokenCache, got {type(cache).__name__}")
        batch, num_new = tokens.shape
        slots = cache.slots_for(num_new)  # [B, T]
        cache.write(tokens, slots)
        back = torch.arange(
            self.order - 2, -1, -1
        )  # [n-1]: steps back from the token, oldest first
        if tree_mask is None:
            context_slots = slots.unsqueeze(-1) - back  # [B, T, n-1]
        else:
            if tree_mask.shape != (num_new, num_new):
                raise ValueError(f"tree_mask must be [T, T] = [{num_new}, {num_new}]")
            # The j-th visible new token back from t (t itself at j = 0), else the prefix.
            visible = tree_mask.long()
            count = visible.sum(1)  # [T] ancestors and itself
            order = torch.where(tree_mask, visible.cumsum(1), 0)  # 1.. along the branch
            rank = count.unsqueeze(1) - back  # [T, n-1], 1-based rank in the branch, or <= 0
            match = order.unsqueeze(1) == rank.unsqueeze(2)  # [T, n-1, T]
            new_index = match.long().argmax(2)  # [T, n-1]
            in_branch = rank >= 1
            prefix_offset = rank - 1  # <= -1 reaches into the committed prefix
            lengths = cache.lengths.view(-1, 1, 1)
            context_slots = torch.where(
                in_branch, lengths + new_index, lengths + prefix_offset
            )  # [B, T, n-1]
        context = cache.read(context_slots.clamp_min(0).reshape(batch, -1))
        context = context.view(context_slots.shape)
        context = torch.where(context_slots < 0, self.vocab_size, context)
        return (context * self.powers).sum(-1)  # [B, T]


class ToyTokenizer:
    """Maps token i to the i-th character of an alphabet (letters, then digits, by default),
    so toy runs have readable text; another alphabet (JSON's punctuation, say) lets a toy run
    under a grammar over those characters."""

    alphabet = string.ascii_lowercase + string.ascii_uppercase + string.digits
    eos_token_ids: tuple[int, ...] = ()  # toy text has no end-of-sequence token

    def __init__(self, vocab_size: int, alphabet: str | None = None):
        if alphabet is not None:
            if len(set(alphabet)) != len(alphabet) or not alphabet.isascii():
                raise ValueError(f"alphabet: distinct ASCII characters, got {alphabet!r}")
            self.alphabet = alphabet
        if not 1 <= vocab_size <= len(self.alphabet):
            raise ValueError(f"vocab_size must be in 1..{len(self.alphabet)}, got {vocab_size}")
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list[int]:
        try:
            ids = [self.alphabet.index(ch) for ch in text]
        except ValueError:
            raise ValueError(f"text: characters outside the toy alphabet in {text!r}") from None
        if any(i >= self.vocab_size for i in ids):
            raise ValueError(f"text: {text!r} uses characters past the vocabulary")
        return ids

    def decode(self, ids: list[int]) -> str:
        return "".join(self.alphabet[i] for i in ids)

    def ll_tokenizer(self):
        """The same characters as llguidance reads a tokenizer, for constrained toy runs; the
        last token is its end-of-sequence token (never this tokenizer's: a toy run goes its
        full length), allowed only where a grammar may end."""
        import llguidance

        alphabet = self.alphabet[: self.vocab_size]

        class Source:
            def __init__(self) -> None:
                self.eos_token_id = len(alphabet) - 1
                self.bos_token_id = None
                self.tokens = [c.encode() for c in alphabet]
                self.special_token_ids: list[int] = []

            def __call__(self, text: bytes | str) -> list[int]:
                chars = text if isinstance(text, str) else text.decode("latin-1")
                return [alphabet.index(c) for c in chars if c in alphabet]

        return llguidance.LLTokenizer(llguidance.TokenizerWrapper(Source()))


class HeadedNGramLM(NGramLM):
    """An n-gram LM written as a body and a linear head: the body's hidden state is the one-hot
    code of the context, the head's weight [V, contexts] is the transposed logit table, so
    hidden @ weight.T gives exactly the table's logits. Head-level mechanisms (vocabulary
    shortlists) thus run on a toy whose distribution stays exactly computable."""

    int8 = False

    def __init__(self, table: torch.Tensor, order: int, **kwargs):
        super().__init__(table, order, **kwargs)
        self.head_weight = self.table.T.contiguous()  # [V, contexts]
        generator = torch.Generator().manual_seed(self.seed + 2)
        self.embed = torch.randn(self.vocab_size, self.table.shape[0], generator=generator)

    @classmethod
    def from_ngram(cls, model: NGramLM) -> HeadedNGramLM:
        return cls(model.table, model.order, max_positions=model.max_positions, seed=model.seed)

    def body(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: Cache,
        tree_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        index = self._context_index(tokens, cache, tree_mask)
        hidden = torch.nn.functional.one_hot(index, self.table.shape[0]).float()
        return hidden, {}

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden @ self.table

    def with_taps(self, layers: tuple[int, ...]) -> HeadedNGramLM:
        if layers:
            raise ValueError("tap_layers: an n-gram model has no layers to tap")
        return self

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: Cache,
        tree_mask: torch.Tensor | None = None,
    ) -> ModelOutput:
        hidden, _ = self.body(tokens, positions, cache, tree_mask)
        return ModelOutput(logits=self.head(hidden), hidden=hidden)
