"""quickdraft against llama.cpp on the same GGUF files: Qwen2.5-Coder-1.5B (Q4_K_M), with the
0.5B as draft, 2 threads, greedy, in one interleaved run.

Rows, prompt by prompt in a rotating order (the machine's speed drifts; every row sees the
same conditions); ``--rounds N`` runs it all N times, rotated anew, each round with every
drafter built afresh (nothing learned from one round's replies reaches the next), and keeps
each prompt's run of the median decode time (on a shared host one prompt's rate can swing
30% between runs; use an odd N); "x own plain" is the median over every run of a row's rate
against its plain row's on the same prompt in the same round:

- llama.cpp (llama-cpp-python, built from source, see below): plain decoding; speculative
  decoding with the 0.5B GGUF as its draft model (k tokens a step, the draft keeping its KV
  cache between steps); prompt lookup (its ``LlamaPromptLookupDecoding``);
- quickdraft, for each target quantization of ``--quants`` (the GGUF's weights dequantized to
  float32, the same weights in quickdraft's int8, and on its 4-bit kernel, q4): plain
  decoding, the draft model at k = 3 and 5 (the 0.5B in int8; for the int8 target also k = 4
  with the draft's head cut to FR-Spec's 32,768 most frequent tokens), prompt lookup at k = 5.
  The float32 target is the reference the "agrees with float" column compares with; with
  other quantizations given it runs plain decoding only. ``--draft none`` leaves out every
  draft-model row (the 0.5B's GGUF is then not needed).

Every row gets the same token ids (quickdraft's tokenizer and chat template) and the same
budget. Prompts: code (HumanEval-form completions of standard-library functions,
``train.sources.code_prompts``) and chat (the bench's translation, qa, conversation and
summarization items from the 12th on, which no calibration or tuning used). The first half of
each kind chooses each quantization's best configuration; the table quotes it on the other
half (held out), beside every row's figures on all prompts.

Figures: decode tokens/s (new tokens after the first over the time after it: the first
token comes from the prefill) and end-to-end tokens/s, medians over prompts; quickdraft's
new tokens a target forward (bonus included, means over prompts: what no host changes);
whether a row's outputs equal its own plain decoding's; and agreement with the float model's
tokens (the float32 quickdraft target: the share of its tokens before the first difference).
The floors are the time one token needs at the measured memory bandwidth (weight bytes) and
at the measured peak arithmetic rate (2 FLOPs a parameter).

llama.cpp is not a project dependency: build it in the benchmark's own folder, with every
vector extension this VM allows (AMX tiles are listed in /proc/cpuinfo but fault here; set
GGML_AVX_VNNI=OFF on a CPU without ``avx_vnni`` in /proc/cpuinfo, such as AMD's Zen 4; for an
AVX2-only comparison on a CPU with more, build with every AVX-512 and VNNI option OFF and run
quickdraft with ``QUICKDRAFT_Q4_PATH=avx2``, which the report's machine line records):

    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \\
      -DGGML_AVX_VNNI=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON \\
      -DGGML_AVX512_BF16=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF" \\
      pip install --no-deps --target build/llama-cpp llama-cpp-python==0.3.36 diskcache
    python benchmarks/vs_llama_cpp.py --llama-cpp build/llama-cpp --threads 2
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from quickdraft import SamplingParams, SpecConfig, generate, kernels
from quickdraft.bench.machine import describe_machine
from quickdraft.bench.tasks import TASK_DIR, load_tasks
from quickdraft.drafters.eagle.io import ARTIFACTS as EAGLE_ARTIFACTS
from quickdraft.drafters.registry import build_drafter, make_spec
from quickdraft.models.loading import load_model
from quickdraft.models.sources import packaged_gguf
from quickdraft.train.sources import code_prompts

RESULTS = Path(__file__).parent / "results"
CHAT_KINDS = ("translation", "qa", "conversation", "summarization")
FIRST_CHAT_ITEM = 12  # items 0-11 of the task sets were used by calibrations and the picker


@dataclass
class Row:
    name: str
    engine: str  # "llama.cpp" or "quickdraft"
    quant: str  # the target's weights
    # ids -> (tokens, first, total, tokens a target forward: quickdraft's only, else None)
    run: Callable[[list[int]], tuple[list[int], float, float, float | None]]
    weight_bytes: float = 0.0
    results: list[dict] = field(default_factory=list)  # a run a prompt: its median one
    runs: list[dict] = field(default_factory=list)  # every run, every round
    # Called before each round: a quickdraft row builds its drafter anew, so nothing a drafter
    # keeps between requests (suffix decoding's trie of earlier replies, what sizing learned)
    # carries from one round's run of a prompt into the next round's.
    fresh: Callable[[], None] = lambda: None


def chat_prompts(tokenizer, count: int) -> list[tuple[str, list[int]]]:
    tasks = load_tasks(CHAT_KINDS, None)
    items = [item for group in zip(*tasks.values(), strict=False) for item in group]
    items = items[FIRST_CHAT_ITEM * len(CHAT_KINDS) :]
    return [("chat", tokenizer.apply_chat(list(item.messages))) for item in items[:count]]


def llama_cpp_rows(args, tokenizer_eos: tuple[int, ...]) -> list[Row]:
    sys.path.insert(0, str(args.llama_cpp))
    import llama_cpp
    from llama_cpp.llama_speculative import LlamaDraftModel, LlamaPromptLookupDecoding

    target_path = str(packaged_gguf(args.target))
    draft_path = None if args.draft == "none" else str(packaged_gguf(args.draft))

    class DraftModel(LlamaDraftModel):
        """The 0.5B GGUF drafting ``k`` greedy tokens; ``generate`` reuses its KV cache for
        the longest common prefix, so each step evaluates only the new tokens."""

        def __init__(self, k: int):
            self.k = k
            self.model = llama_cpp.Llama(
                draft_path, n_threads=args.threads, n_ctx=args.context, verbose=False
            )

        def __call__(self, input_ids, /, **kwargs) -> np.ndarray:
            tokens = []
            for token in self.model.generate(
                input_ids.tolist(), top_k=1, temp=0.0, repeat_penalty=1.0, reset=True
            ):
                tokens.append(token)
                if len(tokens) == self.k:
                    break
            return np.array(tokens, dtype=np.intc)

    def make(draft) -> Callable:
        model = llama_cpp.Llama(
            target_path, n_threads=args.threads, n_ctx=args.context, verbose=False,
            draft_model=draft,
        )  # fmt: skip

        def run(ids: list[int]) -> tuple[list[int], float, float, None]:
            model.reset()
            out, first = [], 0.0
            start = time.perf_counter()
            for token in model.generate(ids, top_k=1, temp=0.0, repeat_penalty=1.0, reset=True):
                if not out:
                    first = time.perf_counter() - start
                if token in tokenizer_eos:
                    break
                out.append(token)
                if len(out) == args.max_new_tokens:
                    break
            return out, first, time.perf_counter() - start, None

        return run

    size = Path(target_path).stat().st_size
    drafts = []
    if draft_path is not None:
        name = f"llama.cpp + 0.5B draft (k={args.llama_k})"
        drafts.append(Row(name, "llama.cpp", "Q4_K_M", make(DraftModel(args.llama_k)), size))
    return [
        Row("llama.cpp plain", "llama.cpp", "Q4_K_M", make(None), size),
        *drafts,
        Row(
            "llama.cpp prompt lookup (10)",
            "llama.cpp",
            "Q4_K_M",
            make(LlamaPromptLookupDecoding(num_pred_tokens=10)),
            size,
        ),
    ]


def quickdraft_rows(args) -> tuple[list[Row], object, int]:
    """Each target quantization's rows, and the parameters a decode step multiplies by."""
    draft = None if args.draft == "none" else load_model(args.draft, int8=True)[0]
    quants = ["float32"] + [q for q in args.quants.split(",") if q != "float32"]
    rows, tokenizer, params = [], None, 0
    for quant in quants:
        target, tokenizer = load_model(args.target, quant=None if quant == "float32" else quant)
        weight_bytes, params = _weight_bytes(target), projection_params(target)
        configs = [("plain", None, None)]
        if quant == "float32" and len(quants) > 1:  # the reference only
            run, _ = _quickdraft_run(target, None, None, tokenizer, args)
            rows.append(Row("quickdraft float32 plain", "quickdraft", quant, run, weight_bytes))
            continue
        for k in (3, 5) if draft is not None and "draft" in args.methods.split(",") else ():
            spec = SpecConfig(method="draft_model", num_speculative_tokens=k)
            configs.append((f"draft model k={k}", spec, draft))
        if quant == "int8" and draft is not None:  # the draft's 151,936-row head: a quarter
            spec = make_spec(
                method="draft_model", num_speculative_tokens=4, draft_shortlist="fr:32768"
            )
            configs.append(("draft model k=4, FR-Spec 32k head", spec, draft))
        methods = set(args.methods.split(","))
        if "ngram" in methods:
            configs.append(
                ("prompt lookup k=5", SpecConfig(method="ngram", num_speculative_tokens=5), None)
            )
        if "eagle" in methods and (EAGLE_ARTIFACTS / args.target).is_dir():
            configs.append(("EAGLE", SpecConfig(method="eagle"), None))
            configs.append(
                ("EAGLE, network alone", make_spec(method="eagle", eagle_lookup=0), None)
            )
        if "suffix" in methods:
            configs.append(
                ("suffix k=8", SpecConfig(method="suffix", num_speculative_tokens=8), None)
            )
        if "lookahead" in methods:
            configs.append(("lookahead", SpecConfig(method="lookahead"), None))
        if args.whole:  # each speculative row again, drafting whole every step (no sizing)
            configs += [
                (f"{name} (whole)", dataclasses.replace(spec, adaptive_k=False), model)
                for name, spec, model in configs
                if spec is not None
            ]
        for name, spec, model in configs:
            run, fresh = _quickdraft_run(target, spec, model, tokenizer, args)
            row = Row(f"quickdraft {quant} {name}", "quickdraft", quant, run, weight_bytes)
            row.fresh = fresh
            rows.append(row)
    return rows, tokenizer, params


