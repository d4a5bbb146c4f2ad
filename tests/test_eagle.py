"""EAGLE drafters: token identity with plain decoding, the draft cache against training's
unrolled passes, save/load, export, and the training pipeline on a tiny model."""

import dataclasses
import os
import signal

import pytest
import torch
from conftest import (
    FAMILIES,
    random_shortlists,
    recorded_drafts,
    shipped_drafter_runs,
    tiny_folder_and_corpus,
    tiny_runners,
)

from quickdraft import SamplingParams, SpecConfig, generate, generate_batch
from quickdraft.drafters.base import Batch, StepResult
from quickdraft.drafters.eagle.drafter import EagleDrafter
from quickdraft.drafters.eagle.io import load_eagle, save_eagle
from quickdraft.drafters.eagle.net import EagleConfig, EagleNet
from quickdraft.drafters.eagle.tree import DEFAULT_TREES, DynamicTree, EagleTree
from quickdraft.drafters.ngram import NGramDrafter
from quickdraft.drafters.registry import make_spec
from quickdraft.models.llama import LlamaRunner

GREEDY = SamplingParams(temperature=0, max_new_tokens=32)
# The drafter's own drafts every step (no sizing by goodput): these tests read the drafts.
WHOLE = SpecConfig(adaptive_k=False)
PROMPTS = [[5, 17, 3, 99, 42, 5, 17], [1, 2, 3, 1, 2, 3, 1, 2], [7]]


def random_net(
    target: LlamaRunner,
    variant: str,
    draft_vocab: int = 60,
    seed: int = 0,
    intermediate_size: int | None = None,
):
    """An untrained network with weights large enough that its drafts vary with the context."""
    torch.manual_seed(seed)
    config = EagleConfig.for_target(
        target.config, variant, draft_vocab, intermediate_size=intermediate_size
    )
    net = EagleNet(config)
    with torch.no_grad():
        for parameter in net.parameters():
            if parameter.dim() == 2:
                parameter.mul_(3.0)
        net.draft_vocab = torch.randperm(target.vocab_size)[:draft_vocab]
    return net.eval()


def prefilled(drafter: EagleDrafter, sequence: torch.Tensor, n: int, full) -> tuple:
    """(batch, start) as the engine hands them to ``begin``: tokens 0..n-1 of ``sequence``
    (n - 1 pending) and the target's features at 0..n-2 (``full``: a tapped forward over the
    sequence), as after a prefill of n - 1 tokens; the drafter's rows reserved."""
    batch = Batch.from_rows([sequence[0, :n].tolist()], GREEDY, room=8)
    start = StepResult(
        batch,
        torch.tensor([n - 1]),
        full.hidden[:, : n - 1],
        {i: t[:, : n - 1] for i, t in full.taps.items()},
    )
    drafter.reserve(1, batch.capacity)
    return batch, start


@pytest.fixture(scope="module")
def targets():
    return tiny_runners(layers=4)


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("variant", ["eagle1", "eagle3"])
@pytest.mark.parametrize("tree", ["default", "3,1,3", "2,3,5", "5,2,10"])
def test_eagle_trees_are_token_identical_to_plain_decoding(targets, family, variant, tree):
    target = targets[family]
    drafter = EagleDrafter(
        target, random_net(target, variant), EagleTree.parse(tree).resolve("cpu")
    )
    for prompt in PROMPTS:
        expected = generate(target, prompt, sampling=GREEDY).token_ids
        out = generate(target, prompt, sampling=GREEDY, spec=WHOLE, draft=drafter)
        assert out.token_ids == expected, (family, variant, tree, prompt)


@pytest.mark.parametrize("variant", ["eagle1", "eagle3"])
def test_batched_rows_share_a_tree_shape_and_stay_identical(targets, variant):
    target = targets["llama-untied"]
    drafter = EagleDrafter(target, random_net(target, variant), DynamicTree(3, 3, 7))
    prompts = torch.tensor([[5, 17, 3, 99, 42], [1, 2, 3, 1, 2], [8, 8, 8, 8, 8]])
    out = generate_batch(target, prompts, sampling=GREEDY, spec=WHOLE, draft=drafter)
    for row, prompt in enumerate(prompts.tolist()):
        assert out.token_ids[row] == generate(target, prompt, sampling=GREEDY).token_ids


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("tree", ["3,1,3", "4,3,8,0.05"])
@pytest.mark.parametrize("lookup", [0, 3])
def test_thresholds_grafted_lookup_and_int8_stay_token_identical(targets, family, tree, lookup):
    target = targets[family]
    net = random_net(target, "eagle3")
    drafter = EagleDrafter(
        target, net, EagleTree.parse(tree).resolve("cpu"), int8=True, lookup=lookup
    )
    assert drafter.needs.tokens == EagleTree.parse(tree).resolve("cpu").tokens + lookup
    for prompt in PROMPTS:
        expected = generate(target, prompt, sampling=GREEDY).token_ids
        out = generate(target, prompt, sampling=GREEDY, spec=WHOLE, draft=drafter)
        assert out.token_ids == expected, (family, tree, lookup, prompt)


def test_grafted_lookup_follows_the_tree_then_branches_off(targets):
    """With one row the lookup continuation is a path of the draft: it reuses the tree's
    nodes while they hold its tokens, so no (parent, token) pair is verified twice."""
    target = targets["llama-untied"]
    drafter = EagleDrafter(target, random_net(target, "eagle3"), DynamicTree(3, 2, 5), lookup=4)
    drafts, propose = [], drafter.propose

    def recording(state: Batch):
        draft = propose(state)
        drafts.append((draft, state.tokens[0, : int(state.lengths[0])].clone()))
        return draft

    drafter.propose = recording
    prompt = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3]
    out = generate(target, prompt, sampling=GREEDY, spec=WHOLE, draft=drafter)
    assert out.token_ids == generate(target, prompt, sampling=GREEDY).token_ids
    grafted = 0
    for draft, tokens in drafts:
        row, parents = draft.tokens[0].tolist(), draft.parents.tolist()
        pairs = list(zip(parents, row, strict=True))
        assert len(set(pairs)) == len(pairs)
        assert all(parent < node for node, parent in enumerate(parents))
        lookup = NGramDrafter(target.vocab_size, 4)
        continuation = lookup.propose(Batch.from_rows([tokens.tolist()])).tokens[0].tolist()
        node = -1
        for token in continuation:  # walk the continuation down the draft
            node = pairs.index((node, token))
        grafted += len(row) > 0 and len(continuation) > 0
    assert grafted >= 2  # the repeating prompt gives lookup matches


def test_a_batch_grafts_lookup_as_a_branch_of_its_own(targets):
    target = targets["llama-untied"]
    drafter = EagleDrafter(target, random_net(target, "eagle3"), DynamicTree(3, 3, 7), lookup=3)
    sizes, propose = [], drafter.propose

    def recording(state: Batch):
        draft = propose(state)
        sizes.append(draft.tokens.shape[1])
        if draft.tokens.shape[1] > 7:  # a branch of its own, from the root
            assert draft.parents[7] == -1
        return draft

    drafter.propose = recording
    prompts = torch.tensor([[1, 2, 3, 1, 2, 3], [1, 2, 3, 1, 2, 3], [8, 9, 8, 9, 8, 9]])
    out = generate_batch(target, prompts, sampling=GREEDY, spec=WHOLE, draft=drafter)
    for row, prompt in enumerate(prompts.tolist()):
        assert out.token_ids[row] == generate(target, prompt, sampling=GREEDY).token_ids
    assert max(sizes) > 7  # some steps verified a grafted branch


