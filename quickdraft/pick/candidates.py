"""How ``quickdraft pick`` sees each method (``PickSupport``, ``quickdraft.pick.picker``).

Candidates are the configurations worth trying with what the deployment has (a draft model,
shipped or given EAGLE drafters, Medusa heads and shortlist artifacts); priors come from
``pick/priors.py`` (measured here). ``PICK`` maps each built-in method's name to its support;
``support`` gives any other registered method a generic one: its default configuration, ranked
by measurement (``pick --calibrate``) since nothing is known of it beforehand.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from quickdraft.bench.labels import label_of, parse_label
from quickdraft.config import Method, SpecConfig
from quickdraft.drafters import registry
from quickdraft.drafters.draft_model.options import DraftModelOptions
from quickdraft.drafters.eagle.io import ARTIFACTS as EAGLE_ARTIFACTS
from quickdraft.drafters.eagle.io import eagle_folder
from quickdraft.drafters.medusa.net import heads_folder
from quickdraft.pick import priors
from quickdraft.pick.context import PickContext, PickSupport, StepPrior
from quickdraft.vocab import artifact_folder

CHAIN_KS = (2, 3, 4, 5, 6, 8)


def _labelled(name: str, texts: list[str]) -> list[tuple[str, SpecConfig]]:
    """Specs from bench labels (``eagle@3.1.3+0``), so candidates read as the bench names
    them and priors measured by the bench find them."""
    return [parse_label(name + (f"@{text}" if text and text[0] != "+" else text)) for text in texts]


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
        (f"{label} {kind}", registry.with_options(spec, draft_shortlist=kind,
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
    options = registry.resolve(spec)[1]
    assert isinstance(options, DraftModelOptions)
    shortlist = options.draft_shortlist
    if shortlist.full:
        return base
    length, step = _SHORTLIST_EFFECT.get(str(shortlist), (1.0, 1.0))
    return dataclasses.replace(
        base,
        expected_tokens=1 + (base.expected_tokens - 1) * length,
        draft_cost=base.draft_cost * step,
        source=base.source + " + shortlists",
    )


def _ngram_candidates(context: PickContext) -> list[tuple[str, SpecConfig]]:
    return _labelled("ngram", [str(k) for k in CHAIN_KS])


def _medusa_candidates(context: PickContext) -> list[tuple[str, SpecConfig]]:
    try:
        folder = heads_folder(context.target, context.medusa_dir)
    except ValueError:
        context.missing["medusa"] = f"no Medusa heads for {context.target} (--medusa-dir)"
        return []
    return [
        (label, registry.with_options(spec, medusa_dir=str(folder)))
        for label, spec in _labelled("medusa", ["", "fit:8"])
    ]


def _medusa_prior(spec: SpecConfig, task: str) -> StepPrior:
    return priors.measured(label_of(spec), task)


def _eagle_candidates(context: PickContext) -> list[tuple[str, SpecConfig]]:
    try:
        folder = eagle_folder(context.target, context.eagle_dir)
    except ValueError:
        context.missing["eagle"] = f"no EAGLE drafter for {context.target} (--eagle-dir)"
        return []
    return [
        (label, registry.with_options(spec, eagle_dir=str(folder)))
        for label, spec in _labelled("eagle", ["", "+0", "3.1.3+0", "+suffix"])
    ]


def _eagle_prior(spec: SpecConfig, task: str) -> StepPrior:
    """The shipped drafter's own figures where its target's bench has them (a folder of
    ``drafters/eagle/artifacts`` names its target), else SmolLM2's drafter's."""
    eagle_dir = getattr(registry.resolve(spec)[1], "eagle_dir", None)
    folder = Path(eagle_dir).resolve() if eagle_dir else None
    shipped = folder is not None and folder.parent == EAGLE_ARTIFACTS.resolve()
    return priors.eagle(label_of(spec), task, folder if shipped else None)


def _lookahead_candidates(context: PickContext) -> list[tuple[str, SpecConfig]]:
    return _labelled("lookahead", [""])


PICK = {
    "ar": PickSupport(
        candidates=lambda context: [("ar", SpecConfig(method=Method.AR))],
        prior=lambda spec, task: StepPrior(1.0, 0.0, 1.0, 1, "plain decoding"),
    ),
    "draft_model": PickSupport(_draft_model_candidates, _draft_model_prior, chain=True),
    "ngram": PickSupport(
        _ngram_candidates,
        lambda spec, task: priors.ngram(spec.num_speculative_tokens, task),
        chain=True,
    ),
    "medusa": PickSupport(_medusa_candidates, _medusa_prior),
    "eagle": PickSupport(_eagle_candidates, _eagle_prior),
    "lookahead": PickSupport(
        _lookahead_candidates, lambda spec, task: priors.measured("lookahead", task)
    ),
    "suffix": PickSupport(
        lambda context: _labelled("suffix", [""]),
        lambda spec, task: priors.measured("suffix k=8", task),
    ),
}


def support(name: str) -> PickSupport:
    """How the picker weighs method ``name``: its entry in ``PICK``, else one candidate at
    the method's defaults with a neutral prior (1.0x: never picked from priors alone, ranked
    when ``pick --calibrate`` measures it)."""
    if name in PICK:
        return PICK[name]
    entry = registry.get(name)
    neutral = StepPrior(1.0, 0.0, 1.0, 1, f"no prior for {name}: measured by pick --calibrate")

    def candidates(context: PickContext) -> list[tuple[str, SpecConfig]]:
        return [(f"{name} k={entry.default_k}", registry.make_spec(name))]

    return PickSupport(candidates, lambda spec, task: neutral)
