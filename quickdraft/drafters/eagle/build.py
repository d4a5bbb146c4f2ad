"""EAGLE drafters built: from a saved network's folder (``build_eagle``), and from a spec (the
registry's builder, ``build``)."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

from quickdraft.config import SpecConfig
from quickdraft.drafters.base import BuildContext
from quickdraft.drafters.eagle.drafter import EagleDrafter
from quickdraft.drafters.eagle.io import eagle_folder, load_eagle, shortlist_choice, tree_choice
from quickdraft.drafters.eagle.net import EagleNet
from quickdraft.drafters.eagle.options import EagleOptions
from quickdraft.drafters.eagle.tree import DynamicTree, EagleTree
from quickdraft.drafters.suffix.hybrid import SuffixFirst, suffix_first
from quickdraft.models.base import Model
from quickdraft.vocab import shortlist_for
from quickdraft.vocab.shortlist import Shortlist


def build_eagle(
    target: Model,
    folder: str | Path,
    tree: DynamicTree | None = None,
    *,
    int8: bool = False,
    lookup: int = 0,
    lookup_ngram: tuple[int, int] = (1, 3),
    shortlist: Shortlist | None = None,
) -> EagleDrafter:
    """A drafter from the network saved in ``folder``; ``tree`` None is the default of the
    target's device; ``int8``: int8 weights for its layers and head on CPU; ``lookup``: the
    most tokens of prompt lookup (n-gram sizes ``lookup_ngram``) grafted onto each tree, 0 for
    none; ``shortlist``: the head's rows per depth, out of the target's whole vocabulary."""
    return EagleDrafter(
        target,
        _loaded(Path(folder), getattr(getattr(target, "config", None), "num_layers", None)),
        tree or EagleTree().resolve(target.device.type),
        int8=int8,
        lookup=lookup,
        lookup_ngram=lookup_ngram,
        shortlist=shortlist,
    )


# Networks read from their folders, the last few: ``generate`` builds an engine, and so its
# drafter, per call, and reading a network again would cost more than the call's first steps.
# Keyed by the folder's files as they are now (name, size, modification time, inode: files are
# replaced whole), so a folder rewritten in between (a training run's output) is read again.
_LOADED: OrderedDict[tuple, EagleNet] = OrderedDict()
_KEEP = 2


def _loaded(folder: Path, num_target_layers: int | None) -> EagleNet:
    """``load_eagle(folder, num_target_layers)``, from memory when the folder is unchanged;
    the network is shared, never modified (drafters pack or copy it)."""
    try:
        files = tuple(
            (p.name, (info := p.stat()).st_size, info.st_mtime_ns, info.st_ino)
            for p in sorted(folder.iterdir())
            if p.is_file()
        )
    except OSError:  # not there, not a folder: load_eagle names it
        return load_eagle(folder, num_target_layers)
    key = (str(folder.resolve()), num_target_layers, files)
    net = _LOADED.get(key)
    if net is None:
        net = _LOADED[key] = load_eagle(folder, num_target_layers)
        while len(_LOADED) > _KEEP:
            _LOADED.popitem(last=False)
    _LOADED.move_to_end(key)
    return net


def build(spec: SpecConfig, context: BuildContext) -> EagleDrafter | SuffixFirst:
    """The registry's builder: ``spec.options`` are ``EagleOptions``."""
    options = spec.options
    assert isinstance(options, EagleOptions)
    folder = eagle_folder(context.target_name, options.eagle_dir)
    tree, lookup = tree_choice(
        options.tree, options.eagle_lookup, folder, context.target.device.type
    )
    shortlist = shortlist_for(
        shortlist_choice(options.draft_shortlist, folder),
        options.shortlist_dir,
        context.target_name,
        tree.depth,
        inputs="eagle",
        shipped=folder / "shortlist",
    )
    drafter = build_eagle(
        context.target,
        folder,
        tree,
        int8=options.drafter_int8,
        lookup=lookup,
        lookup_ngram=(options.prompt_lookup_min, options.prompt_lookup_max),
        shortlist=shortlist,
    )
    return suffix_first(drafter) if options.suffix_first else drafter
