"""Checks and timings for an accelerator, in one script that needs nothing but the working tree,
torch and transformers (no model files, no gguf): tiny random models for correctness, random
weights shaped like real models for cost.

1. Correctness on the device: every method through the engine (ragged prompts, requests
   joining mid-run) gives plain decoding's tokens; a seeded request gives the same tokens
   alone and in a batch; the conformance rows on a tiny Llama (EAGLE trees) pass.
2. Cost on the device: for random weights shaped like SmolLM2-135M, Qwen2.5-0.5B/1.5B and a
   Llama-3-8B, the decode step (1 token) and verify passes of 2..64 tokens at batch 1 and 8
   after a 512-token context (the verify/decode cost ratio speculation lives on), and the
   EAGLE drafter's propose() for the device's default tree. Acceptance needs real weights:
   it comes from the CPU benchmarks, which these ratios turn into speed.

    python benchmarks/gpu_check.py --device cuda --out $OUT/gpu_check.json
    python benchmarks/gpu_check.py --device cpu --quick     # a smoke test anywhere
    python benchmarks/gpu_check.py --render results/gpu_check_h200.json  # its report
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from quickdraft import Engine, SamplingParams, generate
from quickdraft.config import AcceptRule
from quickdraft.conformance import EAGLE_ROWS, Case, run_case
from quickdraft.drafters.base import Batch, StepResult
from quickdraft.drafters.draft_model.drafter import DraftModelDrafter
from quickdraft.drafters.eagle.drafter import EagleDrafter
from quickdraft.drafters.eagle.net import EagleConfig, EagleNet
from quickdraft.drafters.eagle.tree import DEFAULT_TREES, DynamicTree
from quickdraft.drafters.lookahead import LookaheadConfig, LookaheadDrafter
from quickdraft.drafters.medusa.drafter import MedusaDrafter
from quickdraft.drafters.medusa.net import MedusaConfig, MedusaHeads
from quickdraft.drafters.ngram import NGramDrafter
from quickdraft.models.base import Slots
from quickdraft.models.llama import LlamaRunner

SHAPES = {
    "smollm2-135m": dict(hidden=576, inter=1536, layers=30, heads=9, kv=3, vocab=49152,
                         tied=True, kind="llama"),
    "qwen2.5-0.5b": dict(hidden=896, inter=4864, layers=24, heads=14, kv=2, vocab=151936,
                         tied=True, kind="qwen2"),
    "qwen2.5-1.5b": dict(hidden=1536, inter=8960, layers=28, heads=12, kv=2, vocab=151936,
                         tied=True, kind="qwen2"),
    "llama-3-8b": dict(hidden=4096, inter=14336, layers=32, heads=32, kv=8, vocab=128256,
                       tied=False, kind="llama"),
}  # fmt: skip


def random_runner(shape: dict, device: str, dtype: torch.dtype, scale: float = 0.02, seed=0):
    """A native runner with random weights of ``shape``, made on the device directly."""
    torch.manual_seed(seed)
    hidden, inter, heads, kv = shape["hidden"], shape["inter"], shape["heads"], shape["kv"]
    dim = hidden // heads
    config = {
        "model_type": shape["kind"], "vocab_size": shape["vocab"], "hidden_size": hidden,
        "intermediate_size": inter, "num_hidden_layers": shape["layers"],
        "num_attention_heads": heads, "num_key_value_heads": kv,
        "max_position_embeddings": 4096, "tie_word_embeddings": shape["tied"],
    }  # fmt: skip

    def weight(*size: int) -> torch.Tensor:
        return torch.randn(*size, device=device, dtype=dtype) * scale

    weights = {"model.embed_tokens.weight": weight(shape["vocab"], hidden)}
    for i in range(shape["layers"]):
        p = f"model.layers.{i}."
        for name, rows, columns in (
            ("self_attn.q_proj", heads * dim, hidden), ("self_attn.k_proj", kv * dim, hidden),
            ("self_attn.v_proj", kv * dim, hidden), ("self_attn.o_proj", hidden, heads * dim),
            ("mlp.gate_proj", inter, hidden), ("mlp.up_proj", inter, hidden),
            ("mlp.down_proj", hidden, inter),
        ):  # fmt: skip
            weights[p + name + ".weight"] = weight(rows, columns)
        if shape["kind"] == "qwen2":
            for name, rows in (("q_proj", heads * dim), ("k_proj", kv * dim), ("v_proj", kv * dim)):
                weights[p + f"self_attn.{name}.bias"] = weight(rows)
        for norm in ("input_layernorm", "post_attention_layernorm"):
            weights[p + norm + ".weight"] = torch.ones(hidden, device=device, dtype=dtype)
    weights["model.norm.weight"] = torch.ones(hidden, device=device, dtype=dtype)
    if not shape["tied"]:
        weights["lm_head.weight"] = weight(shape["vocab"], hidden)
    return LlamaRunner.from_state_dict(config, weights, dtype=dtype, device=device)


TINY = dict(hidden=64, inter=128, layers=4, heads=4, kv=2, vocab=101, tied=False, kind="llama")


def tiny_drafters(target: LlamaRunner) -> dict:
    torch.manual_seed(1)
    net = EagleNet(EagleConfig.for_target(target.config, "eagle3", 60))
    heads = MedusaHeads(MedusaConfig(64, target.vocab_size, 3))
    with torch.no_grad():
        for parameter in [*net.parameters(), *heads.parameters()]:
            if parameter.dim() == 2:
                parameter.normal_(0, 0.3)
        net.draft_vocab = torch.randperm(target.vocab_size)[:60]
    return {
        "draft_model": DraftModelDrafter(target.truncated(2), 3),
        "ngram": NGramDrafter(target.vocab_size, 4),
        "medusa": MedusaDrafter(target, heads.eval()),
        "eagle": EagleDrafter(target, net.eval(), DynamicTree(3, 2, 5), lookup=2),
        "lookahead": LookaheadDrafter(target.vocab_size, LookaheadConfig(2, 3, 2)),
    }


def correctness(device: str, quick: bool) -> dict:
    target = random_runner(TINY, device, torch.float32, scale=0.5)
    prompts = [[5, 17, 3, 99, 42, 5, 17], [1, 2, 3, 1, 2, 3, 1, 2], [7], list(range(60, 81))]
    greedy = SamplingParams(temperature=0, max_new_tokens=20)
    expected = [generate(target, p, sampling=greedy).token_ids for p in prompts]
    always = {"disable_by_batch_size": None}
    results: dict = {"greedy_identity": {}, "seeded_batch_invariance": {}}
    for method, drafter in tiny_drafters(target).items():
        engine = Engine(target, drafter, **always, max_batch=2, prefill_chunk=8)
        outputs = {}
        for step in range(200):
            if step < len(prompts):
                engine.add_request(prompts[step], greedy, request_id=str(step))
            outputs.update((o.request_id, o.token_ids) for o in engine.step() if o.finished)
            if step >= len(prompts) and not engine.has_unfinished():
                break
        same = [outputs[str(i)] == expected[i] for i in range(len(prompts))]
        results["greedy_identity"][method] = all(same)
    seeded = SamplingParams(temperature=0.9, max_new_tokens=16, seed=7)
    for method in ("draft_model", "eagle"):
        alone = Engine(target, tiny_drafters(target)[method], **always)
        alone.add_request(prompts[0], seeded, "x")
        batched = Engine(target, tiny_drafters(target)[method], **always, max_batch=3)
        batched.add_request(prompts[1], SamplingParams(max_new_tokens=12), "o")
        batched.add_request(prompts[0], seeded, "x")
        got = [
            next(o.token_ids for o in _drain(e) if o.request_id == "x") for e in (alone, batched)
        ]
        results["seeded_batch_invariance"][method] = got[0] == got[1]
    rows = EAGLE_ROWS[:1] if quick else EAGLE_ROWS
    results["conformance"] = {}
    for rule in (AcceptRule.REJECTION_SAMPLING, AcceptRule.GREEDY):
        for tree in rows:
            case = Case(rule, 1.0, 0, 1.0, 3, tree=tree)
            outcome = run_case(case, samples=5_000 if quick else 50_000, device=device)
            results["conformance"][f"{rule.value} {tree}"] = {
                "p_value": outcome.p_value,
                "passed": outcome.p_value >= 1e-3,
            }
    return results


def _drain(engine: Engine) -> list:
    done = []
    while engine.has_unfinished():
        done += [o for o in engine.step() if o.finished]
    return done


def median_ms(fn, repeats: int, device: str) -> float:
    """Median ms of ``fn()`` over ``repeats`` runs after two warm-ups."""
    samples = []
    for index in range(repeats + 2):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        if index >= 2:
            samples.append(1000 * (time.perf_counter() - start))
    return statistics.median(samples)


def costs(name: str, device: str, dtype: torch.dtype, quick: bool) -> dict:
    shape = SHAPES[name]
    target = random_runner(shape, device, dtype)
    context, repeats = (128, 3) if quick else (512, 10)
    widths = (1, 2, 4, 8) if quick else (1, 2, 4, 8, 16, 32, 64)
    result: dict = {"context": context, "verify_ms": {}}
    for batch in (1, 8):
        cache = target.new_cache(batch, context + 70)
        prefix = torch.randint(0, shape["vocab"], (batch, context), device=device)
        positions = torch.arange(context, device=device).expand(batch, -1)
        target.forward(prefix, positions, cache)
        cache.commit(context)
        times = {}
        for width in widths:
            tokens = torch.randint(0, shape["vocab"], (batch, width), device=device)
            pos = context + torch.arange(width, device=device).expand(batch, -1)

            def verify(tokens=tokens, pos=pos, cache=cache) -> None:
                target.forward(tokens, pos, cache)

            times[width] = median_ms(verify, repeats, device)
        result["verify_ms"][f"batch {batch}"] = times
        result[f"verify_over_decode batch {batch}"] = {w: t / times[1] for w, t in times.items()}
    # The EAGLE drafter's propose() for the device's default tree, after the same context.
    torch.manual_seed(2)
    net = EagleNet(EagleConfig.for_target(target.config, "eagle3", min(32000, shape["vocab"])))
    net.draft_vocab = torch.randperm(shape["vocab"])[: net.config.draft_vocab_size]
    tree = DEFAULT_TREES.get(device, DEFAULT_TREES["cpu"])
    drafter = EagleDrafter(target.with_taps(()), net.eval(), tree, lookup=0)
    batch = Batch.from_rows([list(range(context))], SamplingParams(temperature=0), room=128)
    batch = Batch(batch.tokens.to(device), batch.lengths.to(device),
                  Slots.of([0], device), batch.sampling, batch.generators,
                  batch.generator)  # fmt: skip
    tapped = target.with_taps(drafter.needs.taps)
    cache = tapped.new_cache(1, context)
    positions = torch.arange(context, device=device)[None]
    full = tapped.forward(batch.tokens[:, :context], positions, cache)
    drafter.reserve(1, batch.capacity)
    kept = torch.tensor([context - 1], device=device)
    taps = {i: t[:, : context - 1] for i, t in full.taps.items()}
    drafter.begin(StepResult(batch, kept, full.hidden[:, : context - 1], taps))
    result["eagle_tree"] = f"{tree.depth},{tree.topk},{tree.tokens}"
    result["eagle_propose_ms"] = median_ms(lambda: drafter.propose(batch), repeats, device)
    if device == "cuda":
        torch.cuda.empty_cache()
    return result


def methods_on(name: str, device: str, dtype: torch.dtype, quick: bool) -> dict:
    """Plain decoding against each method on random weights shaped like ``name``: ms per
    step and tokens per step (random weights accept little: the step costs are the point)."""
    target = random_runner(SHAPES[name], device, dtype)
    vocab = target.vocab_size
    torch.manual_seed(3)
    net = EagleNet(EagleConfig.for_target(target.config, "eagle3", min(32000, vocab)))
    net.draft_vocab = torch.randperm(vocab)[: net.config.draft_vocab_size]
    hidden = target.config.hidden_size
    runs = {
        "ar": None,
        "draft_model": DraftModelDrafter(
            target.truncated(max(1, target.config.num_layers // 5)), 4
        ),
        "ngram": NGramDrafter(vocab, 5),
        "medusa": MedusaDrafter(target, MedusaHeads(MedusaConfig(hidden, vocab, 3)).eval()),
        "eagle": EagleDrafter(target, net.eval(), DEFAULT_TREES.get(device), lookup=5),
        "lookahead": LookaheadDrafter(
            vocab, LookaheadConfig(15, 5, 15) if device == "cuda" else None
        ),
    }
    prompt = list(range(100, 100 + (64 if quick else 256)))
    sampling = SamplingParams(temperature=0, max_new_tokens=16 if quick else 64, ignore_eos=True)
    result = {}
    for method, drafter in runs.items():
        generate(target, prompt, sampling=sampling, draft=drafter)  # warm-up
        if device == "cuda":
            torch.cuda.synchronize()
        out = generate(target, prompt, sampling=sampling, draft=drafter)
        steps = out.stats.target_forwards
        decode = out.stats.time_total - out.stats.time_prefill
        result[method] = {
            "ms_per_step": 1000 * decode / steps,
            "tokens_per_step": len(out.token_ids) / steps,
            "tokens_per_second": len(out.token_ids) / decode,
        }
    return result


def render(report: dict) -> str:
    """A markdown summary of a report: the checks, then each shape's verify/decode ratios."""
    checks = report["correctness"]
    lines = [
        f"# Device check: {report['device']}, torch {report['torch']}",
        "",
        "Random weights shaped like each model (bf16), 512-token context; medians of 10.",
        "",
        "Greedy identity through the engine: "
        + ", ".join(f"{m} {'ok' if v else 'FAILED'}" for m, v in checks["greedy_identity"].items())
        + ". Seeded batch invariance: "
        + ", ".join(
            f"{m} {'ok' if v else 'FAILED'}" for m, v in checks["seeded_batch_invariance"].items()
        )
        + ". Conformance (chi-square on the joint first tokens): "
        + ", ".join(f"{c} p={v['p_value']:.3f}" for c, v in checks["conformance"].items())
        + ".",
        "",
        "| shape | batch | decode ms | " + " | ".join(f"{w} tokens" for w in WIDTHS) + " |",
        "|---|---|---|" + "---|" * len(WIDTHS),
    ]
    for name, cost in report["costs"].items():
        for batch in ("batch 1", "batch 8"):
            times = cost["verify_ms"][batch]
            ratios = [f"{times[str(w)] / times['1']:.2f}x" for w in WIDTHS if str(w) in times]
            lines.append(
                f"| {name} | {batch[6:]} | {times['1']:.1f} | " + " | ".join(ratios) + " |"
            )
    lines += ["", "EAGLE propose() for the device's default tree: " + ", ".join(
        f"{name} {cost['eagle_propose_ms']:.1f} ms ({cost['eagle_tree']})"
        for name, cost in report["costs"].items()
    ) + ".", "", "Methods on SmolLM2-135M's shape (random weights accept little; the step costs "
        "are the point):", "", "| method | ms a step | tokens a step | tokens/s |",
        "|---|---|---|---|"]  # fmt: skip
    for method, row in report["methods_smollm2_shape"].items():
        lines.append(
            f"| {method} | {row['ms_per_step']:.1f} | {row['tokens_per_step']:.2f} | "
            f"{row['tokens_per_second']:.1f} |"
        )
    return "\n".join(lines) + "\n"