def _quickdraft_run(target, spec, model, tokenizer, args) -> tuple[Callable, Callable]:
    """A row's run of one prompt, and what starts a round: its drafter built anew (one
    drafter serves every prompt of a round, as a server's engine serves its requests)."""
    sampling = SamplingParams(
        temperature=0, max_new_tokens=args.max_new_tokens, stop_token_ids=tokenizer.eos_token_ids
    )
    drafter = None

    def fresh() -> None:
        nonlocal drafter
        if spec is not None:
            drafter = build_drafter(spec, target, model, same_tokenizer=True)

    def run(ids: list[int]) -> tuple[list[int], float, float, float]:
        start = time.perf_counter()
        out = generate(target, ids, sampling=sampling, spec=spec, draft=drafter)
        total = time.perf_counter() - start
        tokens = [t for t in out.token_ids if t not in tokenizer.eos_token_ids]
        return tokens, out.stats.time_prefill, total, out.stats.mean_accepted_length

    return run, fresh


def projection_params(model) -> int:
    """Parameters a decode step multiplies by: every projection of every layer and the head."""
    c = model.config
    attention = c.hidden_size * (c.num_heads + 2 * c.num_kv_heads) * c.head_dim
    attention += c.num_heads * c.head_dim * c.hidden_size
    mlp = 3 * c.hidden_size * c.intermediate_size
    return c.num_layers * (attention + mlp) + c.vocab_size * c.hidden_size


