"""What grammar-forced drafts buy: JSON extraction into a schema with fixed keys, each method
with forced drafting on and off, interleaved prompt by prompt, on SmolLM2-135M.

Where the grammar allows one continuation only (a key, a quote, a colon, a closing brace),
the engine drafts it as point masses without running the drafter (``engine.constrain.
forced_draft``). The share of a reply's tokens that were forced is counted by walking the
grammar along the plain reply. Every reply is checked equal to plain constrained decoding and
valid JSON. Drafters that remember earlier requests (suffix decoding) would learn each reply in
the first arm it runs, so the methods here keep no state across requests. The extraction texts
are written here (no bench prompt).

    python benchmarks/forced_drafts.py --threads 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from quickdraft.bench.labels import parse_label
from quickdraft.bench.machine import describe_machine
from quickdraft.config import SamplingParams
from quickdraft.constraints import Grammars
from quickdraft.drafters.registry import build_drafter
from quickdraft.engine import constrain, generate
from quickdraft.models.loading import load_model

RESULTS = Path(__file__).parent / "results" / "forced_drafts.md"
KEYS = ("name", "age", "city", "country", "occupation")
SCHEMA = {
    "type": "object",
    "properties": {key: {"type": "integer" if key == "age" else "string"} for key in KEYS},
    "required": list(KEYS),
    "additionalProperties": False,
    "x-guidance": {"whitespace_flexible": False},
}
TEXTS = (
    "Maria Lopez, 34, is a teacher in Lima, Peru.",
    "Kenji Sato is a 51-year-old engineer living in Osaka, Japan.",
    "At 27, Amara Okafor works as a nurse in Lagos, Nigeria.",
    "Lukas Weber (42) is a baker from Munich, Germany.",
    "The pilot Sofia Rossi, aged 38, lives in Turin, Italy.",
    "Omar Haddad is a 45-year-old architect based in Amman, Jordan.",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--methods", default="ngram,eagle,eagle+0")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target, tokenizer = load_model("smollm2-135m")
    sampling = SamplingParams(temperature=0, max_new_tokens=96, json_schema=SCHEMA)
    prompt = "Extract the person as JSON with name, age, city, country and occupation: "
    prompts = [tokenizer.apply_chat(prompt + text) for text in TEXTS]
    labels = [parse_label(text)[0] for text in args.methods.split(",")]
    drafters = {
        label: build_drafter(parse_label(text)[1], target, target_name="smollm2-135m")
        for label, text in zip(labels, args.methods.split(","), strict=True)
    }
    original = constrain.forced_draft
    rates: dict[str, list[float]] = {}
    grammars = Grammars(tokenizer, target.vocab_size)
    forced = total = 0
    for prompt_ids in prompts:
        start = time.perf_counter()
        plain = generate(target, prompt_ids, sampling=sampling, tokenizer=tokenizer)
        rates.setdefault("plain", []).append(len(plain.token_ids) / (time.perf_counter() - start))
        json.loads(plain.text)
        forced += grammars.matcher(sampling.constraint).count_forced(plain.token_ids)
        total += len(plain.token_ids)
        for label in labels:
            for on in (False, True):
                constrain.forced_draft = original if on else (lambda *_: None)
                start = time.perf_counter()
                out = generate(
                    target, prompt_ids, sampling=sampling, draft=drafters[label],
                    tokenizer=tokenizer,
                )  # fmt: skip
                seconds = time.perf_counter() - start
                assert out.token_ids == plain.token_ids, label
                arm = f"{label}, forced drafts {'on' if on else 'off'}"
                rates.setdefault(arm, []).append(len(out.token_ids) / seconds)
    constrain.forced_draft = original
    base = statistics.median(rates["plain"])
    lines = [
        "# Grammar-forced drafts: JSON extraction into a 5-key schema, SmolLM2-135M",
        "",
        f"{describe_machine()}; {args.threads} threads; greedy, {len(TEXTS)} prompts, "
        f"end-to-end tokens/s medians, every reply equal to plain constrained decoding and "
        f"valid JSON (`benchmarks/forced_drafts.py`). Forced tokens: {forced} of {total} "
        f"reply tokens ({forced / total:.0%}).",
        "",
        "| arm | tokens/s | against plain |",
        "|---|---|---|",
    ]
    for arm, values in rates.items():
        median = statistics.median(values)
        lines.append(f"| {arm} | {median:.1f} | {median / base:.2f}x |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