def test_min_prob_keeps_only_nodes_the_drafter_believes_in(targets):
    """A one-node tree drafts its token exactly when the draft probability reaches min_prob;
    a floor no node reaches gives an empty draft, and decoding still matches."""
    target = targets["llama-tied"]
    net = random_net(target, "eagle3")
    prompt = torch.tensor([[5, 17, 3, 99, 42, 5, 17]])
    n = prompt.shape[1]
    tapped = target.with_taps(tuple(layer - 1 for layer in net.config.feature_layers))
    full = tapped.forward(prompt, torch.arange(n).unsqueeze(0), tapped.new_cache(1, n))

    def draft_with(min_prob: float):
        drafter = EagleDrafter(target, net, DynamicTree(1, 1, 1, min_prob))
        batch, start = prefilled(drafter, prompt, n, full)
        drafter.begin(start)
        with torch.inference_mode():
            drafter._flush(drafter.cache.narrow(0, 1), batch)  # the prompt's entries
            pending = batch.tokens[:, n - 1]
            drafter._route(pending, drafter._root_feature[:1], 0)
            values, _ = drafter._top(drafter._root[:1])
            top = values.exp().max().item()
            return drafter.propose(batch), top

    _, top = draft_with(0.0)
    below, _ = draft_with(top * 0.99)
    above, _ = draft_with(min(top * 1.01, 0.999))
    assert below.tokens.shape[1] == 1 and above.tokens.shape[1] == 0
    strict = EagleDrafter(target, net, DynamicTree(4, 3, 8, 0.999))
    for prompt_ in PROMPTS:
        out = generate(target, prompt_, sampling=GREEDY, draft=strict)
        assert out.token_ids == generate(target, prompt_, sampling=GREEDY).token_ids


@pytest.mark.parametrize("variant", ["eagle1", "eagle3"])
def test_draft_cache_sees_what_training_unrolls(targets, variant):
    """The drafter's incremental passes (catch-up over real features, then tree nodes over
    its cache) compute exactly the states that ``EagleNet.unroll`` trains on: the same
    network, inputs and attention, step by step along the real continuation."""
    target = targets["llama-tied"]
    net = random_net(target, variant)
    drafter = EagleDrafter(target, net, DynamicTree(3, 1, 3))
    sequence = torch.tensor([[5, 17, 3, 99, 42, 5, 17, 60, 2, 33, 71]])
    length, steps = sequence.shape[1], 3
    tapped = target.with_taps(drafter.needs.taps)
    full = tapped.forward(sequence, torch.arange(length).unsqueeze(0), tapped.new_cache(1, length))
    taps = [full.taps[i] for i in drafter.needs.taps]
    with torch.no_grad():
        features = net.fuse(full.hidden, taps)
        embeds = target.embed[sequence[:, 1:]]  # e_{t+1} for anchor t
        anchors = length - steps  # anchors 0..anchors-1 have every step's inputs
        unrolled = net.unroll(
            embeds[:, : anchors + steps - 1], features[:, :anchors], steps,
            torch.zeros(1, anchors, dtype=torch.bool),
        )  # fmt: skip

    n = anchors + 1
    _, start = prefilled(drafter, sequence, n, full)
    assert drafter.cache is not None
    cache = drafter.cache.narrow(0, 1)
    with torch.inference_mode():
        output, _ = drafter._catch_up(cache, start)  # the pending token's entry: anchor n - 2
        torch.testing.assert_close(output[0], unrolled[0][0, n - 2], atol=1e-4, rtol=1e-4)
        entries: list[int] = []
        for step in range(1, steps):  # a chain along the real tokens n, n + 1, ..
            token = sequence[:, n - 1 + step]
            attn_input, residual = net.project(target.embed[token].unsqueeze(1), output[:, None])
            entries.append(len(entries) - 1)
            ancestors = torch.ones(len(entries), len(entries), dtype=torch.bool).tril()[-1:]
            position = torch.tensor([[n - 2 + step]])
            output = drafter._attend(cache, attn_input, residual, position, ancestors, step - 1)[
                :, 0
            ]
            torch.testing.assert_close(output[0], unrolled[step][0, n - 2], atol=1e-4, rtol=1e-4)


def test_save_load_round_trip_and_config_errors(targets, tmp_path):
    target = targets["llama-tied"]
    net = random_net(target, "eagle3")
    save_eagle(tmp_path / "d", net, {"note": "test"})
    loaded = load_eagle(tmp_path / "d")
    assert loaded.config == net.config
    assert torch.equal(loaded.draft_vocab, net.draft_vocab)
    for name, tensor in net.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name].float(), tensor.half().float())
    with pytest.raises(ValueError, match="eagle_dir"):
        load_eagle(tmp_path / "missing")
    with pytest.raises(ValueError, match="feature_layers"):
        EagleConfig.for_target(target.config, "eagle3", 10, feature_layers=(0, 1, 2))
    with pytest.raises(ValueError, match="draft_vocab_size"):
        EagleConfig.for_target(target.config, "eagle1", 10**6)
    with pytest.raises(ValueError, match="variant"):
        EagleConfig.for_target(target.config, "eagle2", 10)


@pytest.mark.parametrize("variant", ["eagle1", "eagle3"])
def test_the_compiled_draft_layer_computes_what_the_pytorch_layer_does(targets, variant):
    """With its products quantized (int8 on CPU), a drafter runs each pass of its layer in one
    compiled call (``eagle/compiled.py``). The PyTorch layer over the same quantized
    products gives the same outputs to float rounding: for a catch-up over real features
    (causal over several entries) and for a level of a tree over the cache (two nodes, each
    seeing its ancestors), and both leave the same keys and values in the cache."""
    from quickdraft import kernels

    if not kernels.native():
        pytest.skip("no compiled kernels on this host")
    target = targets["llama-tied"]
    net = random_net(target, variant)
    sequence = torch.tensor([[5, 17, 3, 99, 42, 5, 17, 60, 2, 33, 71]])
    tapped = target.with_taps(EagleDrafter(target, net, int8=True).needs.taps)
    full = tapped.forward(sequence, torch.arange(11).unsqueeze(0), tapped.new_cache(1, 11))
    found = {}
    for compiled in (True, False):
        drafter = EagleDrafter(target, net, DynamicTree(3, 2, 4), int8=True)
        assert drafter.layer is not None
        if not compiled:
            drafter.layer = None
        _, start = prefilled(drafter, sequence, 9, full)
        assert drafter.cache is not None
        cache = drafter.cache.narrow(0, 1)
        with torch.inference_mode():
            root, _ = drafter._catch_up(cache, start)
            tokens = torch.tensor([[60, 61]])
            attn_input, residual = drafter.net.project(
                target.embed[tokens].float(), root[:, None].expand(1, 2, -1)
            )
            ancestors = torch.tensor([[True, False], [False, True]])
            level = drafter._attend(cache, attn_input, residual, torch.tensor([[8, 8]]),
                                    ancestors, 0)  # fmt: skip
        used = int(cache.lengths[0]) + 2
        found[compiled] = (root, level, cache.keys[0, 0, :used], cache.values[0, 0, :used])
    for got, expected in zip(found[True], found[False], strict=True):
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