def _weight_bytes(model) -> float:
    """Bytes a decode step reads: 4 a parameter in float32; in int8, the int8 codes (two
    anchor columns included, outlier columns apart); on the q4 kernel, its packed records."""
    linears = [model.head]
    for layer in model.layers:
        linears += [layer.qkv, layer.o, layer.gate_up, layer.down]
    if getattr(model, "quant", None) is not None:
        return float(sum(linear.quantized_weights.nbytes for linear in linears))
    if not model.int8:
        return 4.0 * projection_params(model)
    total = 0.0
    for linear in linears:
        weights = linear._int8
        total += torch.ops.quantized.linear_unpack(weights.packed)[0].numel()
        if weights.outliers is not None:
            total += torch.ops.quantized.linear_unpack(weights.outliers)[0].numel()
        if weights.dense_columns is not None:
            total += 4.0 * weights.dense_columns.numel()
    return total


def machine_rates(threads: int) -> dict[str, float]:
    """Measured memory bandwidth (GB/s, reading a 1 GiB tensor) and peak arithmetic rates
    (float32 GEMM GFLOP/s; int8 GEMM GOP/s through the same fbgemm kernel the int8 weights
    use), medians of 5."""
    torch.set_num_threads(threads)
    big = torch.ones(2**28)  # 1 GiB of float32
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    from quickdraft.models.ops import Linear

    wide = Linear(torch.randn(4096, 4096) * 0.02, int8=True)
    x = torch.randn(256, 4096)

    def median(call) -> float:
        call()
        times = []
        for _ in range(5):
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    return {
        "bandwidth_gb_s": big.numel() * 4 / median(lambda: big.sum()) / 1e9,
        "fp32_gflop_s": 2 * 2048**3 / median(lambda: a @ b) / 1e9,
        "int8_gop_s": 2 * 256 * 4096 * 4096 / median(lambda: wide(x)) / 1e9,
    }


