"""Seeded fuzzing of every SamplingParams field and every spec field (SpecConfig's own and each
registered method's options, given flat to ``make_spec`` as the command line and JSON configs
give them): a bad value raises ValueError naming its field within 100 ms; an accepted one runs
a short toy generation."""

import math
import random
import time
from dataclasses import fields
from pathlib import Path

import pytest
import torch

from quickdraft import SamplingParams, SpecConfig, generate
from quickdraft.drafters import registry
from quickdraft.drafters.eagle.io import save_eagle
from quickdraft.drafters.eagle.net import EagleConfig, EagleNet
from quickdraft.drafters.eagle.tree import EagleTree
from quickdraft.drafters.medusa.net import MedusaConfig, MedusaHeads, save_heads
from quickdraft.drafters.medusa.tree import MedusaTree
from quickdraft.drafters.registry import make_spec, spec_fields
from quickdraft.toys import TOY_VOCAB, toy_llama
from quickdraft.vocab.choice import ShortlistChoice

# Values of every type and range the fields meet in the wild: edges, overflows, typos.
EDGES = [
    -(2**64), -(2**63), -1, 0, 1, 2, 3, 4, 5, 16, 32, 33, 63, 64, 65, 256, 257, 4096,
    2**31 - 1, 2**31, 2**63 - 1, 2**63, 2**64, 10**30, 10**400, 10**5000,
    -1.0, -0.0, 0.0, 5e-324, 1e-46, 1e-38, 1e-7, 1e-6, 1e-5, 0.001, 0.1, 0.5, 0.9, 0.99,
    1.0, 1.0000001, 1.5, 2.0, 100.0, 1e30, 1e308, float("nan"), float("inf"), float("-inf"),
    True, False, None, "", " ", "0", "1", "abc", "default", "full", "fit:8", "fit:0",
    "fit:257", "fit:x", "4,2,1", "2,2", "300,300,300", "100,100,100", "1000000,1,1",
    "6,4,10,0.1", "4,4,12", "3,1,3", "6,4,10,1.5", "6,4,10,nan", "1,1,1,0", "0,1,1",
    "\u00b2,1", "fit:\u00b2", "6,4,256", "6,4,252", "fr:8", "fr:0", "dyna-pa:4", "nope:3",
    "ar", "ngram", "draft_model", "medusa", "eagle",
    "lookahead", "rejection_sampling", "greedy", "typical", "RAR", "\udcff", "a\x00b",
    b"bytes", bytearray(b"x"), [1, 2], (3,), ["</s>"], ("stop",), [], (), {}, {"a": 1},
    [2**70], ["\udcff"], [""], ["x"] * 65, Path("."), Path(""), object(),
]  # fmt: skip
SAMPLING_FIELDS = [f.name for f in fields(SamplingParams)]
SPEC_FIELDS = [f.name for f in fields(SpecConfig) if f.name != "options"] + sorted(
    {name for entry in registry.entries() for name in entry.option_names()}
)
# Needing trained vocabulary artifacts, these are fuzzed for validation but generate with the
# full vocabulary (their artifacts' loading is tested in test_vocab and test_cli_errors).
NOT_GENERATED = {"draft_shortlist", "shortlist_dir"}
PROMPT = [3, 1, 4, 1, 5, 0, 2, 6]


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """A tiny native target, a draft, and Medusa heads and an EAGLE drafter saved for it."""
    target = toy_llama(0)
    folder = tmp_path_factory.mktemp("drafters")
    torch.manual_seed(0)
    heads = MedusaHeads(MedusaConfig(hidden_size=32, vocab_size=TOY_VOCAB, num_heads=4))
    save_heads(folder / "medusa", heads)
    net = EagleNet(EagleConfig.for_target(target.config, "eagle3", 6))
    net.draft_vocab = torch.randperm(TOY_VOCAB)[:6]
    save_eagle(folder / "eagle", net)
    return target, toy_llama(1), folder


def cases(names: list[str], count: int, seed: int) -> list[dict]:
    """One field set to each edge value, then random mixes of two or three fields."""
    chosen = [{name: value} for name in names for value in EDGES]
    generator = random.Random(seed)
    while len(chosen) < count:
        picked = generator.sample(names, generator.choice((2, 3)))
        chosen.append({name: generator.choice(EDGES) for name in picked})
    return chosen


def build(kind: type, given: dict):
    """(object, None) or (None, elapsed seconds and the error)."""
    start = time.perf_counter()
    try:
        return kind(**given), None
    except TypeError as error:  # make_spec: a SpecConfig field's value of the wrong kind
        raise AssertionError(f"{given}: {error}") from None
    except ValueError as error:
        return None, (time.perf_counter() - start, str(error))


