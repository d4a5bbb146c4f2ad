"""The strategy picker: every registered method is a candidate, the priors' rules, and the
configs it prints for quickdraft, vLLM and SGLang."""

import dataclasses
import json

import pytest
from test_interop_launch import check_sglang_flags, check_vllm_config

from quickdraft.cli import main
from quickdraft.config import Method, NoOptions, SpecConfig
from quickdraft.drafters import ngram, registry
from quickdraft.drafters.registry import MethodEntry, make_spec
from quickdraft.pick import costs
from quickdraft.pick.candidates import PICK
from quickdraft.pick.context import PickContext, PickSupport, StepPrior
from quickdraft.pick.picker import Workload, modelled_speedup, options, pick

SMOLLM2 = PickContext(target="smollm2-135m")  # EAGLE drafter and Medusa heads ship for it


def everything() -> PickContext:
    """SmolLM2 with a draft model too: every built-in method has something to offer."""
    return PickContext(target="smollm2-135m", draft="smollm2-135m")


def test_every_registered_method_is_a_candidate():
    ranked, reasons = options(Workload(task="code"), everything())
    offered = {str(option.spec.method) for option in ranked}
    assert offered == set(registry.names()), reasons
    # Candidates differ in the settings that matter: k, tree shapes and lookup grafts.
    labels = {option.label for option in ranked}
    assert {"draft_model k=2", "draft_model k=8", "ngram k=5", "medusa tree=fit:8",
            "eagle lookup=0", "lookahead"} <= labels  # fmt: skip


def test_a_method_registered_in_a_test_is_picked_with_no_picker_change():
    entry = MethodEntry("test_only", NoOptions, ngram.build, "exists only in this test")
    registry.register(entry)
    PICK["test_only"] = PickSupport(  # what the picker knows of it, in the picker's own table
        candidates=lambda context: [("test_only k=4", SpecConfig(method="test_only"))],
        prior=lambda spec, task: StepPrior(6.0, 0.1, 1.2, 5, "this test"),
    )
    try:
        choice = pick(Workload(task="qa"), SMOLLM2)
        assert choice.label == "test_only k=4" and choice.predicted_speedup > 4
        assert choice.quickdraft_json()["method"] == "test_only"
        assert all(e.speculative is None for e in choice.engines)  # no equivalent elsewhere
        restricted = pick(Workload(task="qa", methods=("ngram",)), SMOLLM2)
        assert restricted.spec.method in (Method.NGRAM, Method.AR)  # plain decoding: baseline
        assert {str(o.spec.method) for o in restricted.options} <= {"ngram", "ar"}
    finally:
        registry.unregister("test_only")
        del PICK["test_only"]


def test_short_outputs_and_very_high_temperature_do_not_speculate():
    assert pick(Workload(output_tokens=4), SMOLLM2).spec.method is Method.AR
    hot = pick(Workload(task="code", temperature=1.6), SMOLLM2)
    assert hot.spec.method is Method.AR and "temperature" in hot.reasons[0]
    assert hot.engine("vllm").speculative == {}  # plain serving, no speculative config


def test_smollm2_picks_eagle_with_the_measured_batch_policy_and_engine_configs(tmp_path):
    context = dataclasses.replace(SMOLLM2, export_dir=tmp_path)
    choice = pick(Workload(task="code"), context)
    assert choice.spec.method is Method.EAGLE and choice.predicted_speedup > 1.2
    # The batch threshold comes from the cost model: 3 requests, as engine_batch measured.
    assert choice.spec.disable_by_batch_size == 3
    spec = make_spec(**choice.quickdraft_json())  # generate's and serve's config as it is
    assert spec == choice.spec
    vllm, sglang = choice.engine("vllm"), choice.engine("sglang")
    check_vllm_config(vllm.speculative)
    check_sglang_flags(sglang.speculative)
    for config in (vllm, sglang):  # the drafter is exported first, into the folder it names
        assert len(config.prepare) == 1 and f"--engine {config.engine}" in config.prepare[0]
        assert str(tmp_path) in config.prepare[0]
    assert vllm.speculative["model"].startswith(str(tmp_path))
    assert vllm.command(choice.target_path).startswith("vllm serve ")
    assert sglang.command(choice.target_path).startswith("python -m sglang.launch_server ")


