"""`quickdraft export ...`: drafters in the layouts other serving engines load."""

from __future__ import annotations

import argparse
from pathlib import Path

from quickdraft.cli.common import console, strict_int
from quickdraft.interop.eagle_gguf import FILE


def _add_export(commands: argparse._SubParsersAction) -> None:
    export = commands.add_parser(
        "export", help="write trained drafters in the layouts other inference engines load"
    )
    kinds = export.add_subparsers(dest="export_kind", required=True)
    eagle = kinds.add_parser(
        "eagle",
        help="an EAGLE drafter as a vLLM / SGLang draft model folder (config.json + "
        "model.safetensors) or a llama.cpp draft GGUF (EAGLE-3)",
    )
    eagle.add_argument(
        "--target", required=True, help="the target it was trained for (its LM head rows)"
    )
    eagle.add_argument(
        "--eagle-dir", default=None, help="the drafter (default: the one shipped for --target)"
    )
    eagle.add_argument("--out", type=Path, required=True)
    eagle.add_argument(
        "--engine",
        choices=["vllm", "sglang", "llama.cpp"],
        default="vllm",
        help="EAGLE-1 folders differ (vLLM's fc has no bias, SGLang's has one); EAGLE-3 "
        "folders load in both; llama.cpp takes EAGLE-3 drafters as one GGUF file "
        f"(OUT/{FILE})",
    )
    eagle.add_argument(
        "--target-gguf",
        type=Path,
        default=None,
        help="llama.cpp only: the target's GGUF file, whose vocabulary the draft carries "
        "(default: the GGUF of a --target alias)",
    )
    medusa = kinds.add_parser(
        "medusa", help="Medusa heads as a vLLM Medusa draft model folder (SGLang has no Medusa)"
    )
    medusa.add_argument("--target", required=True, help="the target the heads belong to")
    medusa.add_argument(
        "--medusa-dir", default=None, help="the heads (default: those shipped for --target)"
    )
    medusa.add_argument("--out", type=Path, required=True)
    token_map = kinds.add_parser(
        "token-map",
        help="a shortlist as SGLang's --speculative-token-map (FR-Spec for EAGLE-1/2 drafts)",
        description="Writes OUT/token_map.pt: a 1-D tensor of token ids (torch.save), which "
        "SGLang reads with --speculative-token-map to score only those rows of the target's "
        "head in EAGLE-1/2 drafts (EAGLE-3 carries its own d2t).",
    )
    token_map.add_argument("--shortlist-dir", type=Path, required=True)
    which = token_map.add_mutually_exclusive_group(required=True)
    which.add_argument("--fr", type=strict_int, metavar="K", help="the K most frequent tokens")
    which.add_argument(
        "--core", action="store_true", help="a DynaSpec artifact's core (its unclustered tokens)"
    )
    token_map.add_argument("--out", type=Path, required=True)


def _export(args: argparse.Namespace) -> int:
    if args.export_kind == "medusa":
        return _export_medusa(args)
    if args.export_kind == "token-map":
        return _export_token_map(args)
    return _export_eagle(args)


def _export_token_map(args: argparse.Namespace) -> int:
    import torch

    from quickdraft.vocab.shortlist import load_clusters, load_ranked

    if args.core:
        ids = torch.nonzero(load_clusters(args.shortlist_dir) == -1).flatten()
        if ids.numel() == 0:
            raise ValueError(f"shortlist_dir: {args.shortlist_dir} clusters every token (no core)")
    else:
        ranked = load_ranked(args.shortlist_dir)
        if not 1 <= args.fr <= ranked.numel():
            raise ValueError(f"fr: must be in 1..{ranked.numel()}, got {args.fr}")
        ids = ranked[: args.fr]
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "token_map.pt"
    torch.save(torch.sort(ids).values.long().clone(), path)
    console.print(f"wrote {path} ({ids.numel():,} token ids)")
    console.print(f"  SGLang (EAGLE-1/2 drafts): --speculative-token-map {path}", soft_wrap=True)
    return 0