def agreement(tokens: list[int], reference: list[int]) -> float:
    """The share of ``reference`` before the first difference from ``tokens``."""
    same = 0
    for a, b in zip(tokens, reference, strict=False):
        if a != b:
            break
        same += 1
    return same / max(len(reference), 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b", help="or none")
    parser.add_argument("--quants", default="float32,int8,q4", help="float32 always included")
    parser.add_argument("--llama-cpp", type=Path, required=True, help="llama-cpp-python's folder")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--code", type=int, default=6, help="code prompts")
    parser.add_argument("--chat", type=int, default=6, help="chat prompts")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--llama-k", type=int, default=4, help="llama.cpp's draft length")
    parser.add_argument(
        "--methods",
        default="draft,ngram,eagle,suffix,lookahead",
        help="quickdraft's speculative rows: draft (the draft model at k = 3 and 5), ngram, "
        "eagle (with and without its prompt-lookup graft, where a drafter ships for the "
        "target), suffix, lookahead",
    )
    parser.add_argument(
        "--whole",
        action="store_true",
        help="also each speculative row drafting its whole draft every step (no goodput "
        "sizing, SpecConfig.adaptive_k=False)",
    )
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument(
        "--rounds", type=int, default=1,
        help="runs of every prompt on every row (rotated anew each round); the report keeps "
        "each prompt's run of the median decode time: on a noisy host, figures that settle",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=RESULTS / "vs_llama_cpp.json")
    args = parser.parse_args()
    if min(args.code, args.chat) < 2:  # the first half of each kind calibrates
        parser.error("--code and --chat: at least 2 prompts each")
    if args.rounds < 1:
        parser.error("--rounds: at least 1")
    torch.set_num_threads(args.threads)

    rows, tokenizer, params = quickdraft_rows(args)
    rows = llama_cpp_rows(args, tokenizer.eos_token_ids) + rows
    prompts = [("code", tokenizer.apply_chat(p["prompt"]))
               for p in code_prompts(args.code, task_dir=TASK_DIR, seed=11)]  # fmt: skip
    prompts += chat_prompts(tokenizer, args.chat)
    rates = machine_rates(args.threads)
    runs: dict[tuple[int, int], list[dict]] = {}  # (row, prompt) -> its runs
    for round_ in range(args.rounds):
        for row in rows:
            row.fresh()
        for index, (kind, ids) in enumerate(prompts):
            turn = (index + round_) % len(rows)
            for row in rows[turn:] + rows[:turn]:
                tokens, first, total, accepted = row.run(ids)
                runs.setdefault((id(row), index), []).append(
                    {"prompt": index, "kind": kind, "tokens": tokens, "first_s": first,
                     "total_s": total, "tokens_per_forward": accepted, "round": round_}
                )  # fmt: skip
            print(f"round {round_ + 1}/{args.rounds}: prompt {index + 1}/{len(prompts)} "
                  f"({kind}, {len(ids)} tokens) done", flush=True)  # fmt: skip
    for row in rows:  # each prompt's run of the median decode time
        for index in range(len(prompts)):
            done = runs[(id(row), index)]
            row.runs += done
            middle = statistics.median_low(r["total_s"] - r["first_s"] for r in done)
            row.results.append(next(r for r in done if r["total_s"] - r["first_s"] == middle))
    report = summarise(rows, prompts, rates, args)
    report["projection_params"] = params
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    text = render(report)
    args.out.with_suffix(".md").write_text(text)
    print(text)


def summarise(rows: list[Row], prompts, rates: dict, args) -> dict:
    kinds = [kind for kind, _ in prompts]
    calibration = {  # the first half of each kind's prompts
        i for i, kind in enumerate(kinds) if kinds[: i + 1].count(kind) <= kinds.count(kind) // 2
    }
    float_plain = next(r for r in rows if r.name == "quickdraft float32 plain")
    plains = {r.quant: r for r in rows if r.name.endswith("plain")}
    summary = [summarise_row(row, plains[row.quant], float_plain, calibration) for row in rows]
    best = {}
    for quant in sorted({r["quant"] for r in summary if r["engine"] == "quickdraft"}):
        mine = [r for r in summary if r["engine"] == "quickdraft" and r["quant"] == quant]
        best[quant] = max(mine, key=lambda r: r["decode_tok_s_calibration"])["name"]
    return {
        "target": args.target,
        "draft": args.draft,
        "threads": args.threads,
        "max_new_tokens": args.max_new_tokens,
        "rounds": args.rounds,
        "machine": f"{describe_machine()}, q4 path {kernels.best_path()}",
        "rates": rates,
        "prompts": {
            "code": kinds.count("code"),
            "chat": kinds.count("chat"),
            "calibration": sorted(calibration),
        },
        "best_by_calibration": best,
        "rows": summary,
    }


def summarise_row(row: Row, plain: Row, float_plain: Row, calibration: set[int]) -> dict:
    def decode(result: dict) -> float:
        return (len(result["tokens"]) - 1) / max(result["total_s"] - result["first_s"], 1e-9)

    def median_decode(keep: Callable[[dict], bool]) -> float:
        return statistics.median(decode(r) for r in row.results if keep(r))

    pairs = list(zip(row.results, plain.results, strict=True))
    in_round = list(zip(row.runs, plain.runs, strict=True))  # the same prompt and round
    floats = list(zip(row.results, float_plain.results, strict=True))
    accepted = None  # new tokens a target forward, bonus included: quickdraft's rows only
    per_prompt = [r["tokens_per_forward"] for r in row.results]
    if row.engine == "quickdraft" and (known := [x for x in per_prompt if x == x]):  # not NaN
        accepted = statistics.mean(known)  # a reply of one token has no forward after prefill
    return {
        "name": row.name,
        "engine": row.engine,
        "quant": row.quant,
        "weight_bytes": row.weight_bytes,
        "decode_tok_s": median_decode(lambda r: True),
        "decode_tok_s_code": median_decode(lambda r: r["kind"] == "code"),
        "decode_tok_s_chat": median_decode(lambda r: r["kind"] == "chat"),
        "decode_tok_s_calibration": median_decode(lambda r: r["prompt"] in calibration),
        "decode_tok_s_held_out": median_decode(lambda r: r["prompt"] not in calibration),
        "end_to_end_tok_s": statistics.median(len(r["tokens"]) / r["total_s"] for r in row.results),
        "same_as_own_plain": sum(r["tokens"] == p["tokens"] for r, p in pairs) / len(pairs),
        "float_agreement": statistics.mean(agreement(r["tokens"], f["tokens"]) for r, f in floats),
        "tokens_per_forward": accepted,
        # Run by run against the plain row's run of the same prompt in the same round, medians
        # per kind: a pair sees the same text within a minute, so it settles sooner than the
        # rates do.
        "x_own_plain_code": median_ratio(in_round, "code", decode),
        "x_own_plain_chat": median_ratio(in_round, "chat", decode),
        "results": row.results,
        "runs": row.runs,
    }


def median_ratio(pairs: list[tuple[dict, dict]], kind: str, rate: Callable[[dict], float]) -> float:
    """The median over the pairs of ``kind`` of a row's rate over its plain row's."""
    ratios = [rate(r) / max(rate(p), 1e-9) for r, p in pairs if r["kind"] == kind]
    return statistics.median(ratios) if ratios else float("nan")


def render(report: dict) -> str:
    rates = report["rates"]
    lines = [
        f"# quickdraft against llama.cpp: {report['target']} (draft {report['draft']})",
        "",
        f"{report['machine']}; {report['threads']} threads; greedy, {report['max_new_tokens']} "
        f"new tokens at most; {report['prompts']['code']} code and {report['prompts']['chat']} "
        f"chat prompts, interleaved, {report.get('rounds', 1)} round(s) (each prompt's run of "
        "the median decode time). Medians over prompts; decode tokens/s unless marked.",
        f"Measured: memory bandwidth {rates['bandwidth_gb_s']:.1f} GB/s, float32 GEMM "
        f"{rates['fp32_gflop_s']:.0f} GFLOP/s, int8 GEMM {rates['int8_gop_s']:.0f} GOP/s; "
        f"{report['projection_params'] / 1e9:.2f}B parameters multiplied per token.",
        "",
        "| row | all | code | chat | held out | end to end | x own plain: code | chat | "
        "tokens a forward | same as own plain | agrees with float | weights GB | "
        "floor ms/token: bandwidth | compute |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    chosen = set(report["best_by_calibration"].values())
    for row in report["rows"]:
        floor = row["weight_bytes"] / (rates["bandwidth_gb_s"] * 1e9) * 1000
        rate = rates["fp32_gflop_s"] if row["quant"] == "float32" else rates["int8_gop_s"]
        compute = 2 * report["projection_params"] / (rate * 1e9) * 1000
        best = " (best, chosen on calibration)" if row["name"] in chosen else ""
        accepted = row.get("tokens_per_forward")
        per_forward = "-" if accepted is None else f"{accepted:.2f}"
        lines.append(
            f"| {row['name']}{best} | {row['decode_tok_s']:.1f} | "
            f"{row['decode_tok_s_code']:.1f} | {row['decode_tok_s_chat']:.1f} | "
            f"{row['decode_tok_s_held_out']:.1f} | {row['end_to_end_tok_s']:.1f} | "
            f"{row.get('x_own_plain_code', float('nan')):.2f} | "
            f"{row.get('x_own_plain_chat', float('nan')):.2f} | {per_forward} | "
            f"{row['same_as_own_plain']:.0%} | {row['float_agreement']:.0%} | "
            f"{row['weight_bytes'] / 1e9:.2f} | {floor:.0f} | {compute:.0f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
