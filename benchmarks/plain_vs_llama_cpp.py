"""Plain decoding only, quickdraft's q4 target against llama.cpp on the same GGUF, paired
prompt by prompt: the two run back to back on each prompt (their order alternating), so the
ratio of each pair sees the same moment of a shared host. The bench's own code and chat
prompts (``vs_llama_cpp.py``'s), greedy, 128 tokens, decode tokens/s (after the first token).

    QUICKDRAFT_Q4_PATH=avx2 python benchmarks/plain_vs_llama_cpp.py \\
        --target qwen2.5-coder-1.5b --llama-cpp build/llama-cpp-avx2 --rounds 3

llama.cpp is built as ``vs_llama_cpp.py``'s docstring says.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from vs_llama_cpp import chat_prompts

from quickdraft import SamplingParams, generate
from quickdraft.bench.tasks import TASK_DIR
from quickdraft.models.loading import load_model
from quickdraft.models.sources import packaged_gguf
from quickdraft.train.sources import code_prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b")
    parser.add_argument("--llama-cpp", type=Path, required=True, help="llama-cpp-python's folder")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--code", type=int, default=4)
    parser.add_argument("--chat", type=int, default=4)
    args = parser.parse_args()
    sys.path.insert(0, str(args.llama_cpp))
    import llama_cpp

    torch.set_num_threads(args.threads)
    target, tokenizer = load_model(args.target, quant="q4")[:2]
    llm = llama_cpp.Llama(
        str(packaged_gguf(args.target)), n_threads=args.threads, n_ctx=2048, verbose=False
    )
    prompts = [tokenizer.apply_chat(p["prompt"])
               for p in code_prompts(args.code, task_dir=TASK_DIR, seed=11)]  # fmt: skip
    prompts += [ids for _, ids in chat_prompts(tokenizer, args.chat)]
    eos = tokenizer.eos_token_ids
    params = SamplingParams(temperature=0, max_new_tokens=128, stop_token_ids=eos)

    def quickdraft_rate(ids: list[int]) -> float:
        start = time.perf_counter()
        out = generate(target, ids, sampling=params)
        decode = time.perf_counter() - start - out.stats.time_prefill
        return (len(out.token_ids) - 1) / decode

    def llama_rate(ids: list[int]) -> float:
        llm.reset()
        count, first = 0, 0.0
        for token in llm.generate(ids, top_k=1, temp=0.0, repeat_penalty=1.0, reset=True):
            if count == 0:
                first = time.perf_counter()
            if token in eos:
                break
            count += 1
            if count == 128:
                break
        return (count - 1) / (time.perf_counter() - first)

    ratios = []
    for round_ in range(args.rounds):
        for index, ids in enumerate(prompts):
            if (index + round_) % 2 == 0:
                ours, theirs = quickdraft_rate(ids), llama_rate(ids)
            else:
                theirs, ours = llama_rate(ids), quickdraft_rate(ids)
            ratios.append(ours / theirs)
            print(f"round {round_} prompt {index}: quickdraft {ours:.1f}, llama.cpp {theirs:.1f}")
    print(
        f"quickdraft q4 plain / llama.cpp plain, paired: median {statistics.median(ratios):.3f}, "
        f"mean {statistics.mean(ratios):.3f}, n={len(ratios)}"
    )


if __name__ == "__main__":
    main()
