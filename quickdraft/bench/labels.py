"""The bench's method labels: ``ar,draft_model@3,eagle@6.4.10p0.1+5,lookahead@4.4.3``.

Every registered method takes ``name[@K]`` (k from the label, else the bench's ``--k``, else
the method's default). Methods whose options have a shorter form here get a parser in
``LABELS``, keyed by method name:

- ``draft_model[@K][+SHORTLIST][+suffix]``: ``draft_model@5+dyna-pa:32``;
- ``medusa[@W.W.W]``: the tree's sibling counts per depth, ``medusa@4.2.1``;
- ``eagle[@D.K.N[pMIN_PROB]][+LOOKUP][+SHORTLIST]``: the dynamic tree (``eagle@6.4.10p0.1``
  is ``--tree 6,4,10,0.1``), the prompt-lookup tokens grafted on (``+0``: none) and the
  head's shortlist; a number after ``+`` is the lookup, anything else a shortlist;
- ``+suffix`` on either: suffix decoding in front, where it beats the drafter
  (``suffix_first``; reported as ``suffix+eagle``);
- ``lookahead[@W.N.G]``: ``lookahead@4.4.3``.

Every label's drafts are sized each step by goodput (``SpecConfig.adaptive_k``, the
default): a trailing ``!`` drafts whole instead, at the label's k or tree every step
(``eagle!``, ``draft_model@6!``); a trailing ``~`` names the default explicitly.

A parser turns a label into (the label as reported, the method's option fields as text); the
option classes parse those, so the label syntax is only a spelling of the option's text.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

from quickdraft.config import SpecConfig
from quickdraft.drafters import registry
from quickdraft.drafters.eagle.options import EagleOptions
from quickdraft.drafters.medusa.options import MedusaOptions

Parsed = tuple[str, dict[str, Any]]


def k_label(name: str, text: str, k: int | None, default_k: int) -> Parsed:
    """``name[@K]``: k from the label, else ``k``, else the default."""
    try:
        chosen = int(text) if text else (default_k if k is None else k)
    except ValueError:
        raise ValueError(f"{name} takes only @K, such as {name}@4; got @{text}") from None
    return f"{name} k={chosen}", {"num_speculative_tokens": chosen}


def _draft_model(text: str, k: int | None) -> Parsed:
    text, *extras = text.split("+")
    label, fields = k_label("draft_model", text, k, registry.get("draft_model").default_k)
    for extra in extras:
        if extra == "suffix":
            label, fields = f"suffix+{label}", {**fields, "suffix_first": True}
        elif "draft_shortlist" in fields:
            raise ValueError("draft_model takes one +SHORTLIST, such as draft_model@5+fr:4096")
        else:
            label, fields = f"{label} {extra}", {**fields, "draft_shortlist": extra}
    return label, fields


def _medusa(text: str, k: int | None) -> Parsed:
    tree = text.replace(".", ",") if text else "default"
    return "medusa" + (f" tree={text}" if text else ""), {"tree": tree}


def _eagle(text: str, k: int | None) -> Parsed:
    label_tree, *extras = text.split("+")
    shape, p, min_prob = label_tree.partition("p")
    if p and not (shape and min_prob):  # "p0.05" alone would read as the default tree
        raise ValueError(
            f"eagle takes @DEPTH.TOPK.TOKENS[pMIN_PROB], such as eagle@6.4.10p0.1; got @{text}"
        )
    tree = shape.replace(".", ",") + (f",{min_prob}" if min_prob else "") if shape else "default"
    fields: dict[str, Any] = {"tree": tree}
    label = "eagle" + (f" tree={tree}" if label_tree else "")
    for extra in extras:
        if extra == "suffix":
            label, fields["suffix_first"] = f"suffix+{label}", True
            continue
        key = "eagle_lookup" if extra.isdigit() else "draft_shortlist"
        if key in fields:
            raise ValueError(
                "eagle takes at most one +N (the prompt-lookup tokens grafted onto its tree) and "
                "one +SHORTLIST, such as eagle@6.4.10p0.1+5+dyna-pa:8"
            )
        fields[key] = int(extra) if key == "eagle_lookup" else extra
        label += f" lookup={extra}" if key == "eagle_lookup" else f" {extra}"
    return label, fields


def _ar(text: str, k: int | None) -> Parsed:
    if text:
        raise ValueError("ar (plain decoding) takes no options")
    return "ar", {}


def _lookahead(text: str, k: int | None) -> Parsed:
    try:
        values = [int(v) for v in text.split(".")] if text else []
        if values and len(values) != 3:
            raise ValueError
    except ValueError:
        raise ValueError("lookahead takes @W.N.G, such as lookahead@4.4.3") from None
    names = ("lookahead_window", "lookahead_ngram", "lookahead_candidates")
    return "lookahead" + (f" W.N.G={text}" if text else ""), dict(zip(names, values, strict=False))


LABELS: dict[str, Callable[[str, int | None], Parsed]] = {
    "ar": _ar,
    "draft_model": _draft_model,
    "medusa": _medusa,
    "eagle": _eagle,
    "lookahead": _lookahead,
}


def parse_label(part: str, k: int | None = None) -> tuple[str, SpecConfig]:
    """One label (``eagle@3.1.3+0``) -> (the label as reported, its spec)."""
    if part.endswith(("~", "!")):
        label, spec = parse_label(part[:-1], k)
        sized = part.endswith("~")
        try:
            spec = dataclasses.replace(spec, adaptive_k=sized)
        except ValueError as error:
            raise ValueError(f"methods: {part!r}: {error}") from None
        return f"{label} {'adaptive' if sized else 'whole'}", spec
    match = re.match(r"[A-Za-z0-9_]*", part)
    name = match.group(0) if match else ""
    after = part[len(name) :]
    rest = after.removeprefix("@")
    try:
        entry = registry.get(name)
    except ValueError as error:
        raise ValueError(f"methods: unknown method {name!r}; {error}") from None
    try:
        parser = LABELS.get(entry.name)
        if parser is None and after and not after.startswith("@"):
            raise ValueError(f"{entry.name} takes only @K, such as {entry.name}@4; got {after}")
        if parser is None:
            label, fields = k_label(entry.name, rest, k, entry.default_k)
        else:
            label, fields = parser(rest, k)
        return label, registry.make_spec(entry.name, **fields)
    except ValueError as error:
        raise ValueError(f"methods: {part!r}: {error}") from None


def label_of(spec: SpecConfig) -> str:
    """The label a spec of the built-in trained methods is reported under (what the bench
    called it), for priors measured by the bench; the method's name for others."""
    _, options = registry.resolve(spec)
    if isinstance(options, EagleOptions):
        shape, lookup, shortlist = options.tree.shape, options.eagle_lookup, options.draft_shortlist
        text = "" if shape is None else f"{shape.depth}.{shape.topk}.{shape.tokens}"
        text += f"p{shape.min_prob!r}" if shape is not None and shape.min_prob else ""
        text += "" if lookup is None else f"+{lookup}"
        text += "" if shortlist is None or shortlist.full else f"+{shortlist}"
        text += "+suffix" if options.suffix_first else ""
        return _eagle(text, None)[0]
    if isinstance(options, MedusaOptions):
        tree = str(options.tree)
        return "medusa" if tree == "default" else f"medusa tree={tree}"
    return str(spec.method)
