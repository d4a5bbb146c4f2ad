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
from quickdraft.tree import TreeShape


@dataclass(frozen=True, slots=True)
class Verdict:
    """What one verify step decided, per row.

    num_accepted: [B] long, accepted draft tokens, 0..k (for a tree: the accepted path's length).
    next_token:   [B] long, the corrected token (num_accepted < k) or the bonus token (== k).
    path:         [B, D] long, tree rules only: the accepted nodes root first, -1 past
                  num_accepted; None for a chain, whose accepted nodes are 0..num_accepted-1.
    """

    num_accepted: torch.Tensor
    next_token: torch.Tensor
    path: torch.Tensor | None = None


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

    A deterministic drafter's point masses go to :func:`greedy`: accepting d_i with
    probability q_i(d_i), else sampling q_i without d_i, is the same as drawing the target's
    own token and comparing, in distribution and in acceptance. The walk spends one draw per
    token it emits, so a seeded request's tokens never depend on what was drafted.
    """
    if draft_probs is None:
        return greedy(draft_tokens, None, target_probs, generator)
    batch, k = draft_tokens.shape
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
    It is the tree walk (:func:`tree_greedy`) over a chain: the target draws its tokens one
    position at a time, only as far as the walk goes.
    """
    shape = TreeShape.chain(draft_tokens.shape[1])
    verdict = tree_greedy(draft_tokens, shape, None, target_probs, generator)
    return Verdict(verdict.num_accepted, verdict.next_token)


# -- trees -------------------------------------------------------------------------------
#
# A tree draft offers several candidates after a node: its children, tried in rank order. The
# target's distribution q at every node comes from one verify pass with a tree mask
# (``tree.TreeShape``): target_probs[:, 0] at the root (the pending token), [:, i + 1] at node i.

TreeAcceptFn = Callable[
    [torch.Tensor, TreeShape, torch.Tensor | None, torch.Tensor, torch.Generator | None], Verdict
]
"""(draft_tokens [B, N], shape, draft_probs [B, N, V] | None, target_probs [B, N+1, V],
generator) -> Verdict with ``path``."""

# Medusa-2's typical acceptance (Cai et al. 2024): epsilon and delta of its threshold.
TYPICAL_EPSILON = 0.09
TYPICAL_DELTA = 0.3


def _walk_start(batch: int, shape: TreeShape, device: torch.device) -> tuple[torch.Tensor, ...]:
    """The state of a root-to-leaf walk before its first step: rows [B], node [B] (-1, the
    root), done [B] bool, path [B, D] (-1 padded), num_accepted [B]."""
    rows = torch.arange(batch, device=device)
    node = torch.full((batch,), -1, dtype=torch.long, device=device)
    done = torch.zeros(batch, dtype=torch.bool, device=device)
    path = torch.full((batch, max(shape.max_depth, 1)), -1, dtype=torch.long, device=device)
    return rows, node, done, path, torch.zeros(batch, dtype=torch.long, device=device)


def _walk_descend(
    depth: int,
    child: torch.Tensor,
    done: torch.Tensor,
    path: torch.Tensor,
    num_accepted: torch.Tensor,
    node: torch.Tensor,
) -> torch.Tensor | None:
    """A walk's move down one level, after the rows that stop at this depth joined ``done``:
    each other row records ``child`` [B] at ``path[:, depth]``, counts it, and moves ``node``
    [B] there (all in place). Returns the rows that moved [B] bool, or None when every row is
    done (the walk ends)."""
    if bool(done.all()):  # host sync, once per level
        return None
    moving = ~done
    path[moving, depth] = child[moving]
    num_accepted += moving.long()
    node.copy_(torch.where(moving, child, node))
    return moving