def test_int8_file_halves_the_drafter_and_keeps_each_row_to_its_step(targets, tmp_path):
    """``save_eagle(int8=True)``: matrices as int8 codes with an fp16 scale per row, norms and
    the draft vocabulary as before; loading gives every weight within half a step of its row
    and a smaller file; a missing scale is named."""
    from safetensors.torch import load_file, save_file

    net = random_net(targets["llama-tied"], "eagle3", intermediate_size=48)
    assert net.config.intermediate_size == 48
    save_eagle(tmp_path / "half", net)
    save_eagle(tmp_path / "int8", net, int8=True)
    files = {k: tmp_path / k / "eagle.safetensors" for k in ("half", "int8")}
    assert files["int8"].stat().st_size < 0.7 * files["half"].stat().st_size
    loaded = load_eagle(tmp_path / "int8")
    assert loaded.config == net.config and torch.equal(loaded.draft_vocab, net.draft_vocab)
    for name, tensor in net.state_dict().items():
        got = loaded.state_dict()[name].float()
        if tensor.dim() == 2:
            step = tensor.abs().amax(1, keepdim=True) / 127
            assert ((got - tensor).abs() <= 0.51 * step + 1e-3 * step).all(), name
        else:
            torch.testing.assert_close(got, tensor.half().float())
    stored = load_file(str(files["int8"]))
    stored.pop("fc.weight.int8_scale")
    save_file(stored, str(files["int8"]))
    with pytest.raises(ValueError, match=r"eagle\.safetensors.*without a scale"):
        load_eagle(tmp_path / "int8")


def test_tree_option_is_validated_at_the_boundary():
    assert EagleTree.parse("default").resolve("cpu") == DEFAULT_TREES["cpu"]
    assert EagleTree.parse("default").resolve("cuda") == DEFAULT_TREES["cuda"]
    assert DynamicTree.parse("5,4,16") == DynamicTree(5, 4, 16)
    assert DynamicTree.parse("6,2,8,0.2") == DynamicTree(6, 2, 8, 0.2)
    for bad in ("6,2,8,1.5", "6,2,8,-0.1", "6,2,8,x", "6,2,8,0.1,3"):
        with pytest.raises(ValueError, match="tree"):
            make_spec(method="eagle", tree=bad)
    with pytest.raises(ValueError, match="eagle_lookup"):
        make_spec(method="eagle", eagle_lookup=-1)
    with pytest.raises(ValueError, match="eagle_lookup"):
        make_spec(method="eagle", eagle_lookup=True)
    with pytest.raises(ValueError, match="eagle_lookup"):
        make_spec(method="ngram", eagle_lookup=3)
    with pytest.raises(ValueError, match="drafter_int8"):
        make_spec(method="eagle", drafter_int8="yes")
    with pytest.raises(ValueError, match="tree"):
        make_spec(method="eagle", tree="4,2")
    with pytest.raises(ValueError, match="tree"):
        make_spec(method="eagle", tree="0,2,3")
    with pytest.raises(ValueError, match="eagle_dir"):
        make_spec(method="medusa", eagle_dir="x")
    assert str(make_spec(method="eagle", tree="4,1,4").options.tree) == "4,1,4"


def test_train_eagle_extracts_features_from_the_quantized_target(tmp_path, smollm2, capsys):
    """--quant q4: the features come from the 4-bit target (the one the drafter will draft
    for), cached apart from float features, and the record says so."""
    import json

    from quickdraft.cli import main

    folder, corpus = tiny_folder_and_corpus(tmp_path, smollm2, "llama-tied")
    base = ["train", "eagle", "--target", str(folder), "--data", str(corpus),
            "--budget-tokens", "200", "--epochs", "1", "--draft-vocab", "128",
            "--cache", str(tmp_path / "cache")]  # fmt: skip
    assert main([*base, "--out", str(tmp_path / "q4"), "--quant", "q4"]) == 0
    features = json.loads((tmp_path / "q4" / "metrics.json").read_text())["features"]
    assert features["quant"] == "q4"
    # the float features of the same settings would be cached under another name
    from quickdraft.train.common import fingerprint

    store = {k: features[k] for k in ("target", "context", "layers")}
    cached = {p.name for p in (tmp_path / "cache").glob("eagle-features-*")}
    assert cached == {f"eagle-features-{fingerprint({**store, 'quant': 'q4', 'store': 2})}"}
    assert f"eagle-features-{fingerprint({**store, 'quant': None, 'store': 2})}" not in cached


def test_two_writers_of_a_feature_store_never_take_one_shard_number(tmp_path, monkeypatch):
    """Another writer (a second extraction, data regenerate --eagle-features) claims the
    number this one chose between its listing and its claim: this one takes the next, and
    neither shard is replaced."""
    from quickdraft.train import eagle_features

    real_link = eagle_features.os.link
    raced = []

    def other_writer_first(source, destination):
        if not raced:  # the other writer's shard lands on the chosen number first
            raced.append(destination)
            torch.save({"keys": ["theirs"]}, destination)
        return real_link(source, destination)

    monkeypatch.setattr(eagle_features.os, "link", other_writer_first)
    eagle_features.write_shard(tmp_path, {"keys": ["ours"]})
    shards = sorted(tmp_path.glob("shard-*.pt"))
    assert [torch.load(p)["keys"] for p in shards] == [["theirs"], ["ours"]]
    assert sorted(p.name for p in tmp_path.iterdir()) == [p.name for p in shards]  # no partial


def test_feature_store_extracts_only_what_it_lacks(targets, tmp_path):
    """The store keys sequences by content: a grown corpus extracts only its new sequences,
    an interrupted run only the shards it lost, and what comes back (memory-mapped) is what a
    fresh extraction gives."""
    from quickdraft.train import eagle_features
    from quickdraft.train.corpus import Sequence
    from quickdraft.train.eagle_features import extract

    target = targets["llama-tied"]
    generator = torch.Generator().manual_seed(0)
    sequences = [
        Sequence(torch.randint(0, target.vocab_size, (9 + i,), generator=generator).tolist(),
                 start=4, kind="k")
        for i in range(7)
    ]  # fmt: skip
    calls = []

    def seen(stage: str, done: int, total: int) -> None:
        calls.append((done, total))

    old, eagle_features.SHARD = eagle_features.SHARD, 2
    try:
        first = extract(target, sequences[:3], (1, 2, 3), 2, tmp_path / "s")
        grown = extract(target, sequences, (1, 2, 3), 2, tmp_path / "s", seen)
        assert len(list((tmp_path / "s").glob("shard-*.pt"))) == 2 + 2  # 3 old, 4 new
        assert calls[0] == (3 + 2, 7)  # the first new shard: the old three were there
        fresh = extract(target, sequences[::-1], (1, 2, 3), 2, tmp_path / "fresh")
    finally:
        eagle_features.SHARD = old
    for i in range(3):
        assert torch.equal(first.taps[i], grown.taps[i])
    for i in range(7):
        j = 6 - i
        assert torch.equal(grown.tokens[i], fresh.tokens[j]) and grown.start[i] == fresh.start[j]
        assert torch.equal(grown.hidden[i], fresh.hidden[j])
        assert torch.equal(grown.taps[i], fresh.taps[j])
        assert grown.start[i] == 2 and grown.tokens[i].numel() == len(sequences[i].tokens) - 2