def test_a_draft_model_pair_picks_a_chain_with_real_paths():
    context = PickContext(target="smollm2-135m", draft="org/draft")
    choice = pick(Workload(task="code", methods=("ar", "draft_model")), context)
    assert choice.spec.method is Method.DRAFT_MODEL
    assert 2 <= choice.spec.num_speculative_tokens <= 8
    vllm = choice.engine("vllm").speculative
    assert vllm["model"] == "org/draft" and vllm["method"] == "draft_model"
    assert vllm["num_speculative_tokens"] == choice.spec.num_speculative_tokens
    check_vllm_config(vllm)
    check_sglang_flags(choice.engine("sglang").speculative)


def test_no_memory_for_a_draft_model_falls_back():
    context = PickContext(target="smollm2-135m", draft="org/draft")
    workload = Workload(
        task="code", memory_gb=0.1, draft_gb=1.0, methods=("ar", "draft_model", "ngram")
    )
    choice = pick(workload, context)
    assert choice.spec.method in (Method.NGRAM, Method.AR)
    assert any("draft model needs 1 GB" in reason for reason in choice.reasons)


def test_unavailable_methods_say_why(tmp_path, monkeypatch):
    """On a fresh cache too: the picker names the converted folder without converting the
    GGUF (minutes for the 1.5B) and says how it gets written."""
    monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path))
    choice = pick(Workload(task="code"), PickContext(target="qwen2.5-coder-1.5b"))
    said = "\n".join(choice.reasons)
    assert "draft_model: no draft model given" in said
    # An EAGLE drafter ships for the 1.5B, so eagle is modelled, not missing.
    assert "eagle on code" in said and "no EAGLE drafter" not in said
    assert "medusa: no Medusa heads" in said
    assert choice.target_path is not None and choice.target_path.startswith(str(tmp_path))
    assert list(tmp_path.iterdir()) == []
    assert "--target qwen2.5-coder-1.5b --max-new-tokens 1" in choice.as_text()


def test_higher_temperature_and_concurrency_never_raise_the_modelled_gain():
    context = PickContext(target="smollm2-135m", draft="org/draft")
    base = pick(Workload(task="code"), context).predicted_speedup
    assert pick(Workload(task="code", temperature=1.0), context).predicted_speedup <= base
    assert pick(Workload(task="code", concurrency=16), context).predicted_speedup <= base


def test_a_quantized_target_picks_shorter_cheaper_drafts():
    """A q4 target's step is cheaper and its verify pass grows faster per token (measured on
    SmolLM2: pick/costs.py), so a drafter costs more of a step: every drafting option models
    less gain, the chain gets no longer, and the reasons say why."""
    context = PickContext(target="smollm2-135m", draft="org/draft")
    workload = Workload(task="code", methods=("ar", "draft_model", "ngram"))
    quantized = dataclasses.replace(workload, weights="q4")
    plain, four = pick(workload, context), pick(quantized, context)
    assert four.predicted_speedup < plain.predicted_speedup
    if four.spec.method is plain.spec.method is Method.DRAFT_MODEL:
        assert four.spec.num_speculative_tokens <= plain.spec.num_speculative_tokens
    assert any("q4 target" in reason for reason in four.reasons) or four.label == "ar"
    with pytest.raises(ValueError, match="weights: q4 targets run on CPU"):
        Workload(weights="q4", device="gpu")


def test_verify_costs_follow_the_deployed_target():
    """The priors' own reference (float SmolLM2) leaves a prior as it is; another target's
    measured curve replaces the reference's at the same number of tokens, keeping what the
    prior adds above it; an unmeasured quantized target takes the 1.5B's figures."""
    reference = costs.MEASURED[costs.REFERENCE]["float"][1]
    assert costs.verify_cost(1.40, 16, "smollm2-135m", "float") == pytest.approx(1.40)
    assert costs.verify_cost(1.40, 16, None, "float") == pytest.approx(1.40)
    q4 = costs.MEASURED["qwen2.5-coder-1.5b"]["q4"][1]
    assert costs.verify_cost(reference[16], 16, "qwen2.5-coder-1.5b", "q4") == pytest.approx(q4[16])
    assert costs.verify_cost(1.40, 12, "org/other", "q4") == pytest.approx(
        costs.verify_cost(1.40, 12, "qwen2.5-coder-1.5b", "q4")
    )
    assert costs.at(q4, 12) == pytest.approx((q4[8] + q4[16]) / 2)
    assert costs.at(q4, 24) == pytest.approx(q4[16] + (q4[16] - q4[8]))
    assert costs.at(q4, 1) == 1.0
    # A 16-token tree costs less of a step on the 1.5B's q4 kernel than on SmolLM2's, whose
    # step is mostly overhead: the same prior models more gain there.
    prior = StepPrior(2.5, 0.1, 1.40, 16, "test")
    workload = Workload(task="code", weights="q4")
    assert modelled_speedup(prior, workload, target="qwen2.5-coder-1.5b") > modelled_speedup(
        prior, workload, target="smollm2-135m"
    )


