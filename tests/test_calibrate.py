import json

import pytest

from quickdraft.calibrate import MethodProfile, calibrate, forward_costs
from quickdraft.cli import main
from quickdraft.config import Method


def test_expected_tokens_from_measured_acceptance():
    profile = MethodProfile(
        Method.NGRAM,
        acceptance=[0.5, 0.5, 0.0],
        proposed=[1.0, 1.0, 0.5],
        draft_seconds_per_token=0.0,
        draft_seconds_per_step=0.001,
    )
    assert profile.expected_tokens(0) == 1.0
    assert profile.expected_tokens(1) == 1.5
    assert profile.expected_tokens(2) == 1.75
    assert profile.expected_tokens(3) == 1.75
    assert profile.draft_seconds(3) == 0.001


def test_calibration_on_smollm2(smollm2):
    target, tokenizer = smollm2
    prompts = [
        tokenizer.encode(text)
        for text in (
            "def add(a, b):\n    return a + b\n\ndef add(a, b):\n",
            "one two three four one two three four one two",
        )
    ]
    costs = forward_costs(target, 32, [1, 3], repeats=2)
    assert set(costs) == {1, 3} and all(seconds > 0 for seconds in costs.values())
    result = calibrate(target, prompts, draft=target.truncated(10), k_max=3, max_new_tokens=12)
    assert [p.method for p in result.profiles] == [Method.DRAFT_MODEL, Method.NGRAM]
    for profile in result.profiles:
        assert len(profile.acceptance) == 3 and all(0 <= a <= 1 for a in profile.acceptance)
        assert sorted(profile.predicted) == [1, 2, 3]
        tokens = [profile.expected_tokens(k) for k in range(4)]
        assert tokens == sorted(tokens)
    if result.choice.speculate:
        assert result.measured_speedup is not None and result.measured_speedup > 0
    assert set(result.verify_seconds) == {1, 2, 3, 4}


def test_calibrate_command(smollm2, tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a b c a b c a b\nx = 1\nx = 1\n")
    assert (
        main(
            [
                "pick",
                "--calibrate",
                str(prompts),
                "--drafters",
                "ngram",
                "--k-max",
                "2",
                "--max-new-tokens",
                "6",
                "--json",
            ]
        )
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert data["profiles"][0]["method"] == "ngram" and "choice" in data
    with pytest.raises(SystemExit):
        main(["pick", "--calibrate", str(prompts), "--k-max", "0"])
    assert main(["pick", "--calibrate", str(tmp_path / "none.txt")]) == 2