def test_train_eagle_command_then_generate_and_export(tmp_path, smollm2, capsys):
    import json

    from safetensors.torch import load_file

    from quickdraft.cli import main

    folder, corpus = tiny_folder_and_corpus(tmp_path, smollm2, "llama-tied")
    for variant in ("eagle3", "eagle1"):
        out = tmp_path / variant
        args = ["train", "eagle", "--target", str(folder), "--data", str(corpus), "--out",
                str(out), "--variant", variant, "--budget-tokens", "300", "--epochs", "1",
                "--draft-vocab", "256", "--cache", str(tmp_path / "cache")]  # fmt: skip
        assert main(args) == 0
        printed = capsys.readouterr().out
        assert "step 1: top-1 is the target's own token" in printed
        assert {p.name for p in out.iterdir()} == {
            "eagle.json",
            "eagle.safetensors",
            "metrics.json",
        }
        metrics = json.loads((out / "metrics.json").read_text())
        assert len(metrics["held_out"]["agreement_by_step"]) == (3 if variant == "eagle3" else 1)
        # By default the whole prompt stays in view, as it does when drafting.
        assert metrics["features"]["context"] == metrics["features"]["max_tokens"]
        runs = {}
        # auto with --eagle-dir runs eagle (no drafter ships for this folder: it was ngram's)
        for method in ("ar", "eagle", "auto"):
            argv = ["generate", "Hello there", "--target", str(folder), "--method", method,
                    "--max-new-tokens", "12", "--json"]  # fmt: skip
            if method != "ar":
                argv += ["--eagle-dir", str(out), "--tree", "3,2,5"]
            assert main(argv) == 0
            runs[method] = json.loads(capsys.readouterr().out)["token_ids"]
        assert runs["ar"] == runs["eagle"] == runs["auto"]

        for engine in ("vllm", "sglang"):
            exported = tmp_path / f"{variant}-{engine}"
            argv = ["export", "eagle", "--target", str(folder), "--eagle-dir", str(out),
                    "--out", str(exported), "--engine", engine]  # fmt: skip
            assert main(argv) == 0
            printed = capsys.readouterr().out
            if engine == "vllm":  # each engine's own command, naming the exported folder
                assert "vllm serve" in printed and "--speculative-config" in printed
            else:
                assert "sglang.launch_server" in printed and "vllm" not in printed
                assert "--speculative-draft-model-path" in printed
            assert str(exported) in printed.replace("\n", "")
            config = json.loads((exported / "config.json").read_text())
            weights = load_file(str(exported / "model.safetensors"))
            hidden = config["hidden_size"]
            assert config["num_hidden_layers"] == 1 and not config["tie_word_embeddings"]
            if variant == "eagle3":
                assert config["architectures"] == ["LlamaForCausalLMEagle3"]
                vocab = config["draft_vocab_size"]
                assert weights["fc.weight"].shape == (hidden, 3 * hidden)
                assert weights["midlayer.self_attn.q_proj.weight"].shape[1] == 2 * hidden
                assert weights["lm_head.weight"].shape == (vocab, hidden)
                target_ids = torch.arange(vocab) + weights["d2t"]
                assert bool(weights["t2d"][target_ids].all()) and int(weights["t2d"].sum()) == vocab
                assert {"midlayer.hidden_norm.weight", "norm.weight"} <= set(weights)
            else:
                assert weights["fc.weight"].shape == (hidden, 2 * hidden)
                assert "layers.0.input_layernorm.weight" not in weights
                assert ("fc.bias" in weights) == (engine == "sglang")
                expected = "LlamaForCausalLM" if engine == "vllm" else "LlamaForCausalLMEagle"
                assert config["architectures"] == [expected]


def test_training_learns_and_an_interrupted_run_resumes_to_the_same_net(targets, tmp_path):
    """On a tiny target's own greedy text the trained layer agrees with the target far more
    often than an untrained one; a run stopped mid-way resumes to the same weights."""
    from quickdraft.train.eagle import (
        EagleFeatures,
        EagleTraining,
        evaluate,
        head_argmax,
        train_net,
    )
    from quickdraft.train.eagle_objective import collate, step_losses

    target = targets["llama-tied"]
    tapped = target.with_taps((0, 1, 2))
    features = EagleFeatures([], [], [], [])
    for seed in range(40):  # the target's own greedy continuations of random prompts
        prompt = torch.randint(
            0, target.vocab_size, (4,), generator=torch.Generator().manual_seed(seed)
        )
        reply = generate(target, prompt.tolist(), sampling=GREEDY).token_ids
        tokens = torch.tensor([prompt.tolist() + reply])
        hidden, taps = tapped.body(
            tokens, torch.arange(tokens.shape[1]).unsqueeze(0), tapped.new_cache(1, tokens.shape[1])
        )
        config = EagleConfig.for_target(target.config, "eagle3", 101)
        features.tokens.append(tokens[0])
        features.hidden.append(hidden[0].half())
        features.taps.append(torch.stack([taps[i - 1][0] for i in config.feature_layers], 1).half())
        features.start.append(4)
    config = EagleConfig.for_target(target.config, "eagle3", 101)
    settings = EagleTraining(
        steps=2, draft_vocab=101, epochs=6, batch_size=4, lr=3e-3, checkpoint_every=7
    )
    vocab = torch.arange(101)
    embed, head = target.embed.float(), target.head_weight.float()
    net, metrics = train_net(features, config, vocab, embed, head, settings, tmp_path / "a")
    untrained = EagleNet(config).eval()
    untrained.draft_vocab = vocab
    held = list(range(len(features)))[:4]
    before = evaluate(untrained, features, held, embed, head, settings, torch.device("cpu"))
    after = metrics["held_out"]["agreement_by_step"]
    assert after[0] > before["agreement_by_step"][0] + 0.2, (after, before)
    # The target's token may come from its own (say, quantized) head instead of lm_head's
    # argmax: the same head gives the same figures; a head that never agrees gives none.
    cpu = torch.device("cpu")
    own = evaluate(net, features, held, embed, head, settings, cpu, lambda s: head_argmax(s, head))
    assert own == evaluate(net, features, held, embed, head, settings, cpu)
    # each step's agreement as scored step by step (the target's token per scored position;
    # evaluate computes it once per place, shared by the steps)
    batch = collate(features, held, settings.steps, cpu)
    _, seen = step_losses(net, embed, head[vocab], batch, settings, noise=False)
    for record, figure in zip(seen, own["agreement_by_step"], strict=True):
        choice = head_argmax(record["teachers"][record["place"]], head)
        assert round(float((vocab[record["draft"]] == choice).float().mean()), 4) == figure
    never = evaluate(net, features, held, embed, head, settings, cpu,
                     lambda s: torch.full(s.shape[:1], -1))  # fmt: skip
    assert never["agreement_by_step"] == [0.0, 0.0] and own["agreement_by_step"][0] > 0.2

    class Stop(Exception):
        pass

    def stop_at_step_20(stage, done, total):
        if done == 20:
            raise Stop

    with pytest.raises(Stop):
        train_net(features, config, vocab, embed, head, settings, tmp_path / "b", stop_at_step_20)
    resumed, _ = train_net(features, config, vocab, embed, head, settings, tmp_path / "b")
    for (name, a), (_, b) in zip(
        net.state_dict().items(), resumed.state_dict().items(), strict=True
    ):
        torch.testing.assert_close(a, b, msg=name)

    # SIGTERM (how a background run is stopped) stops it after the step in progress, that
    # step saved: nothing is redone on resume, and every epoch's loss is kept.
    def terminate_at_step_17(stage, done, total):
        if done == 17:
            os.kill(os.getpid(), signal.SIGTERM)

    handler = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        train_net(
            features,
            config,
            vocab,
            embed,
            head,
            settings,
            tmp_path / "stopped",
            terminate_at_step_17,
        )
    assert (tmp_path / "stopped" / "latest").read_text().strip() == "step-0000017"
    assert signal.getsignal(signal.SIGTERM) is handler  # the run's own handler is gone
    resumed, again = train_net(features, config, vocab, embed, head, settings, tmp_path / "stopped")
    for (name, a), (_, b) in zip(
        net.state_dict().items(), resumed.state_dict().items(), strict=True
    ):
        torch.testing.assert_close(a, b, msg=name)
    assert [h["epoch"] for h in again["history"]] == list(range(1, 7))

    other = EagleTraining(steps=1, draft_vocab=101, epochs=6, batch_size=4, checkpoint_every=7)
    with pytest.raises(ValueError, match=r"checkpoint: .* or data: .*settings.steps 2 \(now 1\)"):
        train_net(features, config, vocab, embed, head, other, tmp_path / "b")

    # --init: a run starts from a saved drafter's layers (here with a step too small to move
    # them); one made for another variant is refused by name.
    save_eagle(tmp_path / "saved", net)
    onward = EagleTraining(
        steps=2, draft_vocab=101, epochs=1, batch_size=4, lr=1e-9, init=str(tmp_path / "saved")
    )
    kept, _ = train_net(features, config, vocab, embed, head, onward, tmp_path / "c")
    for name, value in net.state_dict().items():  # saved in fp16
        torch.testing.assert_close(kept.state_dict()[name], value, atol=2e-3, rtol=1e-2)
    # train_eagle keys its checkpoints by the --init drafter's content, not its path: a run
    # again from the same folder after it was rewritten (more epochs there) is a new run.
    from quickdraft.train.common import folder_digest

    first = folder_digest(tmp_path / "saved")
    assert folder_digest(tmp_path / "saved") == first
    save_eagle(tmp_path / "saved", EagleNet(config))
    assert folder_digest(tmp_path / "saved") != first
    save_eagle(tmp_path / "eagle1", EagleNet(EagleConfig.for_target(target.config, "eagle1", 101)))
    elsewhere = EagleTraining(steps=2, draft_vocab=101, epochs=1, init=str(tmp_path / "eagle1"))
    with pytest.raises(ValueError, match=r"init: .* another drafter: variant"):
        train_net(features, config, vocab, embed, head, elsewhere, tmp_path / "d")


