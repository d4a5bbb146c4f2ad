"""`quickdraft generate`: one prompt, text with accepted drafts marked, statistics."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.text import Text

from quickdraft.cli.common import (
    _threads,
    add_quant,
    auto_method,
    console,
    finite_float,
    load_speculation,
    strict_int,
)

DEFAULT_PROMPT = (
    "Write a Python function is_palindrome(text) that ignores case and "
    "punctuation, then show three example calls and their results."
)


def _add_generate(commands: argparse._SubParsersAction) -> None:
    from quickdraft.config import AcceptRule
    from quickdraft.drafters import registry
    from quickdraft.models.loading import DEFAULT_MODEL
    from quickdraft.models.sources import ALIASES

    generate = commands.add_parser(
        "generate",
        help="generate text with speculative decoding; with no arguments, the "
        "default model on a built-in prompt",
        description="Accepted draft tokens are shown in cyan. Acceptance rules: "
        "rejection_sampling (lossless, default), greedy (lossless) and typical (Medusa-2's, "
        "LOSSY: the output no longer follows the target's distribution at temperature > 0).",
    )
    generate.add_argument(
        "prompt", nargs="?", default=None, help="the prompt (default: a built-in chat prompt)"
    )
    generate.add_argument(
        "--target",
        default=DEFAULT_MODEL,
        help=f"alias ({', '.join(ALIASES)}), GGUF file, folder or hub id",
    )
    generate.add_argument(
        "--method",
        default="auto",
        choices=["auto", *registry.names()],
        help="auto: eagle with --eagle-dir, medusa with --medusa-dir, draft_model with --draft, "
        "else eagle where an EAGLE drafter ships for "
        "the target (the fastest method measured for it), else ngram; "
        + "; ".join(f"{entry.name}: {entry.description}" for entry in registry.entries()),
    )
    generate.add_argument("--draft", default=None, help="draft model for --method draft_model")
    generate.add_argument(
        "-k",
        "--num-speculative-tokens",
        type=strict_int,
        default=None,
        help="draft tokens per step (default: the method's, 4 for draft_model, 5 for ngram); "
        "eagle, medusa and lookahead size their drafts with their own options and ignore it",
    )
    generate.add_argument(
        "--acceptance", default="rejection_sampling", choices=[rule.value for rule in AcceptRule]
    )
    generate.add_argument(
        "--adaptive-k",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="size each step's draft by expected goodput (default): k up to -k, a tree's best "
        "nodes, or no draft while plain decoding is faster on this host, from the running "
        "acceptance and the verify costs measured at load; --no-adaptive-k drafts whole",
    )
    generate.add_argument(
        "--temperature", type=finite_float, default=0.0, help="0 is greedy (default)"
    )
    generate.add_argument("--top-k", type=strict_int, default=0)
    generate.add_argument("--top-p", type=finite_float, default=1.0)
    generate.add_argument("--max-new-tokens", type=strict_int, default=128)
    generate.add_argument("--seed", type=strict_int, default=None)
    generate.add_argument("--draft-temperature", type=finite_float, default=None)
    generate.add_argument(
        "--draft-int8",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="quantized weights for the draft model (int8), or the trained Medusa/EAGLE "
        "drafter (4-bit codes on the compiled kernels, else int8), on CPU (default on; the "
        "output stays exact, only acceptance can change)",
    )
    generate.add_argument(
        "--shortlist",
        default=None,
        help="drafter head vocabulary for draft_model, medusa and eagle: full, fr:K, "
        "fr-pa:K, dyna:K, dyna-pa:K, dyna-hybrid:K or dyna-hybrid-pa:K (FR-Spec / DynaSpec; "
        "exact, the target verifies over the full vocabulary). Default: the one an EAGLE "
        "drafter's eagle.json names, else full",
    )
    generate.add_argument(
        "--shortlist-dir",
        default=None,
        help="folder of shortlist artifacts (default: those shipped for the model whose head "
        "is shortlisted: --draft, or --target for medusa and eagle)",
    )
    generate.add_argument(
        "--medusa-dir",
        default=None,
        help="folder of Medusa heads (default: those shipped for --target)",
    )
    generate.add_argument(
        "--eagle-dir",
        default=None,
        help="folder of an EAGLE drafter (default: the one shipped for --target)",
    )
    generate.add_argument(
        "--tree",
        default="default",
        help="draft tree. medusa: default, fit:N, or sibling counts per depth such as 4,2,1; "
        "eagle: default or DEPTH,TOPK,TOKENS[,MIN_PROB] of its dynamic tree, such as 4,4,12 "
        "or 6,4,10,0.1 (nodes below that path probability are not drafted)",
    )
    generate.add_argument(
        "--eagle-lookup",
        type=strict_int,
        default=None,
        help="eagle: the most prompt-lookup tokens grafted onto each draft tree (default 5; "
        "0 drafts with the EAGLE network alone)",
    )
    for name, what in (
        ("window", "Jacobi window W"),
        ("ngram", "n-gram size N"),
        ("candidates", "pool candidates verified per step G"),
    ):
        generate.add_argument(
            f"--lookahead-{name}",
            type=strict_int,
            default=None,
            help=f"lookahead: the {what} (default: measured for the device)",
        )
    for name, kind, what in (
        ("max-depth", strict_int, "longest substring counted (default 24)"),
        ("spec-factor", finite_float, "draft nodes per matched token (default 1)"),
        ("min-prob", finite_float, "least probability of a drafted node (default 0.1)"),
        ("cache-tokens", strict_int, "cap of the shared trie in tokens (default 1,000,000)"),
    ):
        generate.add_argument(
            f"--suffix-{name}", type=kind, default=None, help=f"suffix: the {what}"
        )
    generate.add_argument(
        "--json-schema",
        type=Path,
        default=None,
        metavar="FILE",
        help="structured output: the reply is JSON valid against this JSON Schema file",
    )
    generate.add_argument(
        "--regex", default=None, help="structured output: the reply matches this regex"
    )
    generate.add_argument(
        "--choice",
        action="append",
        default=None,
        help="structured output: the reply is one of these (repeat the flag for each)",
    )
    generate.add_argument(
        "--suffix-first",
        action="store_true",
        help="eagle, draft_model: suffix decoding in front; a step whose suffix draft is "
        "expected to beat the drafter's uses it alone",
    )
    generate.add_argument("--prompt-lookup-min", type=strict_int, default=1)
    generate.add_argument("--prompt-lookup-max", type=strict_int, default=3)
    generate.add_argument("--threads", type=_threads, default=None, help="torch intra-op threads")
    generate.add_argument("--device", default="cpu")
    generate.add_argument("--backend", default="auto", choices=["auto", "native", "hf"])
    add_quant(generate)
    generate.add_argument(
        "--chat",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="wrap the prompt in the chat template (default: on for the built-in prompt)",
    )
    generate.add_argument("--stream", action="store_true", help="print tokens as they come")
    generate.add_argument(
        "--json", action="store_true", help='print {"token_ids", "text", "stats"} as JSON'
    )


def _schema_file(path: Path | None) -> str | None:
    """The text of --json-schema's file; one line naming the file when it cannot be read
    (whether it holds a schema is the constraint's check)."""
    if path is None:
        return None
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) else "not UTF-8 text"
        raise ValueError(f"json_schema: cannot read {path} ({reason})") from None


