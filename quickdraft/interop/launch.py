"""Configurations and commands for other serving engines: vLLM, SGLang and llama.cpp.

quickdraft's configuration of a method becomes vLLM's ``--speculative-config`` JSON or SGLang's
``--speculative-*`` flags, with the commands to run first where a drafter has to be exported.
llama.cpp's form is ``llama-server`` with its ``--spec-*`` flags, over GGUF files (the target's,
a draft model's, an EAGLE-3 drafter exported by ``quickdraft export eagle --engine llama.cpp``).
Only keys and flags those engines define are written; ``tests/test_interop_launch.py`` holds their
lists with the source files they were read from. Where an engine has no equivalent (lookahead
in all three, Medusa in SGLang and llama.cpp, EAGLE-1 in llama.cpp) the result says so instead
of printing something that would not load.

Engines differ from quickdraft in ways the notes name: vLLM drafts EAGLE as a chain (its trees
are static), and neither engine takes quickdraft's drafter shortlists, so they score the full
vocabulary there (same output, slower drafts).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from quickdraft.config import SpecConfig
    from quickdraft.pick.context import PickContext

ENGINES = ("vllm", "sglang", "llama.cpp")
NAMES = {"vllm": "vLLM", "sglang": "SGLang", "llama.cpp": "llama.cpp"}


@dataclass(frozen=True, slots=True)
class LaunchConfig:
    """One engine's form of a configuration.

    speculative: vLLM's speculative_config (a dict), SGLang's or llama.cpp's flags (a list);
        empty for plain decoding; None when the engine cannot run the method (``note`` says
        why).
    prepare: commands to run first, in order (exporting the drafter into ``speculative``'s
        path).
    note: how the engine's run differs from quickdraft's, or why there is none.
    model: the file this engine loads in place of the target given to ``command`` (llama.cpp:
        the target's GGUF), if any.
    """

    engine: str
    speculative: dict | list[str] | None
    prepare: tuple[str, ...] = ()
    note: str = ""
    model: str | None = None

    def command(self, target: str) -> str | None:
        """The serve command for ``target`` (a model folder or hub id); None if unsupported."""
        if self.speculative is None:
            return None
        target = self.model or target
        if self.engine == "llama.cpp":
            flags = " ".join(shlex.quote(str(flag)) for flag in self.speculative)
            return f"llama-server -m {shlex.quote(target)} {flags}".strip()
        if self.engine == "vllm":
            command = f"vllm serve {shlex.quote(target)}"
            if self.speculative:
                command += f" --speculative-config {shlex.quote(json.dumps(self.speculative))}"
            return command
        flags = " ".join(shlex.quote(str(flag)) for flag in self.speculative)
        return f"python -m sglang.launch_server --model-path {shlex.quote(target)} {flags}".strip()

    def as_dict(self, target: str) -> dict:
        return {
            "engine": self.engine,
            "speculative": self.speculative,
            "prepare": list(self.prepare),
            "command": self.command(target),
            "note": self.note,
        }


def plain() -> list[LaunchConfig]:
    """Plain decoding: every engine serves the target without speculative settings."""
    return [LaunchConfig("vllm", {}), LaunchConfig("sglang", []), LaunchConfig("llama.cpp", [])]


def unsupported(engine: str, why: str) -> LaunchConfig:
    return LaunchConfig(engine, None, note=why)


def draft_model(
    k: int, draft: str, shortlist: str = "full", draft_gguf: str | None = None
) -> list[LaunchConfig]:
    """A separate draft model proposing k tokens: vLLM's ``draft_model``, SGLang's
    ``STANDALONE`` (a chain: top-1 per step), llama.cpp's ``draft-simple`` over the draft's
    GGUF (``draft_gguf``; a placeholder naming the conversion when there is none)."""
    note = _shortlist_note(shortlist)
    vllm = {"method": "draft_model", "model": draft, "num_speculative_tokens": k}
    sglang = [
        "--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", draft,
        "--speculative-num-steps", str(k), "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", str(k + 1),
    ]  # fmt: skip
    llama_note = note
    if draft_gguf is None:
        draft_gguf = f"{draft}.gguf"
        convert = f"the draft as GGUF (llama.cpp's convert_hf_to_gguf.py {draft})"
        llama_note = "; ".join(n for n in (note, convert) if n)
    llama = [
        "--spec-draft-model", draft_gguf, "--spec-type", "draft-simple",
        "--spec-draft-n-max", str(k),
    ]  # fmt: skip
    return [
        LaunchConfig("vllm", vllm, note=note),
        LaunchConfig("sglang", sglang, note=note),
        LaunchConfig("llama.cpp", llama, note=llama_note),
    ]


def ngram(k: int, lookup_min: int, lookup_max: int) -> list[LaunchConfig]:
    """Prompt lookup: vLLM's ``ngram`` with the same n-gram sizes; SGLang's ``NGRAM`` (a trie
    over the text, CUDA only) with k draft tokens a step."""
    vllm = {
        "method": "ngram",
        "num_speculative_tokens": k,
        "prompt_lookup_min": lookup_min,
        "prompt_lookup_max": lookup_max,
    }
    sglang = ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", str(k)]
    note = "SGLang matches against a trie of earlier text (its own n-gram rules); CUDA only"
    llama = [
        "--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(lookup_max),
        "--spec-ngram-simple-size-m", str(k),
    ]  # fmt: skip
    llama_note = (
        f"llama.cpp matches n-grams of {lookup_max} tokens only (quickdraft tries "
        f"{lookup_max} down to {lookup_min})"
    )
    return [
        LaunchConfig("vllm", vllm),
        LaunchConfig("sglang", sglang, note=note),
        LaunchConfig("llama.cpp", llama, note=llama_note if lookup_min < lookup_max else ""),
    ]


def suffix(k: int, depth: int, factor: float, min_prob: float) -> list[LaunchConfig]:
    """Suffix decoding: vLLM's ``suffix`` (Arctic Inference's implementation) with the same
    tree depth, spec factor and probability floor; SGLang and llama.cpp have none."""
    vllm = {
        "method": "suffix",
        "num_speculative_tokens": k,
        "suffix_decoding_max_tree_depth": depth,
        "suffix_decoding_max_spec_factor": factor,
        "suffix_decoding_min_token_prob": min_prob,
    }
    note = (
        "needs `pip install arctic-inference`; its global cache is capped in requests "
        "(suffix_decoding_max_cached_requests), quickdraft's in tokens"
    )
    return [
        LaunchConfig("vllm", vllm, note=note),
        unsupported("sglang", "SGLang has no suffix decoding"),
        unsupported("llama.cpp", "llama.cpp has no suffix decoding"),
    ]


def medusa(heads: int, export: tuple[str, Path]) -> list[LaunchConfig]:
    """Medusa heads exported for vLLM (``export``: the export command and its folder), one
    draft token per head; SGLang has no Medusa."""
    command, folder = export
    vllm = {"method": "medusa", "model": str(folder), "num_speculative_tokens": heads}
    note = "vLLM drafts one chain of the heads' top tokens (quickdraft drafts a tree)"
    return [
        LaunchConfig("vllm", vllm, (command,) if command else (), note),
        unsupported("sglang", "SGLang has no Medusa"),
        unsupported("llama.cpp", "llama.cpp has no Medusa"),
    ]


def export_folder(root: Path, target: str, kind: str, engine: str) -> Path:
    """Where a drafter of ``target`` is exported for ``engine`` under ``root``."""
    return Path(root) / f"{Path(target).name or 'target'}-{kind}-{engine}"


def eagle(
    variant: str,
    depth: int,
    topk: int,
    tokens: int,
    export: dict[str, tuple[str, Path]],
    shortlist: str = "full",
    token_map: bool = False,
    lookup: int = 0,
    suffix_first: bool = False,
) -> list[LaunchConfig]:
    """An EAGLE drafter exported per engine (``export``: engine -> (export command, folder)):
    vLLM and llama.cpp (EAGLE-3 only) draft a chain of ``depth`` tokens, SGLang the same
    dynamic tree (depth steps, top-k per step, ``tokens`` verified). ``token_map``: an
    EAGLE-1 export with a draft vocabulary (``token_map.pt``), which SGLang takes and vLLM
    cannot. ``lookup``: quickdraft's prompt-lookup graft, which no engine has;
    ``suffix_first``: suffix decoding in front, which none combines with EAGLE. SGLang counts
    the root in ``--speculative-num-draft-tokens``, so it is ``tokens + 1``."""
    method = "eagle3" if variant == "eagle3" else "eagle"
    note = _shortlist_note(shortlist)
    if lookup:
        graft = f"no prompt-lookup graft there (quickdraft grafts up to {lookup} tokens)"
        note = "; ".join(n for n in (note, graft) if n)
    if suffix_first:
        ahead = "no suffix decoding in front of EAGLE there (quickdraft's suffix_first)"
        note = "; ".join(n for n in (note, ahead) if n)
    command, folder = export["vllm"]
    vllm = {"method": method, "model": str(folder), "num_speculative_tokens": depth}
    notes = ["vLLM drafts a chain of the tree's depth (its trees are static)", note]
    if token_map:
        notes.append("vLLM's EAGLE-1 scores the whole head (it takes no draft vocabulary)")
    vllm_note = "; ".join(n for n in notes if n)
    configs = [LaunchConfig("vllm", vllm, (command,), vllm_note)]
    command, folder = export["sglang"]
    sglang = [
        "--speculative-algorithm", method.upper(), "--speculative-draft-model-path", str(folder),
        "--speculative-num-steps", str(depth), "--speculative-eagle-topk", str(topk),
        "--speculative-num-draft-tokens", str(tokens + 1),
    ]  # fmt: skip
    if token_map:
        sglang += ["--speculative-token-map", str(folder / "token_map.pt")]
    configs.append(LaunchConfig("sglang", sglang, (command,), note))
    if method != "eagle3":
        configs.append(unsupported("llama.cpp", "llama.cpp loads EAGLE-3 drafters only"))
        return configs
    from quickdraft.interop.eagle_gguf import FILE

    command, folder = export["llama.cpp"]
    llama = [
        "--spec-draft-model", str(Path(folder) / FILE), "--spec-type", "draft-eagle3",
        "--spec-draft-n-max", str(depth),
    ]  # fmt: skip
    chain = "llama.cpp drafts a chain of the tree's depth"
    llama_note = "; ".join(n for n in (chain, note) if n)
    configs.append(LaunchConfig("llama.cpp", llama, (command,) if command else (), llama_note))
    return configs


def _shortlist_note(shortlist: str) -> str:
    if shortlist == "full":
        return ""
    return (
        f"the engine drafts over the full vocabulary (quickdraft's shortlist {shortlist} has "
        "no equivalent there)"
    )


# -- per method: what the picker's recommendation launches elsewhere -------------------------


def model_path(name: str, convert: bool = True) -> str:
    """A model alias as the folder other engines load (the converted checkpoint). convert:
    False names the folder without making it (a 1.5B's conversion takes minutes; a printed
    command does not need it yet)."""
    from quickdraft.models import gguf
    from quickdraft.models.sources import ALIASES, resolve

    if name not in ALIASES:
        return name
    return str(resolve(name) if convert else gguf.converted_folder(ALIASES[name].sha256))


def gguf_path(name: str) -> str | None:
    """A model as the GGUF file llama.cpp loads: an alias's packaged file, a ``.gguf`` path as
    it is; None when there is none (a folder or hub id has to be converted first)."""
    from quickdraft.models.sources import ALIASES, gguf_location

    if name in ALIASES:
        return str(gguf_location(name))
    return name if name.endswith(".gguf") else None


def _draft_model(spec: SpecConfig, context: PickContext) -> list[LaunchConfig]:
    from quickdraft.drafters.draft_model.options import DraftModelOptions

    assert context.draft is not None and isinstance(spec.options, DraftModelOptions)
    shortlist = str(spec.options.draft_shortlist)
    return draft_model(
        spec.num_speculative_tokens, model_path(context.draft), shortlist,
        draft_gguf=gguf_path(context.draft),
    )  # fmt: skip


def _ngram(spec: SpecConfig, context: PickContext) -> list[LaunchConfig]:
    from quickdraft.drafters.ngram import NGramOptions

    options = spec.options
    assert isinstance(options, NGramOptions)
    return ngram(spec.num_speculative_tokens, options.prompt_lookup_min, options.prompt_lookup_max)


def _suffix(spec: SpecConfig, context: PickContext) -> list[LaunchConfig]:
    from quickdraft.drafters.suffix.options import SuffixOptions

    o = spec.options
    assert isinstance(o, SuffixOptions)
    return suffix(
        spec.num_speculative_tokens, o.suffix_max_depth, o.suffix_spec_factor, o.suffix_min_prob
    )


def _medusa(spec: SpecConfig, context: PickContext) -> list[LaunchConfig]:
    from quickdraft.drafters.medusa.net import heads_folder, read_heads_config
    from quickdraft.drafters.medusa.options import MedusaOptions

    assert isinstance(spec.options, MedusaOptions)
    folder = heads_folder(context.target, spec.options.medusa_dir)
    out = export_folder(context.export_dir.resolve(), context.target, "medusa", "vllm")
    command = (
        f"quickdraft export medusa --target {context.target} --medusa-dir {folder} --out {out}"
    )
    return medusa(read_heads_config(folder).num_heads, (command, out))


def _eagle(spec: SpecConfig, context: PickContext) -> list[LaunchConfig]:
    from quickdraft.drafters.eagle.io import (
        eagle_folder,
        read_eagle_config,
        shortlist_choice,
        tree_choice,
    )
    from quickdraft.drafters.eagle.options import EagleOptions

    options = spec.options
    assert isinstance(options, EagleOptions)
    folder = eagle_folder(context.target, options.eagle_dir)
    device = "cuda" if context.device == "gpu" else "cpu"
    tree, lookup = tree_choice(options.tree, options.eagle_lookup, folder, device)
    export = {}
    for engine in ENGINES:
        out = export_folder(context.export_dir.resolve(), context.target, "eagle", engine)
        command = (
            f"quickdraft export eagle --target {context.target} --eagle-dir {folder} "
            f"--engine {engine} --out {out}"
        )
        if engine == "llama.cpp" and not gguf_path(context.target):
            command += f" --target-gguf {context.target}.gguf"  # the target's own GGUF
        export[engine] = (command, out)
    config = read_eagle_config(folder)
    token_map = config.variant == "eagle1" and (
        config.draft_vocab_size < config.vocab_size or (folder / "token_map.pt").exists()
    )
    shortlist = shortlist_choice(options.draft_shortlist, folder)
    return eagle(
        config.variant, tree.depth, tree.topk, tree.tokens, export,
        str(shortlist), token_map=token_map, lookup=lookup,
        suffix_first=options.suffix_first,
    )  # fmt: skip


def _lookahead(spec: SpecConfig, context: PickContext) -> list[LaunchConfig]:
    return [
        unsupported("vllm", "vLLM has no lookahead decoding"),
        unsupported("sglang", "SGLang has no lookahead decoding (its NGRAM is prompt lookup)"),
        unsupported("llama.cpp", "llama.cpp's server has no lookahead decoding"),
    ]


LAUNCH: dict[str, Callable[[SpecConfig, PickContext], list[LaunchConfig]]] = {
    "ar": lambda spec, context: plain(),
    "draft_model": _draft_model,
    "ngram": _ngram,
    "medusa": _medusa,
    "eagle": _eagle,
    "lookahead": _lookahead,
    "suffix": _suffix,
}


def launch_configs(spec: SpecConfig, context: PickContext) -> list[LaunchConfig]:
    """vLLM's, SGLang's and llama.cpp's forms of ``spec`` (options resolved) in ``context``'s
    deployment; a method with no entry in ``LAUNCH`` is unsupported there, saying so.
    llama.cpp's forms load the target's GGUF; a target without one gets a placeholder and a
    note naming the conversion."""
    import dataclasses

    from quickdraft.drafters.registry import resolve

    form = LAUNCH.get(str(spec.method))
    spec = dataclasses.replace(spec, options=resolve(spec)[1])
    if form is None:
        why = f"quickdraft's method {spec.method} has no equivalent there"
        return [unsupported(engine, why) for engine in ENGINES]
    configs = form(spec, context)
    model = gguf_path(context.target)
    note = ""
    if model is None:
        model = f"{context.target}.gguf"
        note = f"the target as GGUF (llama.cpp's convert_hf_to_gguf.py {context.target})"
    return [
        dataclasses.replace(c, model=model, note="; ".join(n for n in (c.note, note) if n))
        if c.engine == "llama.cpp" and c.speculative is not None
        else c
        for c in configs
    ]