def test_bad_training_settings_name_the_field():
    from quickdraft.train.eagle import EagleTraining

    with pytest.raises(ValueError, match="variant"):
        EagleTraining(variant="eagle2")
    with pytest.raises(ValueError, match="steps"):
        EagleTraining(steps=0)
    with pytest.raises(ValueError, match="lr"):
        EagleTraining(lr=0)


def test_shipped_drafter_on_smollm2_is_the_default_and_token_identical(smollm2):
    from quickdraft.drafters.registry import build_drafter

    target, tokenizer = smollm2
    drafter = build_drafter(SpecConfig(method="eagle"), target, target_name="smollm2-135m")
    assert isinstance(drafter, EagleDrafter) and drafter.net.config.variant == "eagle3"
    accepted = shipped_drafter_runs(smollm2, drafter)
    assert max(accepted) > 1.3  # a trained drafter is accepted (an untrained one hardly)
    sampled = SamplingParams(temperature=0.8, top_p=0.95, max_new_tokens=24, seed=3)
    out = generate(
        target, tokenizer.apply_chat("Name three colours."), sampling=sampled, draft=drafter
    )
    assert len(out.token_ids) <= 24 and out.stats.verify_steps >= 1
    # A second build for the same target (generate builds one per call) reuses the packed
    # layers and head rows: quantizing them was 3 s of every call on the 1.5B. Another
    # quantization, or the folder rewritten, is another network.
    again = build_drafter(SpecConfig(method="eagle"), target, target_name="smollm2-135m")
    assert again is not drafter and again.net is drafter.net and again.head is drafter.head
    fp32 = build_drafter(
        make_spec(method="eagle", drafter_int8=False), target, target_name="smollm2-135m"
    )
    assert fp32.net is not drafter.net


def test_a_rewritten_eagle_folder_is_read_again(tmp_path, targets):
    from quickdraft.drafters.eagle.build import build_eagle

    target = targets["llama-tied"]
    save_eagle(tmp_path / "d", random_net(target, "eagle3", draft_vocab=12))
    first = build_eagle(target, tmp_path / "d", int8=True)
    assert build_eagle(target, tmp_path / "d", int8=True).net is first.net
    save_eagle(tmp_path / "d", random_net(target, "eagle3", draft_vocab=12, seed=1))
    assert build_eagle(target, tmp_path / "d", int8=True).net is not first.net


@pytest.mark.parametrize("kind", ["fr", "fr-pa", "dyna", "dyna-pa", "dyna-pa-threaded", "hybrid"])
def test_shortlisted_eagle_is_token_identical_and_drafts_only_shortlisted_tokens(targets, kind):
    """The head scores the shortlist's rows of the target's whole head: drafts stay inside
    the shortlist, reach tokens outside the network's own draft vocabulary, and greedy
    decoding (alone and in a batch) equals plain decoding."""
    target = targets["llama-tied"]
    net = random_net(target, "eagle3", draft_vocab=12)
    shortlist = random_shortlists(target.vocab_size, target.config.hidden_size)[kind]
    drafter = EagleDrafter(target, net, DynamicTree(3, 2, 5), lookup=0, shortlist=shortlist)
    drafted = recorded_drafts(drafter)
    for prompt in PROMPTS:
        out = generate(target, prompt, sampling=GREEDY, spec=WHOLE, draft=drafter)
        assert out.token_ids == generate(target, prompt, sampling=GREEDY).token_ids
    batch = generate_batch(target, PROMPTS, sampling=GREEDY, spec=WHOLE, draft=drafter)
    assert batch.token_ids == [generate(target, p, sampling=GREEDY).token_ids for p in PROMPTS]
    assert shortlist.mean_size() < target.vocab_size
    assert drafted - set(net.draft_vocab.tolist())  # beyond the network's own 12 tokens
    if kind.startswith("fr"):
        assert drafted <= set(shortlist.ranked[:40].tolist())


