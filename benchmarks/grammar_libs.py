"""xgrammar against llguidance on this CPU, for structured outputs (the grammar library the
engine will use): the time to build each tokenizer's index, to compile a realistic JSON Schema
and a regular expression, and to compute the allowed-token mask per token while a valid output
is consumed a token at a time (median and 95th percentile), at SmolLM2's 49,152-token and
Qwen2.5's 151,936-token vocabularies. One process, both libraries in turn per repeat.

Neither library is a project dependency yet; install them beside the checkout:

    pip install --no-deps --target build/grammar xgrammar llguidance apache-tvm-ffi
    PYTHONPATH=build/grammar python benchmarks/grammar_libs.py --threads 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer

from quickdraft.bench.machine import describe_machine
from quickdraft.models.sources import resolve

RESULTS = Path(__file__).parent / "results" / "grammar_libs.md"
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "version": {"type": "string", "pattern": "^[0-9]+\\.[0-9]+(\\.[0-9]+)?$"},
        "license": {"enum": ["MIT", "Apache-2.0", "BSD-3-Clause", "GPL-3.0"]},
        "maintainers": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"name": {"type": "string"}, "email": {"type": "string"}},
                "required": ["name", "email"],
                "additionalProperties": False,
            },
            "minItems": 1,
        },
        "downloads": {"type": "integer", "minimum": 0},
        "stable": {"type": "boolean"},
    },
    "required": ["name", "version", "license", "maintainers", "downloads", "stable"],
    "additionalProperties": False,
}
OUTPUT = json.dumps({
    "name": "quickdraft", "version": "0.4.1", "license": "Apache-2.0",
    "maintainers": [{"name": "Ada Lovelace", "email": "ada@example.org"},
                    {"name": "Alan Turing", "email": "alan@example.org"}],
    "downloads": 12345, "stable": True,
})  # fmt: skip
REGEX = r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01]) [A-Z][a-z]+( [A-Z][a-z]+)*"
REGEX_OUTPUT = "2024-03-15 Grace Brewster Hopper"


def timed(call) -> tuple[float, object]:
    start = time.perf_counter()
    result = call()
    return time.perf_counter() - start, result


def xgrammar_run(hf, vocab: int, ids: list[int], kind: str) -> dict:
    import xgrammar as xgr

    index_s, info = timed(lambda: xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab))
    compiler = xgr.GrammarCompiler(info, cache_enabled=False)
    if kind == "json":
        compile_s, grammar = timed(lambda: compiler.compile_json_schema(json.dumps(SCHEMA)))
    else:
        compile_s, grammar = timed(lambda: compiler.compile_regex(REGEX))
    matcher = xgr.GrammarMatcher(grammar)
    bitmask = xgr.allocate_token_bitmask(1, vocab)
    masks = []
    for token in ids:
        seconds, _ = timed(lambda: matcher.fill_next_token_bitmask(bitmask))
        masks.append(seconds)
        if not matcher.accept_token(token):
            raise ValueError(f"xgrammar refused token {token} of a valid output")
    return {"index_s": index_s, "compile_s": compile_s, "masks": masks}


def llguidance_run(hf, vocab: int, ids: list[int], kind: str) -> dict:
    import llguidance
    import llguidance.hf
    import llguidance.torch

    index_s, tokenizer = timed(lambda: llguidance.hf.from_tokenizer(hf, n_vocab=vocab))
    if kind == "json":
        grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(SCHEMA))
    else:
        grammar = llguidance.LLMatcher.grammar_from_regex(REGEX)
    compile_s, matcher = timed(lambda: llguidance.LLMatcher(tokenizer, grammar))
    if matcher.is_error():
        raise ValueError(f"llguidance: {matcher.get_error()}")
    bitmask = llguidance.torch.allocate_token_bitmask(1, vocab)
    masks = []
    for token in ids:
        seconds, _ = timed(lambda: llguidance.torch.fill_next_token_bitmask(matcher, bitmask, 0))
        masks.append(seconds)
        if not matcher.consume_token(token):
            raise ValueError(f"llguidance refused token {token}: {matcher.get_error()}")
    return {"index_s": index_s, "compile_s": compile_s, "masks": masks}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    models = {"smollm2-135m": 49152, "qwen2.5-coder-1.5b": 151936}
    rows = []
    for name, vocab in models.items():
        hf = AutoTokenizer.from_pretrained(resolve(name))
        for kind, text in (("json", OUTPUT), ("regex", REGEX_OUTPUT)):
            ids = hf.encode(text, add_special_tokens=False)
            runs: dict[str, list[dict]] = {"xgrammar": [], "llguidance": []}
            for _ in range(args.repeats):
                runs["xgrammar"].append(xgrammar_run(hf, vocab, ids, kind))
                runs["llguidance"].append(llguidance_run(hf, vocab, ids, kind))
            for library, done in runs.items():
                masks = sorted(m for run in done for m in run["masks"])
                rows.append({
                    "model": name, "vocab": vocab, "constraint": kind, "tokens": len(ids),
                    "library": library,
                    "index_ms": 1000 * statistics.median(r["index_s"] for r in done),
                    "compile_ms": 1000 * statistics.median(r["compile_s"] for r in done),
                    "mask_us_median": 1e6 * statistics.median(masks),
                    "mask_us_p95": 1e6 * masks[int(0.95 * (len(masks) - 1))],
                })  # fmt: skip
                print(json.dumps(rows[-1]), flush=True)
    lines = [
        "# Grammar libraries on this CPU: xgrammar against llguidance",
        "",
        f"{describe_machine()}; {args.threads} threads; medians of {args.repeats} repeats "
        "(`benchmarks/grammar_libs.py`). index: the tokenizer's preparation, once per model; "
        "compile: the constraint (a 6-field JSON Schema with a nested array of objects, an "
        "enum and a pattern; a date-and-name regex), once per distinct constraint; mask: the "
        "allowed-token bitmask before each token of a valid output, consumed a token at a time.",
        "",
        "| model (vocabulary) | constraint | tokens | library | index ms | compile ms | "
        "mask us median | mask us p95 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} ({r['vocab']:,}) | {r['constraint']} | {r['tokens']} | "
            f"{r['library']} | {r['index_ms']:.0f} | {r['compile_ms']:.1f} | "
            f"{r['mask_us_median']:.0f} | {r['mask_us_p95']:.0f} |"
        )
    RESULTS.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
