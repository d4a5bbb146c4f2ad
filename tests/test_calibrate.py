import json

import pytest

from quickdraft.cli import main
from quickdraft.config import Method
from quickdraft.pick.calibrate import ChainProfile, calibrate, forward_costs
from quickdraft.pick.context import PickContext
from quickdraft.pick.picker import Workload


def test_expected_tokens_from_measured_acceptance():
    profile = ChainProfile(
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


def test_calibration_measures_every_candidate_and_confirms(smollm2):
    """Chains run once at their largest k and predict the smaller ones; trees run each; the
    choice then runs beside plain decoding and the runner-up."""
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
    context = PickContext(target="smollm2-135m", draft="smollm2-135m")
    workload = Workload(task="code", methods=("ar", "draft_model", "ngram", "eagle"))
    result = calibrate(
        target, prompts, context, workload, draft=target.truncated(10), max_new_tokens=10,
        budget_seconds=600,
    )  # fmt: skip
    labels = {m.label for m in result.measured}
    assert {"draft_model k=2", "draft_model k=8", "ngram k=3", "eagle", "eagle lookup=0"} <= labels
    for measured in result.measured:
        assert measured.expected_tokens >= 1 and measured.predicted > 0
    assert result.prompts_used == 2 and set(result.verify_seconds) == set(range(1, 10))
    if result.choice.speculate:
        assert result.confirmed and result.measured_speedup is not None
        assert result.choice.reasons[0].startswith("confirmed")
    else:
        assert result.choice.spec.method is Method.AR


def test_a_small_budget_measures_on_fewer_prompts(smollm2):
    target, tokenizer = smollm2
    prompts = [tokenizer.encode(f"item {i}: a b c a b c") for i in range(6)]
    context = PickContext(target="smollm2-135m")
    workload = Workload(methods=("ar", "ngram"))
    result = calibrate(target, prompts, context, workload, max_new_tokens=6,
                       budget_seconds=1e-3, confirm=False)  # fmt: skip
    assert result.prompts_used == 1
    with pytest.raises(ValueError, match="budget_seconds"):
        calibrate(target, prompts, context, workload, budget_seconds=0)


def test_calibrate_command(smollm2, tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a b c a b c a b\nx = 1\nx = 1\n")
    argv = ["pick", "--calibrate", str(prompts), "--methods", "ar,ngram", "--max-new-tokens",
            "6", "--budget-seconds", "60", "--json"]  # fmt: skip
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert {m["label"] for m in data["measured"]} >= {"ngram k=2", "ngram k=8"}
    assert "quickdraft" in data and "engines" in data
    with pytest.raises(SystemExit):
        main(["pick", "--calibrate", str(prompts), "--budget-seconds", "0"])
    assert main(["pick", "--calibrate", str(tmp_path / "none.txt")]) == 2


def test_calibration_prompts_that_are_not_prompts_are_named(tmp_path):
    from quickdraft.cli.pick import _read_prompts
    from quickdraft.models.toy import ToyTokenizer

    tokenizer = ToyTokenizer(16)
    path = tmp_path / "prompts.jsonl"
    for line, message in [('{"foo": "hi"}', "neither 'messages' nor a 'prompt'"),
                          ("[1, 2]", "not a JSON object"), ('{"prompt": 5}', "'prompt' string"),
                          ('{"messages": "hi"}', "'messages' must be"),
                          ("{'prompt': 1}", "prompts.jsonl:2 is not JSON")]:  # fmt: skip
        path.write_text('{"prompt": "a"}\n' + line + "\n")
        with pytest.raises(ValueError, match=rf"calibrate: .*{message}"):
            _read_prompts(path, tokenizer)
    path.write_bytes(b"\xff\n")
    with pytest.raises(ValueError, match=r"calibrate: .* is not UTF-8 text"):
        _read_prompts(path, tokenizer)


def test_calibration_takes_a_draft_padded_to_another_vocabulary_with_its_tokenizer(smollm2):
    """As generate and bench do: a draft whose vocabulary is padded (same tokenizer) runs
    with both tokenizers given, and is refused by name without them."""
    from conftest import tiny_hf_model

    from quickdraft.models.llama import LlamaRunner

    target, tokenizer = smollm2
    padded = tiny_hf_model("llama-tied", vocab_size=49152 + 64, layers=1)
    draft = LlamaRunner.from_state_dict(padded.config.to_dict(), padded.state_dict())
    prompts = [tokenizer.encode("a b c a b c a b")]
    context = PickContext(target="smollm2-135m", draft="tiny")
    workload = Workload(methods=("ar", "draft_model"))
    result = calibrate(target, prompts, context, workload, draft=draft, max_new_tokens=4,
                       confirm=False, tokenizer=tokenizer, draft_tokenizer=tokenizer)  # fmt: skip
    assert any(m.label.startswith("draft_model") for m in result.measured)
    with pytest.raises(ValueError, match="vocabulary"):
        calibrate(target, prompts, context, workload, draft=draft, max_new_tokens=4,
                  confirm=False)  # fmt: skip