def test_a_router_on_its_own_thread_drafts_the_trees_an_inline_router_drafts(targets):
    """``parallel`` moves DynaSpec's router beside the drafter's body (the router reads only
    the level's tokens and features), never what it chooses: proposal for proposal, the same
    tree tokens as routing inline."""
    target = targets["llama-tied"]
    net = random_net(target, "eagle3", draft_vocab=12)
    shortlists = random_shortlists(target.vocab_size, target.config.hidden_size)
    proposals: dict[str, list] = {"dyna-pa": [], "dyna-pa-threaded": []}
    for kind, seen in proposals.items():
        drafter = EagleDrafter(
            target, net, DynamicTree(3, 2, 5), lookup=0, shortlist=shortlists[kind]
        )

        def recording(batch, seen=seen, propose=drafter.propose):
            draft = propose(batch)
            seen.append(draft.tokens.tolist())
            return draft

        drafter.propose = recording
        for prompt in PROMPTS:
            generate(target, prompt, sampling=GREEDY, spec=WHOLE, draft=drafter)
    assert len(proposals["dyna-pa"]) > len(PROMPTS)
    assert proposals["dyna-pa"] == proposals["dyna-pa-threaded"]


def test_shipped_smollm2_eagle_takes_a_frequency_shortlist_through_specconfig(smollm2, tmp_path):
    """SpecConfig(method="eagle", draft_shortlist=...) on the real model: the shortlist
    scores the target's own head rows (FR-Spec counted on a little text here), outputs equal
    plain decoding, and the head scores far fewer rows than the full vocabulary."""
    from quickdraft.drafters.registry import build_drafter
    from quickdraft.vocab.shortlist import save_frequency

    target, tokenizer = smollm2
    text = "def reverse(items):\n    return items[::-1]\n" * 3 + "The answer is 84. " * 3
    frequency = torch.zeros(target.vocab_size)
    frequency.index_add_(
        0, torch.tensor(tokenizer.encode(text)), torch.ones(len(tokenizer.encode(text)))
    )
    save_frequency(tmp_path, frequency, {"source": "test"})
    spec = make_spec(method="eagle", draft_shortlist="fr:4096", shortlist_dir=str(tmp_path))
    drafter = build_drafter(spec, target)
    assert all(a > 1.0 for a in shipped_drafter_runs(smollm2, drafter))
    assert drafter.head_rows == 4096 < target.vocab_size


def test_eagle_router_features_are_what_the_first_draft_level_reads(targets):
    """``EagleSource`` (router training data): at each scored x_t, the fused target feature
    the drafter's entry for x_t reads, and the drafter's own first-level choice over the
    target's whole head, the same as the drafter computes when drafting after x_t."""
    from quickdraft.train.features import EagleSource

    target = targets["llama-tied"]
    net = random_net(target, "eagle3", draft_vocab=target.vocab_size)
    net.draft_vocab = torch.arange(target.vocab_size)  # the whole head, as a shortlist sees it
    sequence = torch.tensor([[5, 17, 3, 99, 42, 5, 17, 8, 61]])
    scored = torch.arange(1, sequence.shape[1])
    prev, draft_next, target_next = EagleSource(target, net).run(sequence, scored)
    layers = tuple(layer - 1 for layer in net.config.feature_layers)
    tapped = target.with_taps(layers)
    n = sequence.shape[1]
    full = tapped.forward(sequence, torch.arange(n)[None], tapped.new_cache(1, n))
    assert target_next.tolist() == full.logits[0, 1:].argmax(-1).tolist()
    fused = net.fuse(full.hidden.float(), [full.taps[i].float() for i in layers])
    assert torch.allclose(prev, fused[0, :-1], atol=1e-5)
    for t in (3, 6, 8):  # the drafter after the prefix x_0..x_t, x_t pending
        drafter = EagleDrafter(target, net, DynamicTree(1, 1, 1), lookup=0)
        batch, start = prefilled(drafter, sequence, t + 1, full)
        drafter.begin(start)
        draft = drafter.propose(batch)
        assert draft.tokens[0, 0].item() == draft_next[t - 1].item()


def test_a_drafter_trained_on_a_subset_scores_the_whole_head(targets, tmp_path):
    """``with_full_vocabulary``: the same states over every row of the target's head; its
    drafts reach tokens outside the training subset and decoding stays token-identical."""
    from quickdraft.drafters.eagle.io import with_full_vocabulary

    target = targets["llama-tied"]
    net = random_net(target, "eagle3", draft_vocab=12)
    full = with_full_vocabulary(net)
    assert full.config.draft_vocab_size == target.vocab_size
    assert torch.equal(full.draft_vocab, torch.arange(target.vocab_size))
    save_eagle(tmp_path, full)
    loaded = load_eagle(tmp_path)
    assert torch.equal(loaded.fc.weight, net.fc.weight.half().float())
    drafter = EagleDrafter(target, loaded, DynamicTree(3, 2, 5), lookup=0)
    assert drafter.head_rows == target.vocab_size
    for prompt in PROMPTS:
        out = generate(target, prompt, sampling=GREEDY, spec=WHOLE, draft=drafter)
        assert out.token_ids == generate(target, prompt, sampling=GREEDY).token_ids


def _drafts_and_lengths(target, net) -> tuple[list, list]:
    drafter = EagleDrafter(target, net, DynamicTree(3, 2, 5), lookup=0)
    drafts: list = []
    propose = drafter.propose

    def recording(batch):
        draft = propose(batch)
        drafts.append(draft.tokens.tolist())
        return draft

    drafter.propose = recording
    lengths = [generate(target, p, sampling=GREEDY, spec=WHOLE, draft=drafter).stats.accepted_drafts
               for p in PROMPTS]  # fmt: skip
    return drafts, lengths


@pytest.mark.parametrize("variant", ["eagle1", "eagle3"])
def test_an_exported_drafter_imports_back_and_drafts_the_same(targets, tmp_path, variant):
    """Export for each engine, then --eagle-dir on the exported folder: the same network, the
    same drafts and the same accepted lengths (EAGLE-1's draft vocabulary travels as
    token_map.pt, EAGLE-3's as d2t/t2d, and an LM head copied from the target is read as
    the target's)."""
    from quickdraft.drafters.registry import build_drafter
    from quickdraft.interop.eagle_export import export_eagle

    target = targets["llama-untied"]
    save_eagle(tmp_path / "saved", random_net(target, variant, draft_vocab=40))
    original = load_eagle(tmp_path / "saved")  # fp16 weights, as shipped
    expected = _drafts_and_lengths(target, original)
    for engine in ("vllm", "sglang"):
        folder = export_eagle(original, target.head_weight.float(), tmp_path / engine, engine,
                              target.max_positions)  # fmt: skip
        imported = load_eagle(folder, target.config.num_layers)
        assert imported.config.own_head is False
        assert imported.config.feature_layers == original.config.feature_layers
        assert sorted(imported.draft_vocab.tolist()) == sorted(original.draft_vocab.tolist())
        assert _drafts_and_lengths(target, imported) == expected, engine
        # readable by whoever may read its config (a server running as another user)
        for saved in (folder, tmp_path / "saved"):
            modes = {f.suffix: f.stat().st_mode & 0o777 for f in saved.iterdir()}
            assert modes[".safetensors"] == modes[".json"], saved
        spec = make_spec(method="eagle", eagle_dir=str(folder), tree="3,2,5", eagle_lookup=0)
        drafter = build_drafter(spec, target)
        assert isinstance(drafter, EagleDrafter)
    # The drafter's own tree and lookup travel in config.json's "quickdraft" key: the export
    # read back grows the tree the original does (the engines ignore the key).
    from quickdraft.drafters.eagle.io import run_choices, tree_choice

    choices = {"tree": {"cpu": "3,2,5,0.1"}, "lookup": 2}
    folder = export_eagle(original, target.head_weight.float(), tmp_path / "chosen", "vllm",
                          target.max_positions, choices)  # fmt: skip
    assert run_choices(folder) == choices
    assert tree_choice(EagleTree(), None, folder, "cpu") == (DynamicTree(3, 2, 5, 0.1), 2)
    if variant == "eagle1":  # exported again over the folder: the whole vocabulary in its own
        whole = random_net(target, variant, draft_vocab=target.vocab_size)  # order keeps a map,
        folder = export_eagle(whole, target.head_weight.float(), tmp_path / "sglang", "sglang")
        assert torch.equal(load_eagle(folder).draft_vocab, whole.draft_vocab)
        whole.draft_vocab.copy_(torch.arange(target.vocab_size))  # in id order it needs none,
        folder = export_eagle(whole, target.head_weight.float(), tmp_path / "sglang", "sglang")
        assert not (folder / "token_map.pt").exists()  # and the last export's is not read back
        assert load_eagle(folder).draft_vocab.tolist() == list(range(target.vocab_size))


