"""The Drafter protocol: one fixed signature for every way of proposing tokens."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch

from quickdraft.accept import Verdict
from quickdraft.config import SamplingParams


@dataclass(slots=True)
class DecodeState:
    """What the engine knows between steps; drafters read it and never write it.

    tokens:   [B, capacity] long, prompt then generated tokens; row b is valid up to lengths[b].
    lengths:  [B] long. The last valid token of each row is "pending": known (the last prompt
              token, or sampled) but not yet fed to the target, whose cache holds lengths - 1
              entries.
    prompt_length: tokens of the prompt (equal for all rows).
    sampling: the target's sampling parameters.
    generator: the one source of randomness of the run.
    target_hidden: [B, D], the target's final hidden state at the token before the pending one
              (the state its pending token was predicted from), for drafters that read the
              target's features (Medusa, EAGLE); None before any target pass has seen that
              token (a one-token prompt).
    fresh_hidden: [B, M, D], the target's final hidden states at the tokens its last pass
              kept, in order: row b's first fresh_count[b] are the tokens at positions
              lengths - 1 - fresh_count .. lengths - 2 (after the prefill, the whole prompt
              but its last token; after a verify, the old pending token and the accepted
              drafts); the rest is padding. For drafters that keep a cache of the target's
              features (EAGLE). None when no target pass has run.
    fresh_taps: the same positions of the target's tapped layers ({layer: [B, M, D]}), for
              drafters that declare ``target_taps``.
    fresh_count: [B] long.
    side_logits: [B, E, V], the target's logits at the last draft's side branch
              (``SideBranch``), set before ``observe``; None when it had none.
    """

    tokens: torch.Tensor
    lengths: torch.Tensor
    prompt_length: int
    sampling: SamplingParams
    generator: torch.Generator
    target_hidden: torch.Tensor | None = None
    fresh_hidden: torch.Tensor | None = None
    fresh_taps: dict[int, torch.Tensor] = field(default_factory=dict)
    fresh_count: torch.Tensor | None = None
    side_logits: torch.Tensor | None = None

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    @property
    def capacity(self) -> int:
        return self.tokens.shape[1]


@dataclass(frozen=True, slots=True)
class SideBranch:
    """Tokens the target runs in the verify pass beside the draft, for the drafter's own use
    (lookahead decoding's Jacobi branch). They are never accepted, nothing of the draft sees
    them, and their cache entries are dropped; the target's logits at them come back in
    ``DecodeState.side_logits``.

    tokens:  [B, E] long.
    offsets: [E] long, position offsets from the pending token.
    mask:    [E, E] bool, which side tokens each one attends to (itself included); every side
             token also sees the committed prefix and the pending token, never draft nodes.
    """

    tokens: torch.Tensor
    offsets: torch.Tensor
    mask: torch.Tensor


@dataclass(frozen=True, slots=True)
class Draft:
    """A proposal, batched over rows (the DESIGN contract with a leading batch dimension).

    tokens:  [B, N] long.
    parents: [N] long, the parent node of each node, -1 for children of the pending token;
             a chain has parents -1, 0, 1, .., N-2. The tree shape is shared by the batch.
    probs:   [B, N, V] float, the distribution each token was drawn from, or None when the
             drafter is deterministic (the acceptance rules then treat it as a point mass).
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    probs: torch.Tensor | None
    side: SideBranch | None = None

    @staticmethod
    def chain(tokens: torch.Tensor, probs: torch.Tensor | None) -> Draft:
        parents = torch.arange(-1, tokens.shape[1] - 1, device=tokens.device)
        return Draft(tokens, parents, probs)

    @property
    def is_chain(self) -> bool:
        expected = torch.arange(-1, self.tokens.shape[1] - 1, device=self.parents.device)
        return bool(torch.equal(self.parents, expected))


class Drafter(Protocol):
    """Proposes tokens for the target to verify.

    begin(state):          once, after the target's prefill, before the first propose().
    propose(state):        a Draft of this step's candidates.
    observe(state, verdict): after verification; drafters that learn online update here.

    A drafter that reads intermediate layers of the target declares them as ``target_taps``
    (a tuple of decoder layer indices, whose outputs arrive in ``DecodeState.fresh_taps``);
    one that sends a side branch (``SideBranch``) declares its largest size as
    ``side_tokens``, so the target's cache has room for it.
    """

    vocab_size: int
    num_tokens: int

    def begin(self, state: DecodeState) -> None: ...

    def propose(self, state: DecodeState) -> Draft: ...

    def observe(self, state: DecodeState, verdict: Verdict) -> None: ...


def shipped_folder(
    artifacts: Path, target_name: str | None, folder: str | Path | None, option: str, what: str
) -> Path:
    """The explicit ``folder``, else the one shipped for ``target_name`` under ``artifacts``;
    a ValueError naming ``option`` when neither exists. ``what``: the artifact's name and the
    command that trains it, for the message (``"Medusa heads", "medusa"``)."""
    if folder is not None:
        return Path(folder)
    shipped = artifacts / target_name if target_name else None
    if shipped is not None and shipped.parent == artifacts and shipped.is_dir():
        return shipped
    names = sorted(p.name for p in artifacts.iterdir() if p.is_dir()) if artifacts.is_dir() else []
    name, command = what.split(", ")
    raise ValueError(
        f"{option}: no {name} ship for target {target_name!r} (shipped: "
        f"{', '.join(names) or 'none'}); train them with 'quickdraft train {command}' and "
        "pass the folder"
    )