def assert_names_a_field(given: dict, failure: tuple[float, str]) -> None:
    seconds, message = failure
    assert seconds < 0.1, (given, seconds)
    assert "\n" not in message, (given, message)
    assert any(name in message for name in given), (given, message)


def test_every_sampling_value_is_rejected_by_name_or_generates(toy):
    target, _, _ = toy
    accepted = 0
    for given in cases(SAMPLING_FIELDS, 3000, seed=1):
        params, failure = build(SamplingParams, given)
        if failure is not None:
            assert_names_a_field(given, failure)
            continue
        accepted += 1
        if params.stop or params.constraint:  # these need a tokenizer; the toy alphabet does
            from quickdraft.models.toy import ToyTokenizer

            tokenizer = ToyTokenizer(TOY_VOCAB)
        else:
            tokenizer = None
        short = SamplingParams(**{**_as_fields(params), "max_new_tokens": 3})
        try:
            out = generate(target, PROMPT, sampling=short, tokenizer=tokenizer)
        except ValueError as error:  # a grammar no token of the toy alphabet can begin
            assert params.constraint is not None, (given, error)
            assert_names_a_field(given, (0.0, str(error)))
            continue
        assert 1 <= len(out.token_ids) <= 3
    assert accepted > 100  # the fuzz reaches the valid ranges too


def test_every_spec_value_is_rejected_by_name_or_generates(toy):
    target, draft, folder = toy
    accepted = 0
    greedy = SamplingParams(temperature=0, max_new_tokens=4, seed=0)
    sampled = SamplingParams(temperature=0.8, top_p=0.9, max_new_tokens=4, seed=0)
    expected = generate(target, PROMPT, sampling=greedy).token_ids
    for index, given in enumerate(cases(SPEC_FIELDS, 2500, seed=2)):
        spec, failure = build(make_spec, given)
        if failure is not None:
            assert_names_a_field(given, failure)
            continue
        accepted += 1
        flat = spec_fields(spec)
        if set(given) & NOT_GENERATED and flat.get("draft_shortlist", "full") != "full":
            continue
        for name in NOT_GENERATED:
            flat.pop(name, None)
        if spec.method.value == "medusa":
            flat["medusa_dir"] = str(folder / "medusa")
        if spec.method.value == "eagle":
            flat["eagle_dir"] = str(folder / "eagle")
        runnable = make_spec(**flat)
        uses_draft = runnable.method.value == "draft_model"
        sampling = greedy if index % 2 else sampled
        try:
            out = generate(
                target,
                PROMPT,
                sampling=sampling,
                spec=runnable,
                draft=draft if uses_draft else None,
            )
        except ValueError as error:  # a tree deeper than the toy heads is a named error
            assert "tree" in str(error), (given, error)
            continue
        assert len(out.token_ids) == 4
        if sampling is greedy:
            assert out.token_ids == expected, given
    assert accepted > 100


def _as_fields(config) -> dict:
    return {f.name: getattr(config, f.name) for f in fields(config)}


def random_texts(count: int, seed: int) -> list[str]:
    """Strings near the options' forms: digits of every script, separators, spaces, signs,
    huge numbers, and fragments of valid texts glued together."""
    pieces = ["4", "12", "0", "0.1", ".5", "1e-3", "-1", "+3", "fit:", "fr:", "dyna-pa:",
              "full", "default", ",", ".", ":", " ", "\t", "\x00", "\u0663", "\u00b2",
              "\uff11", "9" * 40, "nan", "inf", "_", "p", "e", "x"]  # fmt: skip
    generator = random.Random(seed)
    return ["".join(generator.choice(pieces) for _ in range(generator.randint(0, 7)))
            for _ in range(count)]  # fmt: skip


@pytest.mark.parametrize(
    ("field", "parse"),
    [
        ("tree", EagleTree.parse),
        ("tree", MedusaTree.parse),
        ("draft_shortlist", ShortlistChoice.parse),
    ],
)
def test_every_option_text_parses_or_names_its_field(field, parse):
    parsed = 0
    for text in random_texts(3000, seed=len(field)):
        try:
            value = parse(text)
        except ValueError as error:
            assert str(error).startswith(field), (text, error)
            assert "\n" not in str(error)
            continue
        parsed += 1
        assert parse(str(value)) == value, text  # what parses, writes itself back
        assert str(value).isascii() and " " not in str(value)
    assert parsed > 0


def test_command_line_numbers_are_ascii_and_finite():
    import argparse

    from quickdraft.cli.common import finite_float, strict_int

    for text in random_texts(3000, seed=5):
        for parse in (strict_int, finite_float):
            try:
                value = parse(text)
            except argparse.ArgumentTypeError as error:
                assert "expected" in str(error)
                continue
            assert text.isascii() and text.strip() == text and math.isfinite(value), text
