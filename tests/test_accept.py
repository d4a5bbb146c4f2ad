"""Acceptance rules on hand-built probabilities with known answers."""

import pytest
import torch

from quickdraft.accept import (
    ACCEPT_RULES,
    accepted_count,
    greedy,
    point_mass,
    rejection_sampling,
    residual_distribution,
)
from quickdraft.config import AcceptRule
from quickdraft.sampling import make_generator

T = torch.tensor


def test_accepted_count_is_the_true_prefix():
    accepted = T([[True, True, False, True], [False, True, True, True], [True] * 4])
    assert accepted_count(accepted).tolist() == [2, 0, 4]
    assert accepted_count(torch.zeros(3, 0, dtype=torch.bool)).tolist() == [0, 0, 0]


def test_residual_known_answer():
    q = T([[[0.5, 0.3, 0.2, 0.0]]])
    p = T([[[0.2, 0.6, 0.2, 0.0]]])
    torch.testing.assert_close(residual_distribution(q, p), T([[[1.0, 0.0, 0.0, 0.0]]]))
    q = T([[[0.4, 0.4, 0.2]]])
    p = T([[[0.0, 0.8, 0.2]]])  # draft gives 0 where the target has mass
    torch.testing.assert_close(residual_distribution(q, p), T([[[1.0, 0.0, 0.0]]]))


def test_residual_of_equal_distributions_is_finite():
    q = T([[[0.25, 0.25, 0.5], [0.0, 1.0, 0.0]]])
    out = residual_distribution(q, q.clone())
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, q)


def test_draft_equal_to_target_accepts_everything_and_takes_bonus_from_last_position():
    q = torch.softmax(torch.randn(500, 4, 6, generator=torch.Generator().manual_seed(0)), -1)
    draft_probs = q[:, :3]
    tokens = torch.multinomial(draft_probs.reshape(-1, 6), 1).view(500, 3)
    q[:, 3] = 0.0
    q[:, 3, 5] = 1.0  # the bonus distribution is a point mass on token 5
    verdict = rejection_sampling(tokens, draft_probs, q, make_generator(0))
    assert verdict.num_accepted.tolist() == [3] * 500
    assert verdict.next_token.tolist() == [5] * 500


def test_token_the_target_excludes_is_never_accepted():
    # The target gives token 0 zero mass (outside its top-k, say); the draft is sure of it.
    q = T([[0.0, 0.7, 0.3], [0.2, 0.3, 0.5]]).expand(1000, -1, -1)
    p = T([[1.0, 0.0, 0.0]]).expand(1000, -1, -1)
    verdict = rejection_sampling(torch.zeros(1000, 1, dtype=torch.long), p, q, make_generator(1))
    assert verdict.num_accepted.sum() == 0
    # The corrected token comes from the residual = q itself here: 1 w.p. 0.7, 2 w.p. 0.3.
    share = (verdict.next_token == 1).double().mean()
    assert verdict.next_token.min() >= 1 and abs(share - 0.7) < 0.05


def test_zero_draft_probability_for_a_drafted_token_accepts_when_the_target_allows_it():
    # p(d) = 0 only happens with a buggy drafter; u * 0 < q(d) accepts iff q(d) > 0, never NaN.
    q = T([[[0.5, 0.5], [0.5, 0.5]], [[1.0, 0.0], [0.5, 0.5]]])
    p = T([[[1.0, 0.0]], [[1.0, 0.0]]])
    verdict = rejection_sampling(T([[1], [1]]), p, q, make_generator(0))
    assert verdict.num_accepted.tolist() == [1, 0]
    assert verdict.next_token[1] == 0


def test_acceptance_probability_is_one_minus_total_variation():
    q = T([0.5, 0.3, 0.2])
    p = T([0.2, 0.2, 0.6])
    n = 200_000
    generator = make_generator(3)
    tokens = torch.multinomial(p.expand(n, -1), 1, replacement=True, generator=generator)
    verdict = rejection_sampling(tokens, p.expand(n, 1, -1), q.expand(n, 2, -1), generator)
    expected = float(torch.minimum(p, q).sum())  # 0.2 + 0.2 + 0.2
    assert abs(float(verdict.num_accepted.double().mean()) - expected) < 0.005
    # And the first token, accepted or corrected, is distributed as q.
    first = torch.where(verdict.num_accepted == 1, tokens[:, 0], verdict.next_token)
    freq = torch.bincount(first, minlength=3).double() / n
    torch.testing.assert_close(freq, q.double(), atol=0.005, rtol=0)


def test_point_mass_draft_is_the_walk_and_agrees_with_explicit_one_hot():
    """Point masses take the greedy walk (one draw per emitted token, so a seeded request's
    tokens never depend on the draft); the explicit one-hot through the ratio test accepts
    and corrects with the same distribution."""
    rows = 40_000
    logits = torch.randn(1, 3, 5, generator=torch.Generator().manual_seed(2))
    q = torch.softmax(logits, -1).expand(rows, -1, -1)
    tokens = torch.tensor([[int(q[0, 0].argmax()), int(q[0, 1].argmin())]]).expand(rows, -1)
    a = rejection_sampling(tokens, None, q, make_generator(9))
    walk = greedy(tokens, None, q, make_generator(9))
    assert torch.equal(a.num_accepted, walk.num_accepted)
    assert torch.equal(a.next_token, walk.next_token)
    b = rejection_sampling(tokens, point_mass(tokens, 5), q, make_generator(9))
    for n in range(3):
        share_a = float((a.num_accepted == n).double().mean())
        share_b = float((b.num_accepted == n).double().mean())
        assert abs(share_a - share_b) < 0.01, n
    first_a = torch.bincount(
        torch.where(a.num_accepted > 0, tokens[:, 0], a.next_token), minlength=5
    )
    first_b = torch.bincount(
        torch.where(b.num_accepted > 0, tokens[:, 0], b.next_token), minlength=5
    )
    torch.testing.assert_close(first_a / rows, first_b / rows, atol=0.01, rtol=0)


