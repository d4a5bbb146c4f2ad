"""Drafter training across processes: two CPU processes (gloo, started by torchrun as any
launcher would) train the same EAGLE layer and Medusa heads as one process on the same
global batch, also when each cuts its share into accumulation steps."""

import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import tiny_folder_and_corpus
from safetensors.torch import load_file

from quickdraft.cli import main


def launch_two(argv: list[str], cwd) -> None:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node", "2", "-m", "quickdraft", *argv]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("wrote ") == 1, done.stdout  # the first process reports alone


def assert_same_weights(one, two, rtol: float = 1e-4) -> None:
    assert one.keys() == two.keys()
    for name in one:
        torch.testing.assert_close(one[name], two[name], rtol=rtol, atol=1e-5, msg=name)


def trained_state(cache, kind: str) -> dict:
    """The float32 weights a run ended with: its last saved training state."""
    state = next(cache.glob(f"{kind}-[0-9a-f]*/latest")).parent
    return load_file(state / (state / "latest").read_text().strip() / "model.safetensors")


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
def test_two_processes_train_what_one_does(tmp_path, smollm2, capsys, kind):
    folder, corpus = tiny_folder_and_corpus(tmp_path, smollm2, "llama-tied")
    argv = ["train", kind, "--target", str(folder), "--data", str(corpus),
            "--budget-tokens", "300", "--epochs", "2", "--threads", "1"]  # fmt: skip
    if kind == "eagle":
        argv += ["--draft-vocab", "256", "--batch-size", "8"]
    else:
        argv += ["--batch-size", "32"]
    one, two = tmp_path / "one", tmp_path / "two"
    assert main([*argv, "--out", str(one), "--cache", str(tmp_path / "cache-one")]) == 0
    capsys.readouterr()
    # Two processes, each cutting its half of every batch in two: four backward passes.
    launch_two(
        [*argv, "--out", str(two), "--cache", str(tmp_path / "cache-two"),
         "--accumulation-steps", "2"],
        tmp_path,
    )  # fmt: skip
    # The float32 weights agree to the tolerance; the fp16 files that ship them may then
    # round an element to the neighbouring fp16 value (a relative step of 2^-10).
    assert_same_weights(
        trained_state(tmp_path / "cache-one", kind), trained_state(tmp_path / "cache-two", kind)
    )
    weights = f"{kind}.safetensors"
    assert_same_weights(load_file(one / weights), load_file(two / weights), rtol=2**-10)
    histories = [json.loads((run / "metrics.json").read_text())["history"] for run in (one, two)]
    for a, b in zip(*histories, strict=True):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-5)
    # Every process's random state was saved: the two-process run resumes as itself.
    state = next((tmp_path / "cache-two").glob(f"{kind}-[0-9a-f]*/latest")).parent
    saved = state / (state / "latest").read_text().strip()
    assert {p.name for p in saved.glob("random_states_*.pkl")} == {
        "random_states_0.pkl",
        "random_states_1.pkl",
    }


def test_a_batch_too_small_to_cut_names_the_field(tmp_path):
    from quickdraft.drafters.medusa.net import MedusaConfig, MedusaHeads
    from quickdraft.train.common import Run, Scaling

    heads = MedusaHeads(MedusaConfig(8, 16, 1, 1, False))
    optimizer = torch.optim.AdamW(heads.parameters())
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    run = Run(heads, optimizer, schedule, tmp_path / "state", {}, Scaling(accumulation_steps=3))
    with pytest.raises(ValueError, match="batch_size"):
        run.check([[1, 2, 3], [4, 5]])
    with pytest.raises(ValueError, match="accumulation_steps"):
        Scaling(accumulation_steps=0)
    with pytest.raises(ValueError, match="mixed_precision"):
        Scaling(mixed_precision="fp8")


def test_bf16_mixed_precision_trains_on_cpu_too(tmp_path):
    """The mixed-precision path (autocast through accelerate) runs and learns where the device
    has bf16; CPUs have it, so the path is exercised here, not only on a GPU."""
    from test_medusa import synthetic_features

    from quickdraft.drafters.medusa.net import MedusaHeads
    from quickdraft.train.common import Scaling
    from quickdraft.train.medusa import MedusaTraining, evaluate, split, train_heads

    features, lm_head = synthetic_features()
    settings = MedusaTraining(num_heads=2, epochs=2, batch_size=64, lr=1e-2, soft_labels=False)
    heads, metrics = train_heads(
        features, lm_head, settings, tmp_path / "bf16", scaling=Scaling(mixed_precision="bf16")
    )
    _, held = split(features, settings.validation_fraction, settings.seed)
    untrained = evaluate(MedusaHeads(heads.config), features, held, lm_head, 2)
    assert metrics["held_out"][0]["top1"] > untrained[0]["top1"] + 0.3, (metrics, untrained)
    saved = json.loads(next((tmp_path / "bf16").glob("step-*/progress.json")).read_text())
    assert saved["identity"]["mixed_precision"] == "bf16"


def test_cpu_training_says_how_to_keep_the_allocator_from_zeroing_pages(tmp_path):
    """On Linux without a GPU, a training run not under jemalloc or tcmalloc gets one line
    saying how to run it so (the library's path when it is installed); otherwise none."""
    from quickdraft.train.common import allocator_note

    library = tmp_path / "libjemalloc.so.2"
    assert allocator_note({}, [library], gpu=False).endswith(  # not installed
        "then LD_PRELOAD it with MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1"
    )
    library.touch()
    note = allocator_note({"LD_PRELOAD": ""}, [library], gpu=False)
    assert f"LD_PRELOAD={library} MALLOC_CONF=dirty_decay_ms:-1" in note
    assert allocator_note({"LD_PRELOAD": str(library)}, [library], gpu=False) is None
    assert allocator_note({"LD_PRELOAD": "/lib/libtcmalloc.so.4"}, [library], gpu=False) is None
    assert allocator_note({}, [library], gpu=True) is None