WIDTHS = (1, 2, 4, 8, 16, 32, 64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--render", type=Path, default=None, help="print a saved report's summary")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke test")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.render is not None:
        print(render(json.loads(args.render.read_text())), end="")
        return
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    started = time.perf_counter()
    report: dict = {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "torch": torch.__version__,
    }
    report["correctness"] = correctness(args.device, args.quick)
    print(json.dumps(report["correctness"], indent=1), flush=True)
    report["methods_smollm2_shape"] = methods_on("smollm2-135m", args.device, dtype, args.quick)
    print(json.dumps(report["methods_smollm2_shape"]), flush=True)
    report["costs"] = {}
    for name in args.shapes.split(","):
        report["costs"][name] = costs(name, args.device, dtype, args.quick)
        print(name, json.dumps(report["costs"][name]), flush=True)
    report["seconds"] = time.perf_counter() - started
    text = json.dumps(report, indent=2, default=str)
    if args.out is not None:
        args.out.write_text(text + "\n")
    checks = report["correctness"]
    passed = (
        all(checks["greedy_identity"].values())
        and all(checks["seeded_batch_invariance"].values())
        and all(c["passed"] for c in checks["conformance"].values())
    )
    print("all checks passed" if passed else "SOME CHECKS FAILED")
    raise SystemExit(0 if passed else 1)


if __name__ == "__main__":
    main()
