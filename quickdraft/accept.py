"""Acceptance rules: how the target judges a chain of draft tokens in one verify step.

Glossary
--------
draft token        d_i, the i-th token the drafter proposed (i = 1..k).
draft probability  p_i(x), the drafter's distribution at position i, after the same temperature,
                   top-k and top-p as the target. A deterministic drafter (n-gram lookup, argmax)
                   has no such distribution: it counts as a point mass p_i = onehot(d_i).
target probability q_i(x), the target's distribution at position i, computed for all k+1
                   positions in one forward over [last token, d_1 .. d_k].
accepted           d_i is kept; every draft token before it was kept too.
rejected           the first d_j that is not kept; d_j and every later draft token are discarded.
corrected token    the token sampled in place of a rejected d_j, from the residual distribution
                   norm(max(0, q_j - p_j)).
bonus token        when all k draft tokens are accepted, one more token drawn from q_{k+1}: the
                   verify pass computed it for free.
accepted length    the tokens a verify step adds to the output: accepted drafts + 1 (the corrected
                   or bonus token). Between 1 and k+1; the tau of the EAGLE and Medusa papers.

Every rule is a pure function of tensors and a ``torch.Generator``, with one signature
(:data:`AcceptFn`), batched over rows B, and looked up once in :data:`ACCEPT_RULES`.
The building blocks (:func:`accepted_count`, :func:`residual_distribution`,
:func:`sample_next`) are public so that the conformance tests can assemble deliberately broken
rules from them and prove the statistical test catches each.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from quickdraft.config import AcceptRule
from quickdraft.sampling import sample


@dataclass(frozen=True, slots=True)
class Verdict:
    """What one verify step decided, per row.

    num_accepted: [B] long, accepted draft tokens, 0..k.
    next_token:   [B] long, the corrected token (num_accepted < k) or the bonus token (== k).
    """

    num_accepted: torch.Tensor
    next_token: torch.Tensor


AcceptFn = Callable[
    [torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Generator | None], Verdict
]
"""(draft_tokens [B, k], draft_probs [B, k, V] | None, target_probs [B, k+1, V], generator)."""


def point_mass(draft_tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The draft distribution of a deterministic drafter. draft_tokens: [B, k] -> [B, k, V]."""
    probs = torch.zeros(*draft_tokens.shape, vocab_size, dtype=torch.float32)
    return probs.to(draft_tokens.device).scatter_(-1, draft_tokens.unsqueeze(-1), 1.0)


def accepted_count(accepted: torch.Tensor) -> torch.Tensor:
    """Length of the all-true prefix of each row. accepted: [B, k] bool -> [B] long."""
    return accepted.long().cumprod(dim=-1).sum(dim=-1)


def residual_distribution(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """norm(max(0, q - p)), the distribution of the corrected token (Leviathan et al., 2023).

    target_probs, draft_probs: [B, k, V]. Returns [B, k, V].
    Where q == p the residual is all zero, but then rejection has probability zero; such rows fall
    back to q so that the result is always a distribution and never NaN.
    """
    residual = (target_probs - draft_probs).clamp_min(0.0)
    mass = residual.sum(dim=-1, keepdim=True)
    return torch.where(
        mass > 0, residual / mass.clamp_min(torch.finfo(mass.dtype).tiny), target_probs
    )


def sample_next(
    candidates: torch.Tensor, num_accepted: torch.Tensor, generator: torch.Generator | None
) -> torch.Tensor:
    """Sample each row's next token from candidates[b, num_accepted[b]].

    candidates: [B, k+1, V]: the corrected-token distributions at positions 1..k, then the bonus
    distribution. num_accepted: [B]. Returns [B] long.
    """
    index = num_accepted.view(-1, 1, 1).expand(-1, 1, candidates.shape[-1])
    return sample(candidates.gather(1, index).squeeze(1), generator)


def rejection_sampling(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator | None,
) -> Verdict:
    """Speculative sampling (Leviathan et al., 2023; Chen et al., 2023). Lossless.

    draft_tokens: [B, k] long; draft_probs: [B, k, V] or None for a deterministic drafter;
    target_probs: [B, k+1, V]. Accept d_i with probability min(1, q_i(d_i) / p_i(d_i)), decided
    as u * p_i(d_i) < q_i(d_i) with u ~ U[0, 1): no division, and a token the target gives
    probability 0 (outside its top-k or top-p, say) is never accepted. At the first rejection,
    sample the residual; if none, sample the bonus token from q_{k+1}.
    """
    batch, k = draft_tokens.shape
    if draft_probs is None:
        draft_probs = point_mass(draft_tokens, target_probs.shape[-1])
    index = draft_tokens.unsqueeze(-1)
    p = draft_probs.gather(-1, index).squeeze(-1)  # [B, k]
    q = target_probs[:, :k].gather(-1, index).squeeze(-1)  # [B, k]
    u = torch.rand(batch, k, generator=generator, device=p.device)
    num_accepted = accepted_count(u * p < q)
    candidates = torch.cat(
        [residual_distribution(target_probs[:, :k], draft_probs), target_probs[:, k:]], dim=1
    )
    return Verdict(num_accepted, sample_next(candidates, num_accepted, generator))


def greedy(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator | None,
) -> Verdict:
    """Greedy acceptance (token matching). Lossless.

    draft_tokens: [B, k]; draft_probs: ignored; target_probs: [B, k+1, V]. The target picks its
    own token at every position (its argmax at temperature 0, where q is one-hot; its sample
    otherwise) and the draft is accepted up to the first disagreement; the target's token there
    is the corrected or bonus token. The output is the target's own samples, so the rule is exact
    for any drafter, but at temperature > 0 it accepts with probability sum_x p(x) q(x) instead
    of sum_x min(p(x), q(x)): prefer rejection sampling whenever the drafter has probabilities.
    """
    k = draft_tokens.shape[1]
    choice = sample(target_probs, generator)  # [B, k+1]
    num_accepted = accepted_count(draft_tokens == choice[:, :k])
    return Verdict(num_accepted, choice.gather(1, num_accepted.unsqueeze(1)).squeeze(1))


ACCEPT_RULES: dict[AcceptRule, AcceptFn] = {
    AcceptRule.REJECTION_SAMPLING: rejection_sampling,
    AcceptRule.GREEDY: greedy,
}
