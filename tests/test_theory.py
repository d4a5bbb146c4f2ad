import pytest

from quickdraft.cli import main
from quickdraft.theory import (
    CostModel,
    acceptance_experiment,
    expected_tokens_per_step,
    is_monotone_decreasing,
    kl_divergence,
    optimal_num_draft,
    speedup,
    total_variation,
)
from quickdraft.theory_report import build_report, write_report


def test_expected_tokens_known_values():
    assert expected_tokens_per_step(0.5, 1) == 1.5
    assert expected_tokens_per_step(0.5, 2) == 1.75
    assert expected_tokens_per_step(0.0, 5) == 1.0
    assert expected_tokens_per_step(1.0, 5) == 6.0
    assert expected_tokens_per_step(0.75, 5) == pytest.approx((1 - 0.75**6) / 0.25)
    with pytest.raises(ValueError, match="alpha"):
        expected_tokens_per_step(1.5, 3)


def test_speedup_model():
    free = CostModel(draft_cost=0.0, verify_slope=0.0)
    assert speedup(0.8, 4, free) == expected_tokens_per_step(0.8, 4)
    costs = CostModel(draft_cost=0.1, verify_slope=0.5)
    # N = 2: E = 1 + 0.5 + 0.25 = 1.75; cost = 0.2 + 1 + 0.5 * 2 = 2.2
    assert speedup(0.5, 2, costs) == pytest.approx(1.75 / 2.2)
    assert speedup(0.9, 0, costs) == 1.0
    with pytest.raises(ValueError, match="draft_cost"):
        CostModel(draft_cost=-1.0)


def test_optimal_n_grows_with_alpha_and_falls_to_zero_when_verify_is_expensive():
    costs = CostModel(draft_cost=0.1)
    optima = [optimal_num_draft(alpha, costs) for alpha in (0.5, 0.7, 0.85, 0.95)]
    assert optima == sorted(optima) and optima[0] >= 1
    assert optimal_num_draft(0.5, CostModel(draft_cost=0.5, verify_slope=1.0)) == 0


def test_divergences():
    import torch

    p = torch.tensor([0.5, 0.5, 0.0])
    q = torch.tensor([0.25, 0.25, 0.5])
    assert total_variation(p, q) == pytest.approx(0.5)
    assert kl_divergence(p, q) == pytest.approx(0.6931471805599453)


def test_measured_acceptance_matches_one_minus_tv_and_falls_with_kl():
    points = acceptance_experiment([0.0, 0.2, 0.5, 1.0], steps=10_000, seed=0)
    assert is_monotone_decreasing(points)
    for point in points:
        assert abs(point.measured - point.expected) < 0.01, point
        assert point.trials >= 10_000
    assert points[0].expected == pytest.approx(1.0) and points[0].measured == 1.0


def test_report_writes_both_plots_and_json(tmp_path):
    report = build_report(CostModel(draft_cost=0.1), steps=10_000)
    assert report.passed and report.max_gap < 0.01
    assert [row.optimal_n for row in report.optimal] == [2, 4, 7]
    paths = write_report(report, tmp_path)
    for name in ("speedup_vs_n.png", "acceptance_vs_kl.png"):
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    assert (tmp_path / "theory.json") in paths


def test_theory_command(tmp_path, capsys):
    assert main(["theory", "--out", str(tmp_path), "--steps", "10000"]) == 0
    out = capsys.readouterr().out
    assert "optimal N" in out and "monotone decreasing: True" in out
    assert (tmp_path / "acceptance_vs_kl.png").exists()