def test_a_third_party_eagle3_checkpoint_scores_its_own_head(targets, tmp_path):
    """An EAGLE-3 folder trained elsewhere: its own LM head over the draft vocabulary (d2t),
    fused layers named the SGLang way; the output stays plain decoding's. Shortlists, which
    cut the target's rows, are refused; broken folders are named."""
    import json

    from safetensors.torch import load_file, save_file

    from quickdraft.interop.eagle_export import export_eagle

    target = targets["llama-untied"]
    net = random_net(target, "eagle3", draft_vocab=40)
    folder = export_eagle(net, target.head_weight.float(), tmp_path / "third", "sglang")
    config = json.loads((folder / "config.json").read_text())
    del config["quickdraft_head"], config["eagle_aux_hidden_state_layer_ids"]
    (folder / "config.json").write_text(json.dumps(config))
    weights = load_file(folder / "model.safetensors")
    weights["lm_head.weight"] = torch.randn_like(weights["lm_head.weight"].float()).half()
    save_file(weights, folder / "model.safetensors")
    imported = load_eagle(folder)
    assert imported.config.own_head and imported.config.feature_layers == net.config.feature_layers
    drafter = EagleDrafter(target, imported, DynamicTree(3, 2, 5), lookup=0)
    for prompt in PROMPTS:
        out = generate(target, prompt, sampling=GREEDY, spec=WHOLE, draft=drafter)
        assert out.token_ids == generate(target, prompt, sampling=GREEDY).token_ids
    shortlist = random_shortlists(target.vocab_size, target.config.hidden_size)["fr"]
    with pytest.raises(ValueError, match="LM head of its own"):
        EagleDrafter(target, imported, shortlist=shortlist)
    weights["t2d"] = torch.zeros_like(weights["t2d"])
    save_file(weights, folder / "model.safetensors")
    with pytest.raises(ValueError, match="t2d disagrees"):
        load_eagle(folder)
    (folder / "model.safetensors").unlink()
    with pytest.raises(ValueError, match=r"no model\.safetensors"):
        load_eagle(folder)


def test_a_speculators_eagle3_folder_imports(targets, tmp_path):
    """The ``speculators`` layout (vLLM's other EAGLE-3 format): the layer's shape nested in
    transformer_layer_config, weights under layers.0.*; a residual taken after the norm,
    which quickdraft's layer does not compute, is refused by name."""
    import json

    from safetensors.torch import load_file, save_file

    from quickdraft.interop.eagle_export import export_eagle

    target = targets["llama-untied"]
    net = random_net(target, "eagle3", draft_vocab=40)
    folder = export_eagle(net, target.head_weight.float(), tmp_path / "spec", "vllm")
    flat = json.loads((folder / "config.json").read_text())
    layer_keys = (
        "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
        "head_dim", "rms_norm_eps", "rope_theta", "vocab_size", "num_hidden_layers",
    )  # fmt: skip
    config = {
        "speculators_model_type": "eagle3",
        "architectures": ["Eagle3Speculator"],
        "transformer_layer_config": {k: flat[k] for k in layer_keys},
        "draft_vocab_size": flat["draft_vocab_size"],
        "eagle_aux_hidden_state_layer_ids": flat["eagle_aux_hidden_state_layer_ids"],
        "norm_before_residual": False,
        "speculators_config": {"algorithm": "eagle3"},
    }
    (folder / "config.json").write_text(json.dumps(config))
    weights = {k.replace("midlayer.", "layers.0."): v
               for k, v in load_file(folder / "model.safetensors").items()}  # fmt: skip
    save_file(weights, folder / "model.safetensors")
    imported = load_eagle(folder)
    assert imported.config.own_head and imported.config.feature_layers == net.config.feature_layers
    for name, tensor in net.state_dict().items():
        if name.startswith("layers.0."):
            assert torch.equal(imported.state_dict()[name], tensor.half().float()), name
    drafter = EagleDrafter(target, imported, DynamicTree(3, 2, 5), lookup=0)
    out = generate(target, PROMPTS[0], sampling=GREEDY, spec=WHOLE, draft=drafter)
    assert out.token_ids == generate(target, PROMPTS[0], sampling=GREEDY).token_ids
    (folder / "config.json").write_text(json.dumps({**config, "norm_before_residual": True}))
    with pytest.raises(ValueError, match="norm_before_residual"):
        load_eagle(folder)


def test_a_drafter_config_of_wrong_types_is_refused_by_name(targets, tmp_path):
    """Numbers as strings, null or fractional layer numbers in a drafter's settings, from
    ``eagle.json`` or an engine's ``config.json``: one ValueError naming the field, never a
    TypeError deep in the network."""
    import dataclasses
    import json

    from quickdraft.interop.eagle_export import export_eagle

    net = random_net(targets["llama-untied"], "eagle3", draft_vocab=40)
    for field, value in [("rms_norm_eps", "nan"), ("rope_theta", float("inf")),
                         ("feature_layers", (2.5, 3, 4)), ("feature_layers", "abc"),
                         ("own_head", "no"), ("fc_bias", 1)]:  # fmt: skip
        with pytest.raises(ValueError, match=field):
            dataclasses.replace(net.config, **{field: value})
    folder = export_eagle(net, targets["llama-untied"].head_weight.float(), tmp_path / "x", "vllm")
    config = json.loads((folder / "config.json").read_text())
    for field, value in [("rope_theta", None), ("rms_norm_eps", "x"),
                         ("eagle_aux_hidden_state_layer_ids", [1.5, 2, 3])]:  # fmt: skip
        (folder / "config.json").write_text(json.dumps({**config, field: value}))
        with pytest.raises(ValueError, match=rf"config.json.*{field}"):
            load_eagle(folder)
    # a null draft vocabulary reads as the whole one (as vLLM reads it), which the weights'
    # 40-row d2t contradicts: named, not a shape error from load_state_dict
    (folder / "config.json").write_text(json.dumps({**config, "draft_vocab_size": None}))
    with pytest.raises(ValueError, match=r"d2t map of 40 rows.*draft_vocab_size \(null"):
        load_eagle(folder)
    (folder / "config.json").write_text(json.dumps({**config, "head_dim": float("inf")}))
    with pytest.raises(ValueError, match="head_dim must be a finite number"):
        load_eagle(folder)  # json reads Infinity; int() of it overflows
    del config["intermediate_size"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="no positive integer intermediate_size") as error:
        load_eagle(folder)
    assert "invalid settings" not in str(error.value)  # said once, not wrapped again


