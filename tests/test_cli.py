import pytest

from quickdraft.cli import main


def test_demo_runs_and_prints_statistics(capsys):
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert out.count("mean accepted length") == 4 and "target forwards" in out


def test_bad_arguments_exit_with_usage_errors(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["conformance", "--samples", "0"])
    assert exit_info.value.code == 2
    assert "--samples" in capsys.readouterr().err


def test_invalid_cost_is_reported_not_raised(tmp_path, capsys):
    assert main(["theory", "--out", str(tmp_path), "--draft-cost", "-1"]) == 2
    assert "draft_cost" in capsys.readouterr().out