def _generate(args: argparse.Namespace) -> int:
    import json

    import torch

    from quickdraft.config import SamplingParams
    from quickdraft.drafters import registry
    from quickdraft.engine import generate
    from quickdraft.kernels import describe_weights
    from quickdraft.models.llama import quant_layout
    from quickdraft.models.tokenizer import same_vocabulary

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    method = args.method
    if method == "auto":  # a drafter's folder given says which method it is for
        method = "eagle" if args.eagle_dir else "medusa" if args.medusa_dir else None
        method = method or auto_method(args.target, args.draft, args.backend)
    entry = registry.get(method)
    options = registry.given_options(
        {
            "draft_temperature": args.draft_temperature,
            "prompt_lookup_min": args.prompt_lookup_min,
            "prompt_lookup_max": args.prompt_lookup_max,
            "draft_shortlist": args.shortlist,
            "shortlist_dir": args.shortlist_dir,
            "medusa_dir": args.medusa_dir,
            "tree": args.tree,
            "eagle_dir": args.eagle_dir,
            "eagle_lookup": args.eagle_lookup,
            "drafter_int8": args.draft_int8,
            "lookahead_window": args.lookahead_window,
            "lookahead_ngram": args.lookahead_ngram,
            "lookahead_candidates": args.lookahead_candidates,
            "suffix_max_depth": args.suffix_max_depth,
            "suffix_spec_factor": args.suffix_spec_factor,
            "suffix_min_prob": args.suffix_min_prob,
            "suffix_cache_tokens": args.suffix_cache_tokens,
            "suffix_first": args.suffix_first,
        }
    )
    if "drafter_int8" not in entry.option_names():  # a draft model's int8 is how it loads
        options.pop("drafter_int8", None)
    spec = registry.make_spec(
        entry.name, args.num_speculative_tokens, args.acceptance,
        adaptive_k=getattr(args, "adaptive_k", True), **options,
    )  # fmt: skip
    sampling = SamplingParams(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
        json_schema=_schema_file(args.json_schema),
        regex=args.regex,
        choice=tuple(args.choice) if args.choice else None,
    )
    target, tokenizer, draft_model, draft_tokenizer = load_speculation(
        args.target,
        spec,
        args.draft,
        device=args.device,
        backend=args.backend,
        draft_int8=args.draft_int8,
        quant=args.quant,
    )
    same = None if draft_tokenizer is None else same_vocabulary(tokenizer, draft_tokenizer)
    draft = registry.build_drafter(
        spec, target, draft_model, same_tokenizer=same, draft_name=args.draft,
        target_name=args.target,
    )  # fmt: skip
    chat = args.chat if args.chat is not None else args.prompt is None
    text = args.prompt if args.prompt is not None else DEFAULT_PROMPT
    prompt = tokenizer.apply_chat(text) if chat else tokenizer.encode(text)

    printer = _MarkedPrinter(tokenizer)
    on_step = None
    if args.stream and not args.json:

        def on_step(output: Any) -> None:
            printer.show(output.token_ids, output.from_draft)

    out = generate(
        target,
        prompt,
        sampling=sampling,
        spec=spec,
        draft=draft,  # the drafter built above from spec: its tokenizers were checked there
        tokenizer=tokenizer,
        on_step=on_step,
    )
    if out.finish_reason == "error":  # its text matches nothing: not a result (exit 2)
        kind = sampling.constraint.kind if sampling.constraint is not None else "constraint"
        raise ValueError(
            f"{kind}: the grammar library could not follow this constraint past part of the "
            "output (a limit of its per-token work); simplify the constraint"
        )
    if args.json:
        print(
            json.dumps({"token_ids": out.token_ids, "text": out.text, "stats": out.stats.to_dict()})
        )
        return 0
    printer.show(out.token_ids, out.from_draft)
    console.print()
    head = getattr(draft, "shortlist", None)
    vocab = "" if head is None else f", {head.name} mean {head.mean_size():.0f} tokens"
    shape = "no drafts" if draft is None else draft.describe()
    layout = quant_layout(target)
    weights = "" if args.quant is None else f", target {describe_weights(args.quant, layout)}"
    console.print(
        f"[dim]{entry.name}, {shape}{vocab}{weights}: {out.stats.summary()}; "
        f"finish: {out.finish_reason}[/dim]"
    )
    return 0


class _MarkedPrinter:
    """Prints new text as it arrives; accepted draft tokens in cyan."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.shown_tokens = 0
        self.shown_text = ""

    def show(self, ids: list[int], from_draft: list[bool]) -> None:
        piece = Text()
        for index in range(self.shown_tokens, len(ids)):
            text = self.tokenizer.decode(ids[: index + 1])
            if text.endswith("\ufffd") and index + 1 < len(ids):
                continue  # an incomplete multi-byte character: wait for the next token
            piece.append(text[len(self.shown_text) :], style="cyan" if from_draft[index] else None)
            self.shown_text = text
        self.shown_tokens = len(ids)
        console.print(piece, end="", soft_wrap=True)