def test_an_eagle1_checkpoint_with_a_bias_imports_and_exports_only_where_it_loads(
    targets, tmp_path
):
    """The original EAGLE-1 checkpoints have a bias on fc (SGLang's layout); vLLM's EAGLE-1
    has none, so exporting such a drafter for vLLM is refused by name."""
    from safetensors.torch import load_file, save_file

    from quickdraft.interop.eagle_export import export_eagle

    target = targets["llama-untied"]
    net = random_net(target, "eagle1", draft_vocab=40)
    folder = export_eagle(net, target.head_weight.float(), tmp_path / "sglang", "sglang")
    weights = load_file(folder / "model.safetensors")
    weights["fc.bias"] = torch.randn_like(weights["fc.bias"].float()).half()
    save_file(weights, folder / "model.safetensors")
    imported = load_eagle(folder)
    assert imported.config.fc_bias and imported.draft_vocab.numel() == 40
    drafter = EagleDrafter(target, imported, DynamicTree(3, 2, 5), lookup=0)
    for prompt in PROMPTS:
        out = generate(target, prompt, sampling=GREEDY, spec=WHOLE, draft=drafter)
        assert out.token_ids == generate(target, prompt, sampling=GREEDY).token_ids
    with pytest.raises(ValueError, match="no fc bias"):
        export_eagle(imported, target.head_weight.float(), tmp_path / "vllm", "vllm")
    again = export_eagle(imported, target.head_weight.float(), tmp_path / "again", "sglang")
    assert torch.equal(load_file(again / "model.safetensors")["fc.bias"], weights["fc.bias"])


@pytest.mark.parametrize("variant", ["eagle1", "eagle3"])
def test_training_skips_prompt_anchors_without_changing_a_loss(targets, variant):
    """``step_losses`` runs the unrolled steps only from the first anchor any step scores and
    computes the target's distribution once per label place; each step's loss and argmax
    equal the plain definition (every anchor unrolled, each step's teacher on its own)."""
    import torch.nn.functional as F

    from quickdraft.train.eagle import EagleFeatures, EagleTraining
    from quickdraft.train.eagle_objective import collate, scored_anchors, step_losses

    target = targets["llama-tied"]
    net = random_net(target, variant, draft_vocab=50)
    d, generator = target.config.hidden_size, torch.Generator().manual_seed(3)
    features = EagleFeatures([], [], [], [])
    for length, start in [(30, 12), (24, 15), (27, 9)]:
        features.tokens.append(torch.randint(0, target.vocab_size, (length,), generator=generator))
        features.hidden.append(torch.randn(length, d, generator=generator).half())
        taps = torch.randn(length, 3, d, generator=generator).half()
        features.taps.append(taps if variant == "eagle3" else None)
        features.start.append(start)
    settings = EagleTraining(variant=variant, steps=3, draft_vocab=50)
    batch = collate(features, [0, 1, 2], settings.steps, torch.device("cpu"))
    embed, head = target.embed.float(), target.head_weight.float()[net.draft_vocab]
    with torch.no_grad():
        losses, seen = step_losses(net, embed, head, batch, settings, noise=False)
        hidden, real, anchors = batch["hidden"], batch["real"], batch["hidden"].shape[1] - 1
        taps = None if batch["taps"] is None else list(batch["taps"][:, :anchors].unbind(2))
        fused = net.fuse(hidden[:, :anchors], taps)
        embeds = embed[batch["tokens"][:, 1 : anchors + settings.steps]]
        outputs = net.unroll(embeds, fused, settings.steps, ~real[:, :anchors])
    assert sorted(losses) == [0, 1, 2] and int(batch["start"].min()) - 4 > 0  # anchors skipped
    for j, output in enumerate(outputs):
        rows, columns = scored_anchors(real, batch["start"], anchors, j).nonzero(as_tuple=True)
        teacher = (hidden[rows, columns + 1 + j] @ head.T).softmax(-1)
        logits = net.head_input(output[rows, columns]) @ head.T
        expected = F.cross_entropy(logits, teacher, reduction="sum")
        if variant == "eagle1":
            regression = F.smooth_l1_loss(output[rows, columns], hidden[rows, columns + 1 + j])
            expected = 0.1 * expected + regression * len(rows)
        torch.testing.assert_close(losses[j], expected, rtol=1e-5, atol=1e-4)
        assert torch.equal(seen[j]["draft"], logits.argmax(-1))
        assert torch.equal(seen[j]["target"], teacher.argmax(-1))
    with pytest.raises(ValueError, match="first"):
        net.unroll(embeds, fused, 1, ~real[:, :anchors], first=anchors)


def test_the_held_out_argmax_in_chunks_is_the_argmax_of_the_whole():
    from quickdraft.train.eagle import head_argmax

    generator = torch.Generator().manual_seed(0)
    states, head = (
        torch.randn(37, 16, generator=generator),
        torch.randn(300, 16, generator=generator),
    )
    assert torch.equal(head_argmax(states, head, chunk=8), (states @ head.T).argmax(-1))


def test_the_held_out_split_is_fixed_by_its_seed_and_covers_every_sequence():
    """Runs that continue one another (--init) split the same store the same way, so none
    trains on what an earlier one held out."""
    from quickdraft.train.eagle import split_held_out

    train, held = split_held_out(100, 0.1, seed=0)
    assert (train, held) == split_held_out(100, 0.1, seed=0)
    assert len(held) == 10 and sorted(train + held) == list(range(100))
    assert split_held_out(100, 0.1, seed=1)[1] != held
    assert len(split_held_out(3, 0.01, seed=0)[1]) == 1  # at least one held out


def test_asked_for_a_text_draft_eagle_drafts_its_lookup_alone(targets):
    """``Batch.text_only`` (its network resting): the grafted lookup's scored chain, no tree;
    a drafter without a lookup declares no text draft."""
    target = targets["llama-untied"]
    drafter = EagleDrafter(target, random_net(target, "eagle3"), DynamicTree(3, 2, 5), lookup=3)
    assert drafter.needs.text_draft
    drafter.reserve(1, 64)
    rows = [[1, 2, 3, 4, 1, 2, 3]]
    draft = drafter.propose(dataclasses.replace(Batch.from_rows(rows), text_only=True))
    assert draft.tree is None and draft.tokens.tolist() == [[4, 1, 2]]
    assert draft.scores is not None and draft.scores[0, 0] > draft.scores[0, 2] > 0
    plain = EagleDrafter(target, random_net(target, "eagle3"), DynamicTree(3, 2, 5))
    assert not plain.needs.text_draft
