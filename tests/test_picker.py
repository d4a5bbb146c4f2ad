import json

import pytest

from quickdraft.cli import main
from quickdraft.config import Method
from quickdraft.picker import Workload, pick


def test_short_outputs_and_very_high_temperature_do_not_speculate():
    assert pick(Workload(output_tokens=4)).spec.method is Method.AR
    hot = pick(Workload(task="code", temperature=1.6))
    assert hot.spec.method is Method.AR and "temperature" in hot.reasons[0]


def test_code_with_a_draft_model_speculates_and_gives_both_configs():
    choice = pick(Workload(task="code", temperature=0.0))
    assert choice.speculate and choice.spec.method is Method.DRAFT_MODEL
    assert 2 <= choice.spec.num_speculative_tokens <= 8 and choice.predicted_speedup > 1.5
    assert choice.quickdraft_json()["num_speculative_tokens"] == choice.spec.k
    vllm = choice.vllm_json("my/draft")
    assert vllm == {
        "method": "draft_model",
        "model": "my/draft",
        "num_speculative_tokens": choice.spec.k,
    }


def test_no_memory_for_a_drafter_falls_back_to_lookup_or_plain_decoding():
    copying = pick(Workload(task="summarization", memory_gb=0.1, draft_gb=1.0))
    assert copying.spec.method is Method.NGRAM
    assert any("no draft model" in reason for reason in copying.reasons)
    assert copying.vllm_json()["method"] == "ngram"
    chat = pick(Workload(task="conversation", memory_gb=0.1))
    assert chat.spec.method is Method.AR


def test_higher_temperature_and_concurrency_never_raise_k():
    base = pick(Workload(task="code")).spec.k
    assert pick(Workload(task="code", temperature=1.0)).spec.k <= base
    assert pick(Workload(task="code", concurrency=16)).spec.k <= base


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("task", "poetry"),
        ("temperature", -1.0),
        ("output_tokens", 0),
        ("concurrency", 0),
        ("drafters", ("eagle9",)),
        ("device", "tpu"),
    ],
)
def test_bad_workloads_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        Workload(**{field: value})


def test_pick_command_prints_reasons_and_json(capsys):
    assert main(["pick", "--task", "code", "--draft", "org/draft"]) == 0
    out = capsys.readouterr().out
    line = next(text for text in out.splitlines() if text.startswith("quickdraft: "))
    assert json.loads(line.removeprefix("quickdraft: "))["method"] == "draft_model"
    assert "--speculative-config" in out and "because:" in out
