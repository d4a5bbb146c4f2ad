"""Steps 4 and 5 of the engine's step as functions of tensors: the acceptance rule applied row by
row where rows bring their own generator, the tokens each row emits and their logprobs. (The
verify pass's inputs are the runner's: ``engine.runner``.)"""

from __future__ import annotations

import torch

from quickdraft.accept import AcceptFn, TreeAcceptFn, Verdict
from quickdraft.drafters.base import Batch, Draft
from quickdraft.engine.requests import TokenLogprob
from quickdraft.sampling import argmax


def accept_rows(
    chain_rule: AcceptFn,
    tree_rule: TreeAcceptFn,
    draft: Draft,
    target_probs: torch.Tensor,
    batch: Batch,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(num_accepted [B], next_token [B], path [B, D]) with D the draft's depth: the accepted
    nodes root first, -1 past num_accepted (a chain's path is 0, 1, ..).

    target_probs: [B, N + 1, V]. Rows without a generator of their own are judged together
    with the engine's; a seeded row alone with its own, so the numbers it draws never depend
    on the batch around it. Rows at temperature 0 draw nothing and always go together."""
    own = [
        b for b, g in enumerate(batch.generators) if g is not None and not batch.sampling[b].greedy
    ]
    shared = sorted(set(range(batch.size)) - set(own))
    device = target_probs.device
    tokens = draft.tokens.to(device)
    probs = None if draft.probs is None else draft.probs.to(device)
    depth = draft.depth
    num_accepted = torch.zeros(batch.size, dtype=torch.long, device=device)
    next_token = torch.zeros_like(num_accepted)
    path = torch.full((batch.size, depth), -1, dtype=torch.long, device=device)
    groups = [(shared, batch.generator)] if shared else []
    groups += [([b], batch.generators[b]) for b in own]
    for rows, generator in groups:
        index = slice(None) if len(rows) == batch.size else torch.tensor(rows, device=device)
        part = None if probs is None else probs[index]
        if draft.tree is None:
            verdict = chain_rule(tokens[index], part, target_probs[index], generator)
        else:
            verdict = tree_rule(tokens[index], draft.tree, part, target_probs[index], generator)
        num_accepted[index] = verdict.num_accepted
        next_token[index] = verdict.next_token
        path[index] = _path(verdict, depth)
    return num_accepted, next_token, path


def greedy_undrafted(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``accept_rows`` for a step with nothing drafted and every row greedy: each row's next
    token is the target's argmax at its pending position (ties to the lowest id, the token
    of ``probs_from_logits``' one-hot row), read without building a distribution over the
    vocabulary for each row and walking it (0.5 ms of a 30 ms step on a 150k vocabulary).
    logits: [B, T, V] of the verify pass, masked where a constraint applies."""
    next_token = argmax(logits[:, 0])
    num_accepted = torch.zeros_like(next_token)
    return num_accepted, next_token, num_accepted.new_empty(next_token.shape[0], 0)


def greedy_drafted(
    logits: torch.Tensor, draft: Draft
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``accept_rows`` for a step whose rows are all greedy under a lossless rule (at
    temperature 0 rejection sampling and greedy acceptance both accept a node exactly when
    its token is the target's argmax at its parent, the first such child of a node in node
    order, and end on the argmax where no child holds it): the walk of
    ``accept.tree_greedy`` on the host over the argmax at every node, without a one-hot
    distribution over the vocabulary for each node and a tensor walk over them (0.9 ms of
    SmolLM2-135M's 5 ms step on a 2-node chain). Typical acceptance takes the longest
    matching path where siblings repeat a token, so it keeps its own walk.
    logits: [B, T, V] of the verify pass, masked where a constraint applies; T >= N + 1."""
    nodes, depth = draft.tokens.shape[1], draft.depth
    choices = argmax(logits[:, : nodes + 1]).tolist()  # host sync: the walk's input
    children: list[list[int]] = [[] for _ in range(nodes + 1)]  # [0]: the root's
    for node, parent in enumerate(draft.parents.tolist()):
        children[parent + 1].append(node)  # in node order: the first match wins, as there
    accepted, next_tokens, paths = [], [], []
    for tokens, choice in zip(draft.tokens.tolist(), choices, strict=True):
        path, node = [], -1
        while True:
            want = choice[node + 1]  # the target's token after ``node``
            child = next((c for c in children[node + 1] if tokens[c] == want), None)
            if child is None:
                break
            path.append(child)
            node = child
        accepted.append(len(path))
        next_tokens.append(want)
        paths.append(path + [-1] * (depth - len(path)))
    device = logits.device
    path_tensor = torch.tensor(paths, dtype=torch.long, device=device).view(len(paths), depth)
    return (
        torch.tensor(accepted, dtype=torch.long, device=device),
        torch.tensor(next_tokens, dtype=torch.long, device=device),
        path_tensor,
    )


def _path(verdict: Verdict, depth: int) -> torch.Tensor:
    if verdict.path is not None:
        return verdict.path[:, :depth]
    steps = torch.arange(depth, device=verdict.num_accepted.device)
    return torch.where(steps < verdict.num_accepted.unsqueeze(1), steps, -1)


def emitted_tokens(
    draft: Draft, path: torch.Tensor, num_accepted: torch.Tensor, next_token: torch.Tensor
) -> torch.Tensor:
    """[B, D + 1] each row's accepted drafts (``path`` [B, D], -1 past num_accepted [B]),
    then its next token [B] at column num_accepted; columns past it are scratch."""
    device = next_token.device
    chunk = torch.cat(
        [draft.tokens.to(device).gather(1, path.clamp_min(0)), next_token[:, None]], 1
    )
    chunk.scatter_(1, num_accepted.unsqueeze(1), next_token.unsqueeze(1))
    return chunk


def emitted_logprobs(
    logits: torch.Tensor, kept: torch.Tensor, chunk: torch.Tensor, tops: list[int | None]
) -> list[list[TokenLogprob] | None]:
    """Per row, the target's log-probability of each token of its chunk and the ``tops[b]``
    most likely tokens' (None for rows that asked for none), read at the verify-pass position
    that produced it: the raw distribution, before temperature, top-k and top-p.

    logits: [B, T, V] of the verify pass; kept: [B, D + 1] verify-input index of the pending
    token and the accepted nodes (the logits there produced chunk[:, i]); chunk: [B, D + 1]
    the accepted drafts and the next token (entries past a row's count are ignored)."""
    rows = [b for b, top in enumerate(tops) if top is not None]
    out: list[list[TokenLogprob] | None] = [None] * len(tops)
    if not rows:
        return out
    index = torch.tensor(rows, device=logits.device)
    at = logits[index.unsqueeze(1), kept[index]]  # [R, D + 1, V]
    logp = torch.log_softmax(at.float(), dim=-1)
    chosen = logp.gather(2, chunk[index].unsqueeze(2)).squeeze(2)  # [R, D + 1]
    most = min(max(tops[b] or 0 for b in rows), logp.shape[-1])  # a tiny vocabulary has fewer
    values, ids = logp.topk(most, dim=-1)  # k = 0 gives empty tensors
    # The one host read of these, for the rows that asked.
    chosen_l, values_l, ids_l = chosen.tolist(), values.tolist(), ids.tolist()
    tokens = chunk[index].tolist()
    for r, b in enumerate(rows):
        n = tops[b] or 0
        out[b] = [
            TokenLogprob(token, lp, tuple(zip(ids_l[r][i][:n], values_l[r][i][:n], strict=True)))
            for i, (token, lp) in enumerate(zip(tokens[r], chosen_l[r], strict=True))
        ]
    return out
