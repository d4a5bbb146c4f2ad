"""How closely quantized targets follow the float model, position by position: teacher-forced
top-1 agreement and KL divergence over replies nobody here generated, for quickdraft's q4 (and
int8) targets and llama.cpp on the target's GGUF file, all against the same float model.

``vs_llama_cpp.py``'s "agrees with float" column (the share of a greedy reply before its first
difference from the float model's) is what a user sees, but it is a coarse measure: one prompt
of twelve that turns early moves it by up to 8 points, and on the runs committed the two
engines' per-prompt figures split 3 / 4 / 5 ties (0.5B) and 2 / 2 / 8 (1.5B). Here every reply
position counts: each engine reads the same token ids (a chat's whole text, chat template
applied) in one pass, and at each reply position its argmax is compared with the float
model's, and KL(float || engine) taken. Pairing by position gives McNemar's test of the
difference between two engines.

The float model is what ``load_model(target)`` gives: for the Qwen2.5-Coder targets their
Q4_K_M GGUF's weights dequantized to float32, which is what llama.cpp computes with too, so
both engines approximate the same float network; for SmolLM2-135M its float checkpoint (its
GGUF is Q4_1).

Text: the corpus's human-written chats (``benchmarks/data/shortlist_corpus.jsonl``: math,
QA, translation, conversation and standard-library code, kinds in turn); no engine wrote them,
so none is favoured.

    python benchmarks/quant_agreement.py --target qwen2.5-coder-0.5b --llama-cpp build/llama-cpp \\
        --chats 60 --out benchmarks/results/quant_agreement/qwen0.5b
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
from scipy.stats import binomtest

from quickdraft.bench.machine import describe_machine
from quickdraft.models.loading import load_model
from quickdraft.models.sources import packaged_gguf
from quickdraft.train.corpus import read_records, tokenize

LLAMA_CPP = "llama.cpp, the same GGUF"
CORPUS = Path(__file__).resolve().parent / "data" / "shortlist_corpus.jsonl"


def chats(tokenizer, count: int, max_tokens: int) -> list[tuple[list[int], int]]:
    """``count`` chats, kinds in turn: (token ids, first reply position)."""
    by_kind: dict[str, list[dict]] = {}
    for record in read_records([CORPUS]):
        by_kind.setdefault(record.get("kind", "text"), []).append(record)
    ordered = [r for group in zip(*by_kind.values(), strict=False) for r in group]
    out = []
    for record in ordered:
        sequence = tokenize(record, tokenizer, max_tokens)
        if len(sequence.tokens) - sequence.start >= 8:  # a reply worth scoring
            out.append((sequence.tokens, sequence.start))
        if len(out) == count:
            break
    return out


def quickdraft_logits(model, ids: list[int]) -> torch.Tensor:
    """[T, V] float32: the model's logits at every position, one pass."""
    tokens = torch.tensor([ids])
    out = model.forward(tokens, torch.arange(len(ids))[None], model.new_cache(1, len(ids)))
    return out.logits[0, :, : model.vocab_size].float()


def llama_cpp_engine(folder: Path, target: str, threads: int, context: int):
    sys.path.insert(0, str(folder))
    import llama_cpp

    model = llama_cpp.Llama(
        str(packaged_gguf(target)), n_threads=threads, n_ctx=context, n_batch=context,
        n_ubatch=context, logits_all=True, verbose=False,
    )  # fmt: skip

    def logits(ids: list[int]) -> torch.Tensor:
        model.reset()
        model.eval(ids)
        return torch.from_numpy(np.array(model.scores[: len(ids)], dtype=np.float32))

    return logits


def compare(reference: torch.Tensor, other: torch.Tensor, start: int) -> dict:
    """Per reply position (the positions predicting reply tokens): argmax agreement and KL."""
    ref, got = reference[start - 1 : -1], other[start - 1 : -1, : reference.shape[1]]
    log_p, log_q = ref.log_softmax(-1), got.log_softmax(-1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1)
    same = (ref.argmax(-1) == got.argmax(-1)).int().tolist()
    return {"same": same, "kl": [round(x, 7) for x in kl.tolist()]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--quants", default="q4", help="quickdraft's, comma-separated")
    parser.add_argument("--llama-cpp", type=Path, default=None, help="llama-cpp-python folder")
    parser.add_argument("--chats", type=int, default=60)
    parser.add_argument("--max-tokens", type=int, default=384)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="folder for report.md, results.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    reference, tokenizer = load_model(args.target)
    texts = chats(tokenizer, args.chats, args.max_tokens)
    engines = {
        f"quickdraft {q}": load_model(args.target, quant=q)[0] for q in args.quants.split(",")
    }
    calls = {
        name: (lambda ids, m=model: quickdraft_logits(m, ids)) for name, model in engines.items()
    }
    if args.llama_cpp is not None:
        calls[LLAMA_CPP] = llama_cpp_engine(
            args.llama_cpp, args.target, args.threads, args.max_tokens
        )
    per_engine: dict[str, dict[str, list]] = {name: {"same": [], "kl": []} for name in calls}
    for number, (ids, start) in enumerate(texts, 1):
        float_logits = quickdraft_logits(reference, ids)
        for name, call in calls.items():
            for key, values in compare(float_logits, call(ids), start).items():
                per_engine[name][key].extend(values)
        print(f"chat {number}/{len(texts)}", flush=True)
    meta = {"target": args.target, "machine": describe_machine(), "threads": args.threads,
            "chats": len(texts), "max_tokens": args.max_tokens}  # fmt: skip
    result = {"meta": meta, "engines": per_engine}
    report = render(result)
    print(report)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "report.md").write_text(report)
        (args.out / "results.json").write_text(json.dumps(result) + "\n")


def render(result: dict) -> str:
    meta, engines = result["meta"], result["engines"]
    positions = len(next(iter(engines.values()))["same"])
    lines = [
        f"# Agreement with the float model, position by position: {meta['target']}",
        "",
        f"{meta['machine']}, {meta['threads']} threads. {meta['chats']} human-written chats of "
        f"the corpus (up to {meta['max_tokens']} tokens each), {positions:,} reply positions, "
        "each engine reading the same ids in one pass. Top-1: the engine's argmax equals the "
        "float model's; KL(float || engine) in nats, mean.",
        "",
        "| engine | top-1 agreement | mean KL |",
        "|---|---|---|",
    ]
    for name, values in engines.items():
        lines.append(f"| {name} | {np.mean(values['same']):.2%} | {np.mean(values['kl']):.4f} |")
    names = list(engines)
    if LLAMA_CPP in engines:
        theirs = engines[LLAMA_CPP]["same"]
        lines += ["", "Paired by position against llama.cpp (McNemar, exact):", ""]
        for name in names:
            if name == LLAMA_CPP:
                continue
            ours = engines[name]["same"]
            only_ours = sum(a and not b for a, b in zip(ours, theirs, strict=True))
            only_theirs = sum(b and not a for a, b in zip(ours, theirs, strict=True))
            test = (
                binomtest(only_ours, only_ours + only_theirs) if only_ours + only_theirs else None
            )
            p = f"p = {test.pvalue:.3g}" if test is not None else "no position differs"
            lines.append(
                f"- {name}: agrees where llama.cpp does not at {only_ours} positions, the "
                f"reverse at {only_theirs} ({p})"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
