"""The package's shape, checked: no import cycle between its modules (lazy imports inside
functions count too), a configuration that loads no drafter, and every structured option's
text read once by its own class and written back the same."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from quickdraft.drafters.eagle.options import EagleOptions
from quickdraft.drafters.eagle.tree import DynamicTree, EagleTree
from quickdraft.drafters.medusa.tree import MedusaTree
from quickdraft.drafters.registry import make_spec, spec_fields, with_options
from quickdraft.vocab.choice import KINDS, ShortlistChoice

PACKAGE = Path(__file__).resolve().parent.parent / "quickdraft"
README = PACKAGE.parent / "README.md"


def module_imports() -> dict[str, set[str]]:
    """Each module of the package -> the package's modules it imports, anywhere in it."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                for alias in node.names:  # a submodule, or a name from the module itself
                    sub = f"{node.module}.{alias.name}"
                    found.add(sub if sub in modules else node.module)
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_module_imports_itself_through_others():
    assert find_cycle(module_imports()) is None


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_configuration_and_sampling_load_no_drafter():
    code = (
        "import sys, quickdraft.config, quickdraft.sampling\n"
        "from quickdraft.config import SpecConfig\n"
        "SpecConfig(method='eagle')\n"
        "print(sorted(m for m in sys.modules if m.startswith('quickdraft')))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.strip() == "['quickdraft', 'quickdraft.config', 'quickdraft.sampling']"


def readme_forms() -> tuple[set[str], set[str]]:
    """The trees and shortlists the README shows (``--tree X``, ``--shortlist X`` and the
    shortlist kinds in backticks)."""
    text = README.read_text()
    trees = set(re.findall(r"--tree ([^\s`]+)", text))
    shortlists = set(re.findall(r"--shortlist ([^\s`]+)", text))
    kinds = "|".join(re.escape(kind) for kind in sorted(KINDS, key=len, reverse=True))
    shortlists |= set(re.findall(rf"`((?:{kinds}):[0-9]+|full)`", text))
    return trees, shortlists


EAGLE_TREES = ["default", "4,4,12", "6,4,10,0.1", "6,2,8,0.2", "3,1,3", "5,4,16"]
MEDUSA_TREES = ["default", "fit:8", "fit:16", "4,2,1", "3,2,1", "2,2,2"]
SHORTLISTS = ["full", "fr:38818", "fr-pa:18992", "dyna:2", "dyna:0", "dyna-pa:4",
              "dyna-hybrid:0", "dyna-hybrid-pa:8"]  # fmt: skip


def test_the_readme_shows_forms_to_check():
    trees, shortlists = readme_forms()
    assert {"4,4,12", "4,2,1"} <= trees and {"dyna-pa:4", "dyna:0"} <= shortlists


@pytest.mark.parametrize("text", sorted(set(EAGLE_TREES) | (readme_forms()[0] - {"4,2,1"})))
def test_eagle_trees_round_trip(text):
    tree = EagleTree.parse(text)
    assert str(tree) == text and EagleTree.parse(str(tree)) == tree
    if tree.shape is not None:
        assert DynamicTree.parse(str(tree.shape)) == tree.shape


@pytest.mark.parametrize("text", sorted(set(MEDUSA_TREES) | (readme_forms()[0] - {"4,4,12"})))
def test_medusa_trees_round_trip(text):
    tree = MedusaTree.parse(text)
    assert str(tree) == text and MedusaTree.parse(str(tree)) == tree


@pytest.mark.parametrize("text", sorted(set(SHORTLISTS) | readme_forms()[1]))
def test_shortlists_round_trip(text):
    choice = ShortlistChoice.parse(text)
    assert str(choice) == text and ShortlistChoice.parse(str(choice)) == choice


def test_a_spec_round_trips_through_its_flat_fields():
    for spec in (
        make_spec("eagle", tree="6,4,10,0.1", draft_shortlist="fr:38818", eagle_lookup=0),
        make_spec("medusa", tree="fit:8", disable_by_batch_size=None, acceptance="greedy"),
        make_spec("draft_model", 6, draft_temperature=0.7, draft_shortlist="dyna-pa:8"),
        make_spec("lookahead", lookahead_window=3),
        make_spec("ngram", prompt_lookup_max=5),
    ):
        assert make_spec(**spec_fields(spec)) == spec
    assert spec_fields(make_spec("eagle")) == {"method": "eagle"}
    for floor in ("0.00001", "0.30000000000000004", "1e-3"):  # floats written back as repr
        spec = make_spec("eagle", tree=f"6,4,10,{floor}")
        assert make_spec(**spec_fields(spec)) == spec


def test_with_options_validates_the_whole_result_not_the_defaults():
    spec = with_options(make_spec("ngram", prompt_lookup_max=8), prompt_lookup_min=5)
    assert (spec.options.prompt_lookup_min, spec.options.prompt_lookup_max) == (5, 8)
    big = with_options(make_spec("eagle", eagle_lookup=0), tree="6,4,256")
    assert big.options.tree.shape.tokens == 256
    with pytest.raises(ValueError, match="tree applies to methods medusa and eagle only"):
        with_options(spec, tree="4,4,12")
    options = make_spec("eagle", tree="3,1,3").options
    assert isinstance(options, EagleOptions) and options.tree.shape == DynamicTree(3, 1, 3)


def test_no_option_text_is_parsed_outside_its_class():
    """Trees and shortlists are read by ``X.parse`` alone: no other module splits them."""
    pattern = re.compile(r"\b(tree|shortlist|draft_shortlist)\w*\.(split|partition)\(")
    found = [
        f"{path.relative_to(PACKAGE)}:{number}"
        for path in PACKAGE.rglob("*.py")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert found == []