def tree_rejection_sampling(
    draft_tokens: torch.Tensor,
    shape: TreeShape,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator | None,
) -> Verdict:
    """Multi-candidate speculative sampling over a tree (SpecInfer, Miao et al. 2024; recursive
    rejection sampling, Jeon et al. 2024). Lossless.

    draft_tokens: [B, N]; draft_probs: [B, N, V], the distribution each node was drawn from
    *given its elder siblings* (a drafter sampling siblings without replacement reports the
    renormalised rest), or None for deterministic candidates (point masses);
    target_probs: [B, N+1, V].

    At a node with target distribution q, its children c_1, c_2, .. are tried in order: c_i
    (drawn from p_i) is accepted with probability min(1, q(c_i) / p_i(c_i)); on rejection q
    becomes the residual norm(max(0, q - p_i)) and the next sibling is tried. An accepted child
    becomes the node (with its own target distribution); when every child is rejected, or the
    node is a leaf, the next token is drawn from the current q. Each trial is one step of
    ordinary speculative sampling of the current q, so by induction over the siblings the token
    taken at a node follows the target's distribution there: the output is exact. With point
    masses a rejection just removes c_i from q, which is sampling q without replacement; that
    is exact whatever the candidates, so probabilities only raise acceptance, never exactness.
    Point masses therefore go to :func:`tree_greedy`, the same rule as a walk that spends one
    draw per emitted token: a seeded request's tokens never depend on the tree drafted.
    """
    if draft_probs is None:
        return tree_greedy(draft_tokens, shape, None, target_probs, generator)
    batch = draft_tokens.shape[0]
    rows, node, done, path, num_accepted = _walk_start(batch, shape, draft_tokens.device)
    q = target_probs[:, 0].clone()  # [B, V] the distribution the next token must follow
    final = torch.empty_like(q)
    for depth in range(shape.max_depth + 1):
        kids = shape.children.to(rows.device)[node + 1]  # [B, W]
        chosen = torch.full_like(node, -1)
        for rank in range(kids.shape[1]):
            child = kids[:, rank]
            u = torch.rand(batch, generator=generator, device=rows.device)
            trying = ~done & (chosen < 0) & (child >= 0)
            if not bool(trying.any()):
                continue
            index = child.clamp_min(0)
            token = draft_tokens[rows, index]  # [B]
            p = draft_probs[rows, index]  # [B, V]
            ok = trying & (u * p[rows, token] < q[rows, token])
            chosen = torch.where(ok, child, chosen)
            rejected = (trying & ~ok).unsqueeze(1)
            q = torch.where(rejected, residual_distribution(q, p), q)
        finishing = ~done & (chosen < 0)
        final = torch.where(finishing.unsqueeze(1), q, final)
        done |= finishing
        moving = _walk_descend(depth, chosen, done, path, num_accepted, node)
        if moving is None:
            break
        q = torch.where(moving.unsqueeze(1), target_probs[rows, node + 1], q)
    return Verdict(num_accepted, sample(final, generator), path)


def tree_greedy(
    draft_tokens: torch.Tensor,
    shape: TreeShape,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator | None,
) -> Verdict:
    """Greedy acceptance over a tree (token matching). Lossless.

    draft_tokens: [B, N]; draft_probs: ignored; target_probs: [B, N+1, V]. From the root, the
    target picks its own token at the node (argmax at temperature 0, a sample otherwise) and
    the walk moves to the child holding that token, until no child does; the target's token
    there is the next token. The output is the target's own samples along the walk: exact for
    any drafter. With distinct siblings the walk is the longest path that matches.
    """
    batch = draft_tokens.shape[0]
    rows, node, done, path, num_accepted = _walk_start(batch, shape, draft_tokens.device)
    if shape.num_nodes == 0:  # nothing drafted: plain sampling
        return Verdict(num_accepted, sample(target_probs[:, 0], generator), path)
    next_token = torch.zeros_like(num_accepted)
    for depth in range(shape.max_depth + 1):
        choice = sample(target_probs[rows, node + 1], generator)  # [B] the target's token
        kids = shape.children.to(rows.device)[node + 1]  # [B, W]
        match = (kids >= 0) & (
            draft_tokens[rows.unsqueeze(1), kids.clamp_min(0)] == choice[:, None]
        )
        found = match.any(1)
        child = kids.gather(1, match.long().argmax(1, keepdim=True)).squeeze(1)
        finishing = ~done & ~found
        next_token = torch.where(finishing, choice, next_token)
        done |= finishing
        if _walk_descend(depth, child, done, path, num_accepted, node) is None:
            break
    return Verdict(num_accepted, next_token, path)