def test_greedy_known_answer_with_one_hot_targets():
    argmax = T([[2, 0, 1], [2, 1, 1], [0, 0, 0]])  # target argmax at positions 1..3
    q = torch.zeros(3, 3, 3).scatter_(2, argmax.unsqueeze(-1), 1.0)
    drafts = T([[2, 0], [2, 0], [1, 0]])
    verdict = greedy(drafts, None, q, make_generator(0))
    assert verdict.num_accepted.tolist() == [2, 1, 0]
    assert verdict.next_token.tolist() == [1, 1, 0]  # bonus, corrected, corrected


def test_rejection_sampling_at_temperature_zero_is_greedy():
    argmax = torch.randint(0, 7, (300, 5), generator=torch.Generator().manual_seed(4))
    q = torch.zeros(300, 5, 7).scatter_(2, argmax.unsqueeze(-1), 1.0)
    drafts = torch.where(torch.rand(300, 4) < 0.7, argmax[:, :4], (argmax[:, :4] + 1) % 7)
    draft_probs = torch.zeros(300, 4, 7).scatter_(2, drafts.unsqueeze(-1), 1.0)
    a = rejection_sampling(drafts, draft_probs, q, make_generator(0))
    b = greedy(drafts, None, q, make_generator(0))
    assert torch.equal(a.num_accepted, b.num_accepted)
    assert torch.equal(a.next_token, b.next_token)


@pytest.mark.parametrize("rule", list(AcceptRule))
def test_rules_handle_an_empty_draft(rule):
    q = T([[[0.0, 0.0, 1.0]]]).expand(4, -1, -1)
    verdict = ACCEPT_RULES[rule](torch.zeros(4, 0, dtype=torch.long), None, q, make_generator(0))
    assert verdict.num_accepted.tolist() == [0] * 4
    assert verdict.next_token.tolist() == [2] * 4


@pytest.mark.parametrize("rule", list(AcceptRule))
def test_rules_are_seeded(rule):
    q = torch.softmax(torch.randn(256, 4, 9, generator=torch.Generator().manual_seed(5)), -1)
    p = torch.softmax(torch.randn(256, 3, 9, generator=torch.Generator().manual_seed(6)), -1)
    tokens = torch.multinomial(p.reshape(-1, 9), 1, generator=make_generator(0)).view(256, 3)
    runs = [ACCEPT_RULES[rule](tokens, p, q, make_generator(seed)) for seed in (11, 11, 12)]
    assert torch.equal(runs[0].next_token, runs[1].next_token)
    assert torch.equal(runs[0].num_accepted, runs[1].num_accepted)
    assert not torch.equal(runs[0].next_token, runs[2].next_token)


@pytest.mark.parametrize("rule", [r for r in AcceptRule if r.lossless])
@pytest.mark.parametrize("branching", [None, (2, 2), (3, 2, 1)])
def test_greedy_walk_on_argmax_is_every_lossless_rule_at_temperature_zero(rule, branching):
    """The engine's greedy path (``engine.verify.greedy_drafted``: the tree walk over each
    node's argmax, on the host) accepts, corrects and walks exactly as each lossless rule does
    on the one-hot distributions of temperature 0, for chains and trees (siblings that repeat
    a token included), with and without draft probabilities, ties in the logits included (the
    lowest id wins, as in sampling)."""
    from quickdraft.accept import TREE_RULES
    from quickdraft.config import SamplingParams
    from quickdraft.drafters.base import Batch, Draft
    from quickdraft.engine.verify import accept_rows, greedy_drafted
    from quickdraft.sampling import probs_for_rows
    from quickdraft.tree import TreeShape

    generator = torch.Generator().manual_seed(7)
    rows, vocab = 64, 6
    shape = TreeShape.chain(4) if branching is None else TreeShape.from_branching(list(branching))
    nodes = shape.num_nodes
    logits = torch.randint(0, 4, (rows, nodes + 1, vocab), generator=generator).float()  # ties
    argmax = logits.argmax(-1)  # [B, N + 1]
    parents = shape.parents
    # Each node's token: its parent's argmax most of the time, so walks go deep.
    hit = torch.rand(rows, nodes, generator=generator) < 0.7
    other = torch.randint(0, vocab, (rows, nodes), generator=generator)
    tokens = torch.where(hit, argmax[:, parents + 1], other)
    params = SamplingParams(temperature=0)
    for with_probs in (False, True):
        probs = None
        if with_probs:
            probs = torch.softmax(torch.randn(rows, nodes, vocab, generator=generator), -1)
        draft = Draft(tokens, probs) if branching is None else Draft(tokens, probs, shape)
        batch = Batch.from_rows([[1, 2]] * rows, params)
        target = probs_for_rows(logits, [params] * rows)
        expected = accept_rows(ACCEPT_RULES[rule], TREE_RULES[rule], draft, target, batch)
        got = greedy_drafted(logits, draft)
        for a, b in zip(got, expected, strict=True):
            assert torch.equal(a, b)