def _export_medusa(args: argparse.Namespace) -> int:
    from quickdraft.drafters.medusa.net import heads_folder, load_heads
    from quickdraft.interop import launch
    from quickdraft.interop.launch import model_path
    from quickdraft.interop.medusa_export import export_medusa
    from quickdraft.models.loading import load_model

    target, _ = load_model(args.target)
    heads = load_heads(heads_folder(args.target, args.medusa_dir))
    if heads.config.vocab_size != target.vocab_size:
        raise ValueError(
            f"medusa_dir: heads for a vocabulary of {heads.config.vocab_size}, the target has "
            f"{target.vocab_size}"
        )
    width = target.config.hidden_size  # type: ignore[attr-defined]
    if heads.config.hidden_size != width:  # the Qwen aliases share a vocabulary, not a width
        raise ValueError(
            f"medusa_dir: heads for hidden size {heads.config.hidden_size}, the target's is {width}"
        )
    folder = export_medusa(heads, target.head_weight.float(), args.out)  # type: ignore[attr-defined]
    console.print(f"wrote {folder} ({heads.config.num_heads} heads, for vllm)")
    config = launch.medusa(heads.config.num_heads, ("", Path(folder)))[0]
    console.print(f"  {config.command(model_path(args.target))}", soft_wrap=True)
    return 0


def _export_eagle(args: argparse.Namespace) -> int:
    from quickdraft.drafters.eagle.io import eagle_folder, load_eagle, run_choices
    from quickdraft.drafters.eagle.net import check_fits
    from quickdraft.drafters.eagle.tree import EagleTree
    from quickdraft.interop import launch
    from quickdraft.interop.eagle_export import export_eagle
    from quickdraft.interop.eagle_gguf import export_eagle_gguf
    from quickdraft.interop.launch import model_path
    from quickdraft.models.loading import load_model

    if args.target_gguf is not None and args.engine != "llama.cpp":
        raise ValueError("target_gguf: only --engine llama.cpp takes the target's GGUF")
    target_file = _target_gguf(args) if args.engine == "llama.cpp" else None
    target, _ = load_model(args.target)
    source = eagle_folder(args.target, args.eagle_dir)
    net = load_eagle(source, target.config.num_layers)
    check_fits(net, target)  # an export must load where generate would
    head = target.head_weight  # type: ignore[attr-defined]
    tree = EagleTree().resolve("cuda")  # the engines run on GPUs
    if target_file is not None:
        written = export_eagle_gguf(
            net, head.float(), target_file, args.out / FILE, target.max_positions
        )
        console.print(f"wrote {written} ({net.config.variant}, for llama.cpp)")
        folder = args.out
    else:
        choices = run_choices(source)
        folder = export_eagle(
            net, head.float(), args.out, args.engine, target.max_positions, choices
        )
        console.print(f"wrote {folder} ({net.config.variant}, for {args.engine})")
    export = {engine: ("", Path(folder)) for engine in launch.ENGINES}
    token_map = net.config.variant == "eagle1" and (Path(folder) / "token_map.pt").exists()
    configs = launch.eagle(
        net.config.variant, tree.depth, tree.topk, tree.tokens, export, token_map=token_map
    )
    config = next(c for c in configs if c.engine == args.engine)
    where = str(target_file) if target_file is not None else model_path(args.target)
    console.print(f"  {config.command(where)}", soft_wrap=True)
    return 0


def _target_gguf(args: argparse.Namespace) -> Path:
    """The target GGUF a llama.cpp export copies its vocabulary from: the given file, else the
    one packaged for a --target alias."""
    from quickdraft.models.sources import ALIASES, packaged_gguf

    if args.target_gguf is not None:
        if not args.target_gguf.is_file():
            raise ValueError(f"target_gguf: {args.target_gguf} is not a file")
        return args.target_gguf
    if args.target not in ALIASES:
        raise ValueError(
            "target_gguf: required for --engine llama.cpp when --target is not one of "
            f"{', '.join(sorted(ALIASES))} (the target's GGUF, whose vocabulary the draft carries)"
        )
    return packaged_gguf(args.target)
