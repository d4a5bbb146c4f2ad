"""The built-in methods, one registry entry each (``quickdraft.methods``): builder, option
checks, bench labels and description. A new method adds its own entry the same way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quickdraft.config import (
    MAX_DRAFT_TOKENS,
    MAX_SPECULATIVE_TOKENS,
    MAX_TREE_DEPTH,
    SpecConfig,
    check_range,
    check_temperature,
)
from quickdraft.drafters.base import Drafter
from quickdraft.drafters.draft_model.drafter import DraftModelDrafter
from quickdraft.drafters.eagle.drafter import build_eagle
from quickdraft.drafters.eagle.io import eagle_folder
from quickdraft.drafters.eagle.tree import DEFAULT_LOOKUP, DynamicTree
from quickdraft.drafters.lookahead import LookaheadConfig, build_lookahead
from quickdraft.drafters.medusa.drafter import build_medusa
from quickdraft.drafters.medusa.net import heads_folder
from quickdraft.drafters.medusa.tree import check_tree
from quickdraft.drafters.ngram import NGramDrafter
from quickdraft.methods import (
    BuildContext,
    MethodEntry,
    k_label,
    register,
)
from quickdraft.pick.candidates import PICK
from quickdraft.vocab import (
    ClusterShortlist,
    Shortlist,
    artifact_folder,
    build_shortlist,
    parse_shortlist,
)

# -- draft_model ------------------------------------------------------------------------------


def _build_draft_model(spec: SpecConfig, context: BuildContext) -> Drafter:
    target, draft = context.target, context.draft
    if draft is None:
        raise ValueError("draft: method draft_model needs a draft model")
    if context.same_tokenizer is False:
        raise ValueError(
            "draft: the draft model's tokenizer differs from the target's; "
            "draft and target must share one vocabulary"
        )
    if draft.vocab_size != target.vocab_size and not context.same_tokenizer:
        raise ValueError(
            f"draft: its vocabulary ({draft.vocab_size}) differs from the target's "
            f"({target.vocab_size}); pass both tokenizers to check they agree"
        )
    shortlist = shortlist_for(spec, context.draft_name, spec.num_speculative_tokens)
    return DraftModelDrafter(
        draft,
        spec.num_speculative_tokens,
        spec.draft_temperature,
        vocab_size=target.vocab_size,
        shortlist=shortlist,
    )


def _check_draft_model(spec: SpecConfig) -> None:
    if spec.draft_temperature is not None:
        check_temperature("draft_temperature", spec.draft_temperature)
        object.__setattr__(spec, "draft_temperature", float(spec.draft_temperature))
    _check_shortlist(spec)


# -- shortlists: draft_model, medusa and eagle --------------------------------------------

SHORTLIST_OPTIONS = ("draft_shortlist", "shortlist_dir")


def shortlist_for(
    spec: SpecConfig,
    head_model: str | None,
    positions: int,
    inputs: str = "hidden",
    shipped: Path | None = None,
) -> Shortlist | None:
    """The drafter head's shortlist, or None for the full head. Its artifacts belong to the
    model whose LM head is shortlisted: the draft model's, or the target's for Medusa and
    EAGLE (which score the target's own head rows); ``shipped``, when it exists, comes first
    (an EAGLE drafter's own folder). A DynaSpec router must have learnt from the states this
    drafter hands it (``inputs``): a draft model's or the target's hidden states, or an EAGLE
    drafter's features; the widths match either way, so this is checked by name."""
    if spec.draft_shortlist == "full":
        return None
    if spec.shortlist_dir is None and shipped is not None and shipped.is_dir():
        folder = shipped
    else:
        folder = artifact_folder(head_model, spec.shortlist_dir)
    shortlist = build_shortlist(spec.draft_shortlist, folder, positions)
    if isinstance(shortlist, ClusterShortlist) and shortlist.router.inputs != inputs:
        raise ValueError(
            f"shortlist_dir: the router in {folder} learnt from {shortlist.router.inputs} "
            f"states, this drafter gives it {inputs} states; train one with quickdraft train "
            "router" + (" --eagle-dir" if inputs == "eagle" else "")
        )
    return shortlist


def _check_shortlist(spec: SpecConfig) -> None:
    try:
        parse_shortlist(spec.draft_shortlist)
    except ValueError as error:
        raise ValueError(f"draft_{error}") from None


def _draft_model_label(text: str, k: int | None) -> tuple[str, dict[str, Any]]:
    """``draft_model[@K][+SHORTLIST]`` (``draft_model@5+dyna-pa:32``)."""
    text, _, shortlist = text.partition("+")
    label, fields = k_label("draft_model", text, k, 4)
    if shortlist:
        label, fields = f"{label} {shortlist}", {**fields, "draft_shortlist": shortlist}
    return label, fields


# -- ngram --------------------------------------------------------------------------------


def _build_ngram(spec: SpecConfig, context: BuildContext) -> Drafter:
    return NGramDrafter(
        context.target.vocab_size,
        spec.num_speculative_tokens,
        spec.prompt_lookup_min,
        spec.prompt_lookup_max,
    )


# -- medusa -------------------------------------------------------------------------------


def _build_medusa(spec: SpecConfig, context: BuildContext) -> Drafter:
    folder = heads_folder(context.target_name, spec.medusa_dir)
    shortlist = shortlist_for(spec, context.target_name, MAX_TREE_DEPTH)  # its last size repeats
    return build_medusa(
        context.target, folder, spec.tree, int8=spec.drafter_int8, shortlist=shortlist
    )


def _check_medusa(spec: SpecConfig) -> None:
    check_tree(spec.tree)
    _check_shortlist(spec)


def _medusa_label(text: str, k: int | None) -> tuple[str, dict[str, Any]]:
    """``medusa[@W.W.W]``: the tree's sibling counts per depth (``medusa@4.2.1``)."""
    tree = text.replace(".", ",") if text else "default"
    return "medusa" + (f" tree={text}" if text else ""), {"tree": tree}


def _describe_tree(spec: SpecConfig, drafter: Any) -> str:
    return f"tree of {drafter.needs.tokens} nodes, depth {drafter.needs.depth}"


# -- eagle --------------------------------------------------------------------------------


def _build_eagle(spec: SpecConfig, context: BuildContext) -> Drafter:
    folder = eagle_folder(context.target_name, spec.eagle_dir)
    return build_eagle(
        context.target,
        folder,
        spec.tree,
        int8=spec.drafter_int8,
        lookup=DEFAULT_LOOKUP if spec.eagle_lookup is None else spec.eagle_lookup,
        lookup_ngram=(spec.prompt_lookup_min, spec.prompt_lookup_max),
        shortlist=shortlist_for(
            spec,
            context.target_name,
            DynamicTree.parse(spec.tree, context.target.device.type).depth,
            inputs="eagle",
            shipped=folder / "shortlist",
        ),
    )


def _check_eagle(spec: SpecConfig) -> None:
    _check_shortlist(spec)
    if spec.eagle_lookup is not None:
        check_range("eagle_lookup", spec.eagle_lookup, 0, MAX_SPECULATIVE_TOKENS, integer=True)
    tree = DynamicTree.parse(spec.tree)
    lookup = DEFAULT_LOOKUP if spec.eagle_lookup is None else spec.eagle_lookup
    if tree.tokens + lookup > MAX_DRAFT_TOKENS:
        raise ValueError(
            f"tree: {tree.tokens} tokens plus eagle_lookup {lookup} exceed the "
            f"{MAX_DRAFT_TOKENS} tokens of one verify pass"
        )


def _eagle_label(text: str, k: int | None) -> tuple[str, dict[str, Any]]:
    """``eagle[@D.K.N[pMIN_PROB]][+LOOKUP][+SHORTLIST]``: the dynamic tree (``eagle@6.4.10p0.1``
    is ``--tree 6,4,10,0.1``), the prompt-lookup tokens grafted on (``+0``: none) and the
    head's shortlist (``eagle+0+dyna-pa:8``; a number after ``+`` is the lookup, anything else
    a shortlist, as ``draft_model@5+dyna-pa:32``)."""
    tree_text, *extras = text.split("+")
    shape, _, min_prob = tree_text.partition("p")
    tree = shape.replace(".", ",") + (f",{min_prob}" if min_prob else "") if shape else "default"
    fields: dict[str, Any] = {"tree": tree}
    label = "eagle" + (f" tree={tree}" if tree_text else "")
    for extra in extras:
        key = "eagle_lookup" if extra.isdigit() else "draft_shortlist"
        if key in fields:
            raise ValueError(
                "eagle takes at most one +N (the prompt-lookup tokens grafted onto its tree) and "
                "one +SHORTLIST, such as eagle@6.4.10p0.1+5+dyna-pa:8"
            )
        if key == "eagle_lookup":
            fields[key] = int(extra)
            label += f" lookup={extra}"
        else:
            try:
                parse_shortlist(extra)
            except ValueError as error:
                raise ValueError(
                    f"eagle takes +N, the prompt-lookup tokens grafted onto its tree, or "
                    f"+SHORTLIST ({error})"
                ) from None
            fields[key] = extra
            label += f" {extra}"
    return label, fields


def _describe_eagle(spec: SpecConfig, drafter: Any) -> str:
    tree = drafter.tree
    shape = f"dynamic tree: depth {tree.depth}, top-{tree.topk}, {tree.tokens} tokens"
    if tree.min_prob:
        shape += f" of path probability >= {tree.min_prob:g}"
    if drafter.lookup is not None:
        shape += f", + up to {drafter.lookup.num_tokens} of prompt lookup"
    return shape


# -- lookahead ----------------------------------------------------------------------------

LOOKAHEAD_OPTIONS = ("lookahead_window", "lookahead_ngram", "lookahead_candidates")


def _build_lookahead(spec: SpecConfig, context: BuildContext) -> Drafter:
    return build_lookahead(spec, context.target)


def _check_lookahead(spec: SpecConfig) -> None:
    given = {name[len("lookahead_") :]: getattr(spec, name) for name in LOOKAHEAD_OPTIONS}
    LookaheadConfig(**{name: value for name, value in given.items() if value is not None})


def _lookahead_label(text: str, k: int | None) -> tuple[str, dict[str, Any]]:
    """``lookahead[@W.N.G]`` (``lookahead@4.4.3``)."""
    try:
        values = [int(v) for v in text.split(".")] if text else []
        if values and len(values) != 3:
            raise ValueError
    except ValueError:
        raise ValueError("lookahead takes @W.N.G, such as lookahead@4.4.3") from None
    label = "lookahead" + (f" W.N.G={text}" if text else "")
    return label, dict(zip(LOOKAHEAD_OPTIONS, values, strict=False))


def _describe_lookahead(spec: SpecConfig, drafter: Any) -> str:
    config = drafter.config
    return f"W={config.window} N={config.ngram} G={config.candidates}"


# -- the entries ----------------------------------------------------------------------

register(
    MethodEntry(
        "ar",
        "plain autoregressive decoding: no drafts, the baseline",
        lambda spec, context: None,
        drafts=False,
        parse_label=lambda text, k: ("ar", {}),
        describe=lambda spec, drafter: "no drafts",
        pick=PICK["ar"],
    )
)
register(
    MethodEntry(
        "draft_model",
        "a smaller model of the same tokenizer drafts k tokens (optionally on a shortlist)",
        _build_draft_model,
        options=("draft_temperature", *SHORTLIST_OPTIONS),
        check=_check_draft_model,
        parse_label=_draft_model_label,
        draft_model=True,
        head_rows=lambda drafter, target: drafter.vocab_size,
        pick=PICK["draft_model"],
    )
)
register(
    MethodEntry(
        "ngram",
        "prompt lookup: copies what followed the last n tokens earlier in the text",
        _build_ngram,
        default_k=5,
        head_rows=lambda drafter, target: 0,
        pick=PICK["ngram"],
    )
)
register(
    MethodEntry(
        "medusa",
        "Medusa heads on the target draft a tree (trained per target)",
        _build_medusa,
        options=("medusa_dir", "tree", *SHORTLIST_OPTIONS),
        check=_check_medusa,
        parse_label=_medusa_label,
        describe=_describe_tree,
        head_rows=lambda drafter, target: target.vocab_size,
        pick=PICK["medusa"],
    )
)
register(
    MethodEntry(
        "eagle",
        "an EAGLE drafter on the target's features grows a dynamic tree (trained per target)",
        _build_eagle,
        options=("eagle_dir", "tree", "eagle_lookup", *SHORTLIST_OPTIONS),
        check=_check_eagle,
        parse_label=_eagle_label,
        describe=_describe_eagle,
        head_rows=lambda drafter, target: drafter.head_rows,
        pick=PICK["eagle"],
    )
)
register(
    MethodEntry(
        "lookahead",
        "lookahead decoding: Jacobi iteration and an n-gram pool, nothing trained",
        _build_lookahead,
        options=LOOKAHEAD_OPTIONS,
        check=_check_lookahead,
        parse_label=_lookahead_label,
        describe=_describe_lookahead,
        head_rows=lambda drafter, target: 0,
        pick=PICK["lookahead"],
    )
)
