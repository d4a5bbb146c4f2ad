"""A method is one module and one registry entry: a test-only drafter, registered here, runs
through generate, the CLI and the bench without any other module knowing it."""

import json

import pytest
import torch

from quickdraft import SamplingParams, SpecConfig, generate, methods
from quickdraft.cli import main
from quickdraft.drafters.base import Batch, Draft, Needs, Stateless
from quickdraft.models import NGramLM


class RepeatPending(Stateless):
    """Drafts the pending token k times: deterministic, often wrong, always exact."""

    def __init__(self, vocab_size: int, k: int):
        self.vocab_size, self.needs = vocab_size, Needs(tokens=k, depth=k)

    def propose(self, batch: Batch) -> Draft:
        pending = batch.tokens.gather(1, (batch.lengths - 1).unsqueeze(1))
        return Draft.chain(pending.expand(-1, self.needs.tokens).cpu())


@pytest.fixture
def repeat_method():
    methods.register(
        methods.MethodEntry(
            "repeat_pending",
            "test only: the pending token, k times",
            lambda spec, context: RepeatPending(
                context.target.vocab_size, spec.num_speculative_tokens
            ),
            default_k=3,
        )
    )
    yield "repeat_pending"
    methods.unregister("repeat_pending")


def test_a_registered_method_runs_through_generate(repeat_method):
    target = NGramLM.random(30, order=2, seed=3, sharpness=2.0)
    greedy = SamplingParams(temperature=0, max_new_tokens=24)
    expected = generate(target, [4, 4, 4], sampling=greedy).token_ids
    out = generate(target, [4, 4, 4], sampling=greedy, spec=SpecConfig(method=repeat_method))
    assert out.token_ids == expected and out.stats.k == 4  # SpecConfig's k
    with pytest.raises(ValueError, match="tree applies to methods medusa and eagle only"):
        SpecConfig(method=repeat_method, tree="4,2,1")


def test_an_unknown_method_lists_the_registered_ones(repeat_method):
    with pytest.raises(ValueError, match=r"method must be one of .*repeat_pending"):
        SpecConfig(method="nope")


def test_a_registered_method_runs_through_the_cli_and_the_bench(repeat_method, capsys, tmp_path):
    torch.set_num_threads(2)
    base = ["--target", "smollm2-135m", "--max-new-tokens", "12"]
    assert main(["generate", "hello", "--method", "ar", "--json", *base]) == 0
    plain = json.loads(capsys.readouterr().out)["token_ids"]
    assert main(["generate", "hello", "--method", repeat_method, "--json", *base]) == 0
    assert json.loads(capsys.readouterr().out)["token_ids"] == plain
    out = tmp_path / "bench"
    bench = ["bench", "--methods", f"ar,{repeat_method}@2", "--tasks", "code"]
    assert main([*bench, "--prompts-per-task", "1", *base, "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert f"{repeat_method} k=2" in results["results"]["code"]
