"""A request's evidence for draft sizing: a refused draft's shadow read against the text."""

import pytest
import torch

from quickdraft.drafters.base import Batch, Draft
from quickdraft.engine.evidence import PRIOR, RequestEvidence, Shadow


def test_a_shadow_follows_the_text_down_its_tree():
    """A tree root -> {7, 8}, 7 -> {9}: the text gives the accepted length at the first
    token off the tree or at a leaf, and None while it is too short to tell."""
    shadow = Shadow(start=3, index=[0, 1, 2], nodes=[(7, -1), (8, -1), (9, 0)], promised=1.5)
    assert shadow.landed([7, 9, 4]) == 2  # a leaf reached
    assert shadow.landed([7, 5]) == 1  # off the tree under 7
    assert shadow.landed([8]) == 1  # 8 is a leaf
    assert shadow.landed([6]) == 0
    assert shadow.landed([7]) is None  # 9 may come yet
    assert shadow.landed([]) is None


def test_a_shadow_counts_once_as_a_verified_draft_and_a_new_request_forgets_it():
    evidence = RequestEvidence(2)
    draft = Draft(torch.tensor([[7, 9], [5, 6]]), scores=torch.tensor([[0.8, 0.6], [0.0, 0.0]]))
    evidence.shadow(draft, Batch.from_rows([[1, 2, 3], [1, 2]]), [0, 1])
    assert evidence.shadows[1] is None  # a row with no real node leaves none
    evidence.resolve(Batch.from_rows([[1, 2, 3, 7, 9], [1, 2, 4]]), [0, 1])
    assert evidence.shadows[0] is None
    assert evidence.landed[0] == PRIOR * 0.9 + 2
    assert evidence.promised[0] == pytest.approx(PRIOR * 0.9 + 1.4)
    evidence.resolve(Batch.from_rows([[1, 2, 3, 7, 9, 1], [1, 2, 4, 4]]), [0, 1])
    assert evidence.landed[0] == PRIOR * 0.9 + 2  # resolved once
    evidence.shadow(draft, Batch.from_rows([[1, 2, 3]]), [0])
    evidence.begin([0])
    assert evidence.shadows[0] is None and evidence.landed[0] == PRIOR
