"""Tree shapes and their buffers; the tree acceptance rules on hand-made cases."""

import pytest
import torch

from quickdraft.accept import tree_greedy, tree_rejection_sampling, tree_typical
from quickdraft.config import AcceptRule
from quickdraft.sampling import make_generator
from quickdraft.tree import TreeShape


def test_branching_tree_buffers():
    shape = TreeShape.from_branching([2, 2])
    assert shape.parents.tolist() == [-1, -1, 0, 0, 1, 1]
    assert shape.depth.tolist() == [1, 1, 2, 2, 2, 2]
    assert shape.ranks.tolist() == [0, 1, 0, 1, 0, 1]
    assert shape.position_offsets.tolist() == [0, 1, 1, 2, 2, 2, 2]
    assert shape.children.tolist() == [[0, 1], [2, 3], [4, 5]] + [[-1, -1]] * 4
    assert shape.paths.tolist() == [[0, 2], [0, 3], [1, 4], [1, 5]]
    # Node 3 (verify input 4) sees the root, its parent 0 and itself, not its sibling 2.
    assert shape.mask[4].tolist() == [True, True, False, False, True, False, False]
    assert not shape.is_chain and TreeShape.chain(3).is_chain


def test_medusa_paths_are_ordered_by_depth_then_rank():
    shape = TreeShape.from_paths([(0, 0), (1,), (0,), (0, 1), (0, 0, 0)])
    # Sorted: (0,), (1,), (0,0), (0,1), (0,0,0)
    assert shape.parents.tolist() == [-1, -1, 0, 0, 2]
    assert shape.ranks.tolist() == [0, 1, 0, 1, 0]
    assert shape.max_depth == 3 and shape.num_nodes == 5
    assert TreeShape.from_paths([(0,), (1,)]) is TreeShape.from_parents([-1, -1])  # cached


@pytest.mark.parametrize(
    ("paths", "message"),
    [
        ([], "at least one node"),
        ([(0, 1)], "prefix"),
        ([(0,), (2,)], "elder sibling"),
        ([(0,), (0,)], "twice"),
        ([(0,), (-1,)], "ranks >= 0"),
    ],
)
def test_bad_paths_name_the_field(paths, message):
    with pytest.raises(ValueError, match=f"paths: .*{message}|paths:.*{message}"):
        TreeShape.from_paths(paths)


def test_bad_parents_and_widths_raise():
    with pytest.raises(ValueError, match="parents"):
        TreeShape.from_parents([-1, 1])
    with pytest.raises(ValueError, match="widths"):
        TreeShape.from_branching([2, 0])


def one_hot(tokens, vocab=6):
    return torch.nn.functional.one_hot(torch.tensor(tokens), vocab).float()


def test_greedy_walk_follows_the_matching_child():
    shape = TreeShape.from_branching([2, 2])
    # Nodes 0..5 hold tokens; the target's argmax: root -> 4, node 1 -> 2, node 5 -> 0.
    draft = torch.tensor([[3, 4, 1, 5, 0, 2]])
    target = one_hot([[4, 0, 2, 0, 0, 0, 1]])
    verdict = tree_greedy(draft, shape, None, target, make_generator(0))
    # root -> node 1 (token 4) -> node 5 (token 2) -> leaf: next token is node 5's argmax, 1.
    assert verdict.num_accepted.tolist() == [2]
    assert verdict.path.tolist() == [[1, 5]]
    assert verdict.next_token.tolist() == [1]


@pytest.mark.parametrize("rule", [tree_greedy, tree_rejection_sampling, tree_typical])
def test_rules_agree_with_greedy_when_everything_is_one_hot(rule):
    shape = TreeShape.from_paths([(0,), (1,), (0, 0), (1, 0)])
    draft = torch.tensor([[2, 3, 4, 1], [2, 3, 4, 1]])
    # Row 0: root -> 3 (node 1), node 1 -> 1 (node 3), node 3 -> 5. Row 1: root -> 0: reject.
    target = torch.stack([one_hot([3, 0, 1, 0, 5]), one_hot([0, 0, 0, 0, 0])])
    verdict = rule(draft, shape, None, target, make_generator(0))
    assert verdict.num_accepted.tolist() == [2, 0]
    assert verdict.path.tolist() == [[1, 3], [-1, -1]]
    assert verdict.next_token.tolist() == [5, 0]


def test_point_mass_siblings_are_tried_in_order_and_removed_from_the_target():
    """Root candidates 1 then 2 as point masses against q = (0, .5, .5): the first is accepted
    half the time; otherwise q without token 1 is all on 2, which is then always accepted."""
    shape = TreeShape.from_parents([-1, -1])
    draft = torch.tensor([[1, 2]]).expand(20_000, -1)
    target = torch.tensor([[0.0, 0.5, 0.5], [0.2, 0.3, 0.5], [0.1, 0.1, 0.8]]).expand(
        20_000, -1, -1
    )
    verdict = tree_rejection_sampling(draft, shape, None, target, make_generator(0))
    assert (verdict.num_accepted == 1).all()
    first = (verdict.path[:, 0] == 0).float().mean()
    assert abs(float(first) - 0.5) < 0.02


def test_typical_acceptance_is_labelled_lossy():
    assert not AcceptRule.TYPICAL.lossless
    assert AcceptRule.GREEDY.lossless and AcceptRule.REJECTION_SAMPLING.lossless
    assert "LOSSY" in tree_typical.__doc__


def test_typical_accepts_likely_tokens_below_the_argmax():
    """At a flat target distribution a token of probability 0.3 is typical (threshold
    min(0.09, 0.3 * exp(-H))), though not the argmax: typical accepts what greedy refuses."""
    shape = TreeShape.chain(1)
    draft = torch.tensor([[1]])
    target = torch.tensor([[[0.4, 0.3, 0.3], [1.0, 0.0, 0.0]]])
    typical = tree_typical(draft, shape, None, target, make_generator(0))
    assert typical.num_accepted.tolist() == [1]
    assert typical.next_token.tolist() == [0]