def tree_typical(
    draft_tokens: torch.Tensor,
    shape: TreeShape,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator | None,
) -> Verdict:
    """Typical acceptance (Medusa-2, Cai et al. 2024). LOSSY: the output does not follow the
    target's distribution at temperature > 0; never a default.

    draft_tokens: [B, N]; draft_probs: ignored; target_probs: [B, N+1, V]. A node's token x is
    typical when q(x) > min(epsilon, delta * exp(-H(q))), q the target's distribution at its
    parent. The accepted path is the longest root-to-leaf prefix of typical nodes (the first
    such path on ties); the next token is drawn from the target at its last node. At
    temperature 0 q is one-hot, only the argmax is typical, and the rule equals greedy.
    """
    batch = draft_tokens.shape[0]
    rows = torch.arange(batch, device=draft_tokens.device)
    if shape.num_nodes == 0:
        empty = torch.full((batch, 1), -1, dtype=torch.long, device=rows.device)
        return Verdict(torch.zeros_like(rows), sample(target_probs[:, 0], generator), empty)
    parents = shape.parents.to(rows.device)
    parent_q = target_probs[:, parents + 1]  # [B, N, V]
    entropy = -(parent_q * parent_q.clamp_min(1e-30).log()).sum(-1)  # [B, N]
    threshold = torch.minimum(
        torch.full_like(entropy, TYPICAL_EPSILON), TYPICAL_DELTA * torch.exp(-entropy)
    )
    typical = parent_q.gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1) > threshold  # [B, N]
    paths = shape.paths.to(rows.device)  # [L, D]
    on_path = typical[:, paths.clamp_min(0)] & (paths >= 0)  # [B, L, D]
    lengths = on_path.long().cumprod(-1).sum(-1)  # [B, L]
    best = lengths.argmax(1)  # first longest
    num_accepted = lengths[rows, best]
    depth = torch.arange(paths.shape[1], device=rows.device)
    path = torch.where(depth < num_accepted.unsqueeze(1), paths[best], -1)
    last = torch.where(
        num_accepted > 0,
        path.gather(1, (num_accepted - 1).clamp_min(0).unsqueeze(1)).squeeze(1),
        -1,
    )
    return Verdict(num_accepted, sample(target_probs[rows, last + 1], generator), path)


def chain_rule(tree_rule: TreeAcceptFn) -> AcceptFn:
    """A tree rule applied to a chain draft (a tree with one child per node)."""

    def rule(
        draft_tokens: torch.Tensor,
        draft_probs: torch.Tensor | None,
        target_probs: torch.Tensor,
        generator: torch.Generator | None,
    ) -> Verdict:
        shape = TreeShape.chain(draft_tokens.shape[1])
        verdict = tree_rule(draft_tokens, shape, draft_probs, target_probs, generator)
        return Verdict(verdict.num_accepted, verdict.next_token)

    rule.__doc__ = tree_rule.__doc__
    return rule


ACCEPT_RULES: dict[AcceptRule, AcceptFn] = {
    AcceptRule.REJECTION_SAMPLING: rejection_sampling,
    AcceptRule.GREEDY: greedy,
    AcceptRule.TYPICAL: chain_rule(tree_typical),
}

TREE_RULES: dict[AcceptRule, TreeAcceptFn] = {
    AcceptRule.REJECTION_SAMPLING: tree_rejection_sampling,
    AcceptRule.GREEDY: tree_greedy,
    AcceptRule.TYPICAL: tree_typical,
}
