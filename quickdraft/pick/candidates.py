"""How ``quickdraft pick`` sees each built-in method (``PickSupport``, ``quickdraft.pick.picker``).

Candidates are the configurations worth trying with what the deployment has (a draft model,
shipped or given EAGLE drafters, Medusa heads and shortlist artifacts); priors come from
``pick/priors.py`` (measured here); engine configs from ``quickdraft/interop/launch.py``.
``PICK`` maps each built-in method to its support; ``drafters/registry.py`` attaches them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from quickdraft import methods
from quickdraft.config import SpecConfig
from quickdraft.drafters.eagle.io import eagle_folder, read_eagle_config
from quickdraft.drafters.eagle.tree import DEFAULT_LOOKUP, DynamicTree
from quickdraft.drafters.medusa.net import heads_folder, read_heads_config
from quickdraft.interop import launch as engines
from quickdraft.methods import PickContext, PickSupport, StepPrior
from quickdraft.pick import priors
from quickdraft.vocab import artifact_folder

CHAIN_KS = (2, 3, 4, 5, 6, 8)


def _labelled(name: str, texts: list[str]) -> list[tuple[str, SpecConfig]]:
    """Specs from bench labels (``eagle@3.1.3+0``), so candidates read as the bench names
    them and priors measured by the bench find them."""
    entry, out = methods.get(name), []
    for text in texts:
        label, fields = entry.label(text, None)
        out.append((label, SpecConfig(method=name, **fields)))
    return out


def model_path(name: str) -> str:
    """A model alias as the folder other engines load (the converted checkpoint)."""
    from quickdraft.models.loading import ALIASES, resolve

    return str(resolve(name)) if name in ALIASES else name


def _draft_model_candidates(context: PickContext) -> list[tuple[str, SpecConfig]]:
    if context.draft is None:
        context.missing["draft_model"] = "no draft model given (--draft)"
        return []
    chains = _labelled("draft_model", [str(k) for k in CHAIN_KS])
    folder = context.shortlist_dir
    if folder is None:
        try:
            folder = artifact_folder(context.draft)
        except ValueError:
            return chains
    shortlisted = [
        (f"{label} {kind}", dataclasses.replace(spec, draft_shortlist=kind,
                                                shortlist_dir=str(folder)))
        for label, spec in chains
        if spec.num_speculative_tokens in (4, 5, 6)
        for kind in ("fr:32768", "dyna-hybrid-pa:8")
    ]  # fmt: skip
    return chains + shortlisted


# Measured on the Qwen pair at k = 5 (benchmarks/results/shortlists): accepted length and
# draft step against the full head.
_SHORTLIST_EFFECT = {
    "fr:32768": (3.97 / 4.36, 1 - 0.115),
    "dyna-hybrid-pa:8": (4.31 / 4.36, 1 - 0.124),
}


def _draft_model_prior(spec: SpecConfig, task: str) -> StepPrior:
    base = priors.draft_model(spec.num_speculative_tokens, task)
    if spec.draft_shortlist == "full":
        return base
    length, step = _SHORTLIST_EFFECT.get(spec.draft_shortlist, (1.0, 1.0))
    return dataclasses.replace(
        base,
        expected_tokens=1 + (base.expected_tokens - 1) * length,
        draft_cost=base.draft_cost * step,
        source=base.source + " + shortlists",
    )


def _draft_model_engines(spec: SpecConfig, context: PickContext) -> list[engines.EngineConfig]:
    assert context.draft is not None
    return engines.draft_model(
        spec.num_speculative_tokens, model_path(context.draft), spec.draft_shortlist
    )


def _ngram_candidates(context: PickContext) -> list[tuple[str, SpecConfig]]:
    return _labelled("ngram", [str(k) for k in CHAIN_KS])


def _ngram_engines(spec: SpecConfig, context: PickContext) -> list[engines.EngineConfig]:
    return engines.ngram(
        spec.num_speculative_tokens, spec.prompt_lookup_min, spec.prompt_lookup_max
    )


def _medusa_candidates(context: PickContext) -> list[tuple[str, SpecConfig]]:
    try:
        folder = heads_folder(context.target, context.medusa_dir)
    except ValueError:
        context.missing["medusa"] = f"no Medusa heads for {context.target} (--medusa-dir)"
        return []
    return [
        (label, dataclasses.replace(spec, medusa_dir=str(folder)))
        for label, spec in _labelled("medusa", ["", "fit:8"])
    ]


def _medusa_prior(spec: SpecConfig, task: str) -> StepPrior:
    return priors.measured("medusa" if spec.tree == "default" else f"medusa tree={spec.tree}", task)


def _medusa_engines(spec: SpecConfig, context: PickContext) -> list[engines.EngineConfig]:
    folder = heads_folder(context.target, spec.medusa_dir)
    out = engines.export_folder(context.export_dir.resolve(), context.target, "medusa", "vllm")
    command = (
        f"quickdraft export medusa --target {context.target} --medusa-dir {folder} --out {out}"
    )
    heads = read_heads_config(folder).num_heads
    return engines.medusa(heads, (command, out))


def _eagle_candidates(context: PickContext) -> list[tuple[str, SpecConfig]]:
    try:
        folder = eagle_folder(context.target, context.eagle_dir)
    except ValueError:
        context.missing["eagle"] = f"no EAGLE drafter for {context.target} (--eagle-dir)"
        return []
    return [
        (label, dataclasses.replace(spec, eagle_dir=str(folder)))
        for label, spec in _labelled("eagle", ["", "+0", "3.1.3+0"])
    ]


def _eagle_prior(spec: SpecConfig, task: str) -> StepPrior:
    label, _ = _eagle_label_of(spec)
    return priors.measured(label if label in priors.measured_labels() else "eagle", task)


def _eagle_label_of(spec: SpecConfig) -> tuple[str, dict[str, Any]]:
    tree = "" if spec.tree == "default" else spec.tree.replace(",", ".")
    lookup = "" if spec.eagle_lookup is None else f"+{spec.eagle_lookup}"
    shortlist = "" if spec.draft_shortlist == "full" else f"+{spec.draft_shortlist}"
    return methods.get("eagle").label(tree + lookup + shortlist, None)


def _eagle_engines(spec: SpecConfig, context: PickContext) -> list[engines.EngineConfig]:
    folder = eagle_folder(context.target, spec.eagle_dir)
    tree = DynamicTree.parse(spec.tree, "cuda" if context.device == "gpu" else "cpu")
    export = {}
    for engine in engines.ENGINES:
        out = engines.export_folder(context.export_dir.resolve(), context.target, "eagle", engine)
        command = (
            f"quickdraft export eagle --target {context.target} --eagle-dir {folder} "
            f"--engine {engine} --out {out}"
        )
        export[engine] = (command, out)
    config = read_eagle_config(folder)
    token_map = config.variant == "eagle1" and (
        config.draft_vocab_size < config.vocab_size or (folder / "token_map.pt").exists()
    )
    lookup = DEFAULT_LOOKUP if spec.eagle_lookup is None else spec.eagle_lookup
    return engines.eagle(
        config.variant, tree.depth, tree.topk, tree.tokens, export, spec.draft_shortlist,
        token_map=token_map, lookup=lookup,
    )  # fmt: skip


def _lookahead_engines(spec: SpecConfig, context: PickContext) -> list[engines.EngineConfig]:
    return [
        engines.unsupported("vllm", "vLLM has no lookahead decoding"),
        engines.unsupported(
            "sglang", "SGLang has no lookahead decoding (its NGRAM is prompt lookup)"
        ),
    ]


def _lookahead_candidates(context: PickContext) -> list[tuple[str, SpecConfig]]:
    return _labelled("lookahead", [""])


PICK = {
    "ar": PickSupport(
        candidates=lambda context: [("ar", SpecConfig(method="ar"))],
        prior=lambda spec, task: StepPrior(1.0, 0.0, 1.0, 1, "plain decoding"),
        engines=lambda spec, context: engines.plain(),
    ),
    "draft_model": PickSupport(
        _draft_model_candidates, _draft_model_prior, _draft_model_engines, chain=True
    ),
    "ngram": PickSupport(
        _ngram_candidates,
        lambda spec, task: priors.ngram(spec.num_speculative_tokens, task),
        _ngram_engines,
        chain=True,
    ),
    "medusa": PickSupport(_medusa_candidates, _medusa_prior, _medusa_engines),
    "eagle": PickSupport(_eagle_candidates, _eagle_prior, _eagle_engines),
    "lookahead": PickSupport(
        _lookahead_candidates,
        lambda spec, task: priors.measured("lookahead", task),
        _lookahead_engines,
    ),
}
