import math

import torch

from quickdraft.stats import Stats


def test_acceptance_by_position_counts_only_proposed_positions():
    stats = Stats(k=3)
    stats.record(torch.tensor([0]), 0)  # an n-gram lookup found nothing: not a rejection
    stats.record(torch.tensor([2, 3]), 3)
    stats.record(torch.tensor([0]), 1)
    assert stats.accepted_lengths == [1, 3, 4, 1]
    assert stats.mean_accepted_length == 2.25
    assert stats.acceptance_by_position == [2 / 3, 1.0, 0.5]
    assert stats.acceptance_rate == 5 / 7


def test_nothing_measured_is_nan_and_json_null():
    stats = Stats(k=2)
    assert math.isnan(stats.mean_accepted_length) and math.isnan(stats.acceptance_rate)
    data = stats.to_dict()
    assert data["mean_accepted_length"] is None and data["acceptance_by_position"] == [None, None]
