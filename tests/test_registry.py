"""A method is one module and one registry line: a test-only drafter with its own options,
registered here, runs through generate, the CLI, the bench and the picker without any other
module knowing it."""

import dataclasses
import json

import pytest
import torch

from quickdraft import SamplingParams, SpecConfig, generate
from quickdraft.cli import main
from quickdraft.config import MethodOptions, check_range
from quickdraft.drafters import registry
from quickdraft.drafters.base import Batch, Draft, Needs, Stateless
from quickdraft.drafters.registry import MethodEntry, make_spec
from quickdraft.models import NGramLM
from quickdraft.pick.context import PickContext
from quickdraft.pick.picker import Workload, options, pick


@dataclasses.dataclass(frozen=True, slots=True)
class RepeatOptions(MethodOptions):
    """repeat_offset: how far back the repeated token sits (1: the pending one)."""

    repeat_offset: int = 1

    def __post_init__(self) -> None:
        check_range("repeat_offset", self.repeat_offset, 1, 8, integer=True)


class RepeatPending(Stateless):
    """Drafts the token ``offset`` back, k times: deterministic, often wrong, always exact."""

    head_rows = 0

    def __init__(self, vocab_size: int, k: int, offset: int):
        self.vocab_size, self.needs, self.offset = vocab_size, Needs(tokens=k, depth=k), offset

    def propose(self, batch: Batch) -> Draft:
        back = (batch.lengths - self.offset).clamp_min(0).unsqueeze(1)
        return Draft.chain(batch.tokens.gather(1, back).expand(-1, self.needs.tokens).cpu())

    def describe(self) -> str:
        return f"k={self.needs.tokens}, offset {self.offset}"


def build(spec, context):
    options = spec.options
    return RepeatPending(
        context.target.vocab_size, spec.num_speculative_tokens, options.repeat_offset
    )


@pytest.fixture
def repeat_method():
    entry = MethodEntry("repeat_pending", RepeatOptions, build, "test only", default_k=3)
    registry.register(entry)
    yield "repeat_pending"
    registry.unregister("repeat_pending")


def test_a_registered_method_runs_through_generate(repeat_method):
    target = NGramLM.random(30, order=2, seed=3, sharpness=2.0)
    greedy = SamplingParams(temperature=0, max_new_tokens=24)
    expected = generate(target, [4, 4, 4], sampling=greedy).token_ids
    out = generate(target, [4, 4, 4], sampling=greedy, spec=SpecConfig(method=repeat_method))
    assert out.token_ids == expected and out.stats.k == 4  # SpecConfig's k
    spec = make_spec(repeat_method, repeat_offset=2)
    assert spec.num_speculative_tokens == 3 and spec.options == RepeatOptions(2)
    assert generate(target, [4, 4, 4], sampling=greedy, spec=spec).token_ids == expected
    with pytest.raises(ValueError, match="tree applies to methods medusa and eagle only"):
        make_spec(method=repeat_method, tree="4,2,1")
    with pytest.raises(ValueError, match="repeat_offset applies to method repeat_pending only"):
        make_spec("ngram", repeat_offset=2)
    with pytest.raises(ValueError, match=r"repeat_offset must be in 1\.\.8"):
        make_spec(repeat_method, repeat_offset=0)
    with pytest.raises(ValueError, match="options: method repeat_pending takes RepeatOptions"):
        generate(target, [4], spec=SpecConfig(repeat_method, options=make_spec("ngram").options))


def test_an_unknown_method_lists_the_registered_ones(repeat_method):
    target = NGramLM.random(30, order=2, seed=3)
    with pytest.raises(ValueError, match=r"method must be one of .*repeat_pending"):
        generate(target, [4], spec=SpecConfig(method="nope"))
    with pytest.raises(ValueError, match=r"method must be one of .*repeat_pending"):
        make_spec("nope")


def test_a_registered_method_runs_through_the_picker(repeat_method):
    context = PickContext(target="smollm2-135m")
    ranked, _ = options(Workload(task="qa"), context)
    mine = [o for o in ranked if o.spec.method == repeat_method]
    assert [o.label for o in mine] == ["repeat_pending k=3"]
    assert mine[0].speedup == 1.0 and "calibrate" in mine[0].prior.source  # no prior known
    only = pick(Workload(task="qa", methods=(repeat_method,)), context)
    assert only.spec.method == "ar"  # a neutral prior never beats plain decoding unmeasured
    assert {str(o.spec.method) for o in only.options} == {repeat_method, "ar"}


def test_a_registered_method_runs_through_the_cli_and_the_bench(repeat_method, capsys, tmp_path):
    torch.set_num_threads(2)
    base = ["--target", "smollm2-135m", "--max-new-tokens", "12"]
    assert main(["generate", "hello", "--method", "ar", "--json", *base]) == 0
    plain = json.loads(capsys.readouterr().out)["token_ids"]
    assert main(["generate", "hello", "--method", repeat_method, "--json", *base]) == 0
    assert json.loads(capsys.readouterr().out)["token_ids"] == plain
    assert main(["generate", "hello", "--method", repeat_method, *base]) == 0
    assert "repeat_pending, k=3, offset 1" in capsys.readouterr().out
    out = tmp_path / "bench"
    bench = ["bench", "--methods", f"ar,{repeat_method}@2", "--tasks", "code"]
    assert main([*bench, "--prompts-per-task", "1", *base, "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert f"{repeat_method} k=2" in results["results"]["code"]