def test_a_shipped_drafter_measured_on_its_target_brings_its_own_prior(tmp_path):
    """The 1.5B's drafter was benched on its q4 target: its figures, in that target's steps,
    rank it first there; the same network from another folder gets SmolLM2's priors."""
    shipped = PickContext(target="qwen2.5-coder-1.5b")
    choice = pick(Workload(task="code", weights="q4"), shipped)
    assert choice.spec.method is Method.EAGLE
    assert "qwen2.5-coder-1.5b's drafter" in choice.reasons[0]
    own = next(o for o in choice.options if o.label == "eagle")
    assert (own.prior.target, own.prior.weights) == ("qwen2.5-coder-1.5b", "q4")
    # Measured on the deployment itself: no conversion.
    assert choice.predicted_speedup == pytest.approx(
        own.prior.expected_tokens / (own.prior.draft_cost + own.prior.verify_cost)
    )
    mine = tmp_path / "qwen2.5-coder-1.5b"  # named alike, but not the shipped folder
    mine.mkdir()
    elsewhere = PickContext(target="qwen2.5-coder-1.5b", eagle_dir=mine)
    moved = next(o for o in options(Workload(task="code"), elsewhere)[0] if o.label == "eagle")
    assert moved.prior.target == costs.REFERENCE


def test_a_shipped_drafters_costs_are_those_of_each_task_kind():
    """A dynamic tree verifies more tokens where its drafter is sure: the 0.5B's bench measured
    a code step at 2.03 decode steps and a conversation step at 1.23, and its prior on each
    kind models what that kind measured (code decoded 1.85x faster by the bench's means; one
    mean cost for every kind had modelled 2.30x). A kind the bench lacks takes the mean, and
    a cost may be one number for every kind."""
    from quickdraft.bench.tasks import TASK_KINDS
    from quickdraft.drafters.eagle.io import ARTIFACTS
    from quickdraft.pick import priors

    drafter = ARTIFACTS / "qwen2.5-coder-0.5b"
    code = priors.eagle("eagle", "code", drafter)
    chat = priors.eagle("eagle", "conversation", drafter)
    _, draft, verify, _ = priors.own_bench(drafter)[1]["eagle"]
    assert (code.draft_cost, code.verify_cost) == (draft["code"], verify["code"])
    assert (chat.draft_cost, chat.verify_cost) == (draft["conversation"], verify["conversation"])
    assert code.verify_cost > chat.verify_cost  # its code steps carry more tokens
    other = priors.eagle("eagle", "other", drafter)
    assert other.verify_cost == pytest.approx(sum(verify[k] for k in TASK_KINDS) / len(TASK_KINDS))
    lengths = {"code": 3.0, "qa": 2.0}
    row = (lengths, {"code": 0.5}, 2, 9)  # a kind missing, an int cost
    assert priors._prior(row, "qa", "test").draft_cost == 0.5
    assert priors._prior(row, "code", "test").verify_cost == 2.0
    chosen = pick(Workload(task="conversation", weights="q4"),
                  PickContext(target="qwen2.5-coder-0.5b"))  # fmt: skip
    assert chosen.spec.method is Method.EAGLE


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("task", "poetry"),
        ("temperature", -1.0),
        ("output_tokens", 0),
        ("concurrency", 0),
        ("methods", ("eagle9",)),
        ("device", "tpu"),
        ("weights", "q3"),
    ],
)
def test_bad_workloads_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        Workload(**{field: value})


def test_pick_command_prints_reasons_and_every_engine(capsys, tmp_path):
    assert main(["pick", "--task", "code", "--export-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    line = next(text for text in out.splitlines() if text.startswith("quickdraft: "))
    assert json.loads(line.removeprefix("quickdraft: "))["method"] == "eagle"
    assert "because:" in out and "vllm serve" in out and "sglang.launch_server" in out
    assert main(["pick", "--task", "code", "--json", "--methods", "ar,lookahead"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["quickdraft"]["method"] in ("lookahead", "ar")
    if data["quickdraft"]["method"] == "lookahead":  # neither engine has it: said, not faked
        assert data["engines"]["vllm"]["command"] is None
        assert "lookahead" in data["engines"]["vllm"]["note"]
    assert main(["pick", "--methods", "eagle9"]) == 2
