"""Medusa heads: tree drafting on the target's own hidden state, exact and token-identical."""

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
from quickdraft.config import Method
from quickdraft.drafters.medusa.drafter import MedusaDrafter
from quickdraft.drafters.medusa.net import MedusaConfig, MedusaHeads, load_heads, save_heads
from quickdraft.drafters.medusa.tree import default_tree, parse_tree
from quickdraft.drafters.registry import build_drafter, make_spec

GREEDY = SamplingParams(temperature=0, max_new_tokens=40)
PROMPTS = [[5, 17, 3, 99, 42, 5, 17], [1, 2, 3, 1, 2, 3, 1, 2], [7]]


def random_heads(hidden: int, vocab: int, num_heads: int = 3, seed: int = 0, own=None):
    """Heads with random (not zero) blocks, so their candidates differ from the target's."""
    torch.manual_seed(seed)
    heads = MedusaHeads(MedusaConfig(hidden, vocab, num_heads, own_head=own is not None), own)
    with torch.no_grad():
        for block in heads.blocks:
            for layer in block:
                layer.linear.weight.normal_(0, 0.3)
    return heads.eval()


@pytest.fixture(scope="module")
def targets():
    return tiny_runners(layers=2)


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("tree", ["default", "3,2,1", "1,1,1", "2"])
def test_medusa_trees_are_token_identical_to_plain_decoding(targets, family, tree):
    target = targets[family]
    heads = random_heads(target.config.hidden_size, target.vocab_size)
    drafter = MedusaDrafter(target, heads, parse_tree(tree, 3))
    for prompt in PROMPTS:
        expected = generate(target, prompt, sampling=GREEDY).token_ids
        out = generate(target, prompt, sampling=GREEDY, draft=drafter)
        assert out.token_ids == expected, (family, tree, prompt)
        assert out.stats.target_forwards <= len(expected)


def test_untrained_heads_repeat_the_targets_next_token_and_heads_of_their_own_work(targets):
    target = targets["llama-untied"]
    config = MedusaConfig(target.config.hidden_size, target.vocab_size, 2)
    states = MedusaHeads(config)(torch.randn(4, config.hidden_size))
    assert states.shape == (4, 2, config.hidden_size)
    own = random_heads(
        target.config.hidden_size, target.vocab_size, 2, own=target.head_weight.float()
    )
    drafter = MedusaDrafter(target, own)
    for prompt in PROMPTS[:2]:
        expected = generate(target, prompt, sampling=GREEDY).token_ids
        assert generate(target, prompt, sampling=GREEDY, draft=drafter).token_ids == expected


def test_batched_rows_match_single_runs(targets):
    target = targets["qwen2-bias"]
    drafter = MedusaDrafter(target, random_heads(target.config.hidden_size, target.vocab_size))
    prompts = torch.randint(0, 101, (3, 6), generator=torch.Generator().manual_seed(5))
    batch = generate_batch(target, prompts, sampling=GREEDY, draft=drafter)
    for row, ids in zip(prompts.tolist(), batch.token_ids, strict=True):
        assert ids == generate(target, row, sampling=GREEDY).token_ids


def test_sampling_with_trees_runs_and_is_seeded(targets):
    target = targets["llama-tied"]
    drafter = MedusaDrafter(target, random_heads(target.config.hidden_size, target.vocab_size))
    sampling = SamplingParams(temperature=0.8, top_p=0.9, max_new_tokens=30, seed=3)
    a = generate(target, PROMPTS[0], sampling=sampling, draft=drafter)
    b = generate(target, PROMPTS[0], sampling=sampling, draft=drafter)
    assert a.token_ids == b.token_ids and len(a.token_ids) == 30
    assert all(0 <= t < target.vocab_size for t in a.token_ids)


def test_heads_round_trip_and_build_from_a_spec(targets, tmp_path):
    target = targets["llama-tied"]
    heads = random_heads(target.config.hidden_size, target.vocab_size, 2)
    save_heads(tmp_path, heads, {"note": "test"})
    loaded = load_heads(tmp_path)
    hidden = torch.randn(3, target.config.hidden_size)
    torch.testing.assert_close(loaded(hidden), heads(hidden), atol=1e-2, rtol=1e-2)  # fp16 file
    spec = make_spec(method=Method.MEDUSA, medusa_dir=str(tmp_path), tree="2,2")
    drafter = build_drafter(spec, target)
    assert (
        isinstance(drafter, MedusaDrafter)
        and drafter.needs.tokens == 6
        and drafter.needs.depth == 2
    )


def test_bad_medusa_settings_name_the_field(targets, tmp_path):
    target = targets["llama-tied"]
    with pytest.raises(ValueError, match="tree applies to methods medusa and eagle"):
        make_spec(method=Method.NGRAM, tree="2,2")
    with pytest.raises(ValueError, match="tree"):
        make_spec(method=Method.MEDUSA, tree="two")
    with pytest.raises(ValueError, match="medusa_dir"):
        build_drafter(make_spec(method=Method.MEDUSA, medusa_dir=str(tmp_path)), target)
    with pytest.raises(ValueError, match="medusa_dir: no Medusa heads ship"):
        build_drafter(SpecConfig(method=Method.MEDUSA), target, target_name="nope")
    heads = random_heads(target.config.hidden_size, target.vocab_size, 2)
    with pytest.raises(ValueError, match="tree: 3 levels"):
        MedusaDrafter(target, heads, parse_tree("2,2,2", 3))
    with pytest.raises(ValueError, match="hidden size"):
        MedusaDrafter(target, random_heads(32, target.vocab_size))
    assert default_tree(3).num_nodes == 14 and default_tree(5).max_depth == 5


# -- training ------------------------------------------------------------------------------


def test_head_labels_are_the_targets_later_choices_within_a_sequence():
    from quickdraft.train.medusa_features import HeadFeatures, head_labels

    features = HeadFeatures(
        hidden=torch.zeros(5, 4, dtype=torch.half),
        choice=torch.tensor([10, 11, 12, 20, 21]),
        sequence=torch.tensor([0, 0, 0, 1, 1]),
    )
    labels, valid = head_labels(features, 2)
    # Head 1 at position t: the choice at t + 1; head 2: at t + 2; never across sequences.
    assert labels[valid[:, 0], 0].tolist() == [11, 12, 21]
    assert valid[:, 0].tolist() == [True, True, False, True, False]
    assert labels[valid[:, 1], 1].tolist() == [12]


def synthetic_features(count=3000, hidden=16, vocab=40, seed=0):
    """Random hidden states; the target's next choice after each is what a random teacher
    head (a residual block with the same LM head) predicts from it: learnable by head 1."""
    from quickdraft.train.medusa_features import HeadFeatures

    generator = torch.Generator().manual_seed(seed)
    lm_head = torch.randn(vocab, hidden, generator=generator)
    states = torch.randn(count, hidden, generator=generator)
    teacher = torch.nn.Linear(hidden, hidden)
    with torch.no_grad():
        teacher.weight.copy_(torch.randn(hidden, hidden, generator=generator))
        teacher.bias.zero_()
        wanted = ((states + torch.nn.functional.silu(teacher(states))) @ lm_head.T).argmax(-1)
    choice = torch.roll(wanted, 1)  # the choice at t + 1 is the teacher's prediction at t
    sequence = torch.arange(count) // 100
    return HeadFeatures(states.half(), choice, sequence), lm_head


def test_training_learns_and_an_interrupted_run_resumes_to_the_same_heads(tmp_path):
    from quickdraft.train.medusa import MedusaTraining, evaluate, split, train_heads

    features, lm_head = synthetic_features()
    # Hard labels: the synthetic states are not the target's, so its distribution there means
    # nothing (soft labels are exercised on real features by the tests below).
    settings = MedusaTraining(
        num_heads=2, epochs=3, batch_size=64, lr=1e-2, checkpoint_every=7, soft_labels=False
    )
    heads, metrics = train_heads(features, lm_head, settings, tmp_path / "a")
    _, held = split(features, settings.validation_fraction, settings.seed)
    untrained = evaluate(MedusaHeads(heads.config), features, held, lm_head, 2)
    assert metrics["held_out"][0]["top1"] > untrained[0]["top1"] + 0.3, (metrics, untrained)

    class Stop(Exception):
        pass

    def stop_at_step_20(stage, done, total):
        if done == 20:
            raise Stop

    with pytest.raises(Stop):
        train_heads(features, lm_head, settings, tmp_path / "b", stop_at_step_20)
    resumed, _ = train_heads(features, lm_head, settings, tmp_path / "b")
    for (name, a), (_, b) in zip(
        heads.state_dict().items(), resumed.state_dict().items(), strict=True
    ):
        torch.testing.assert_close(a, b, msg=name)
    other = MedusaTraining(
        num_heads=2, epochs=4, batch_size=64, checkpoint_every=7, soft_labels=False
    )
    with pytest.raises(ValueError, match="checkpoint"):
        train_heads(features, lm_head, other, tmp_path / "b")


def test_train_medusa_command_then_generate_with_its_heads(tmp_path, smollm2, capsys):
    import json

    from quickdraft.cli import main

    folder, corpus = tiny_folder_and_corpus(tmp_path, smollm2, "llama-tied")
    out = tmp_path / "heads"
    args = ["train", "medusa", "--target", str(folder), "--data", str(corpus), "--out",
            str(out), "--heads", "2", "--budget-tokens", "400", "--epochs", "1",
            "--cache", str(tmp_path / "cache")]  # fmt: skip
    assert main(args) == 0
    assert "head 2: top-1" in capsys.readouterr().out
    assert {p.name for p in out.iterdir()} == {"medusa.json", "medusa.safetensors", "metrics.json"}
    runs = {}
    for method in ("ar", "medusa"):
        argv = ["generate", "Hello there", "--target", str(folder), "--method", method,
                "--max-new-tokens", "12", "--json"]  # fmt: skip
        if method == "medusa":
            argv += ["--medusa-dir", str(out), "--tree", "3,2"]
        assert main(argv) == 0
        runs[method] = json.loads(capsys.readouterr().out)["token_ids"]
    assert runs["ar"] == runs["medusa"]
    assert main(["generate", "Hi", "--target", str(folder), "--method", "ngram",
                 "--tree", "2,2"]) == 2  # fmt: skip
    assert "tree applies to methods medusa and eagle" in capsys.readouterr().err


def test_fitted_trees_take_the_most_likely_paths():
    from quickdraft.drafters.medusa.tree import fit_tree

    accuracy = [[0.6, 0.1, 0.05], [0.4, 0.1], [0.3]]
    shape = fit_tree(accuracy, 5)
    # Paths by probability: (0) .6, (0,0) .24, (1) .1, (0,0,0) .072, (0,1) .06.
    assert shape.parents.tolist() == [-1, -1, 0, 0, 2]
    assert shape.depth.tolist() == [1, 1, 2, 2, 3]
    assert fit_tree(accuracy, 100).num_nodes == 3 + 3 * 2 + 3 * 2  # every path the heads allow
    with pytest.raises(ValueError, match="nodes"):
        fit_tree(accuracy, 0)
    assert str(make_spec(method=Method.MEDUSA, tree="fit:8").options.tree) == "fit:8"
    with pytest.raises(ValueError, match="fit:N"):
        make_spec(method=Method.MEDUSA, tree="fit:x")


def test_pruned_draft_with_a_distilled_exit_agrees_more_and_stays_exact(targets, tmp_path):
    from quickdraft.drafters.draft_model.drafter import DraftModelDrafter
    from quickdraft.models.pruned import PrunedModel
    from quickdraft.train.corpus import Sequence
    from quickdraft.train.medusa import MedusaTraining, train_exit

    target = targets["llama-tied"]
    generator = torch.Generator().manual_seed(0)
    # Text the target itself wrote (greedy continuations of random prompts): what it agrees with.
    sequences = []
    for _ in range(40):
        prompt = torch.randint(0, 101, (4,), generator=generator).tolist()
        reply = generate(target, prompt, sampling=SamplingParams(temperature=0, max_new_tokens=28))
        sequences.append(Sequence(prompt + reply.token_ids, 4, "text"))
    training = MedusaTraining(epochs=3, batch_size=32, lr=3e-3)
    adapter, metrics = train_exit(target, 1, sequences, training, tmp_path)
    plain = PrunedModel(target, 1)
    distilled = PrunedModel(target, 1, adapter)
    tokens = torch.tensor([sequences[0].tokens])
    positions = torch.arange(tokens.shape[1]).unsqueeze(0)
    reference = plain.runner.forward(tokens, positions, plain.new_cache(1, 40)).logits
    torch.testing.assert_close(
        plain.forward(tokens, positions, plain.new_cache(1, 40)).logits, reference
    )
    assert metrics["held_out"][0]["top1"] > 0.5
    accepted = {}
    for name, model in (("plain", plain), ("distilled", distilled)):
        whole = SpecConfig(adaptive_k=False)  # compares the drafts' agreement: k each step
        out = generate(
            target, PROMPTS[0], sampling=GREEDY, spec=whole, draft=DraftModelDrafter(model, 3)
        )
        assert out.token_ids == generate(target, PROMPTS[0], sampling=GREEDY).token_ids
        accepted[name] = out.stats.mean_accepted_length
    assert accepted["distilled"] >= accepted["plain"]


def test_shipped_heads_on_smollm2_are_the_default_and_token_identical(smollm2):
    target, _ = smollm2
    drafter = build_drafter(SpecConfig(method=Method.MEDUSA), target, target_name="smollm2-135m")
    assert isinstance(drafter, MedusaDrafter) and drafter.needs.depth == 3
    assert drafter.heads.rank_accuracy is not None  # the tree is fitted to them
    accepted = shipped_drafter_runs(smollm2, drafter)
    assert max(accepted) > 1.3  # trained heads are accepted (untrained ones repeat a token)


def test_heads_of_their_own_round_trip(targets, tmp_path):
    target = targets["llama-untied"]
    heads = random_heads(
        target.config.hidden_size, target.vocab_size, 2, own=target.head_weight.float()
    )
    save_heads(tmp_path, heads)
    loaded = load_heads(tmp_path)
    hidden = torch.randn(2, target.config.hidden_size)
    lm_head = torch.empty(0)
    torch.testing.assert_close(
        loaded.logits(loaded(hidden), lm_head), heads.logits(heads(hidden), lm_head),
        atol=0.05, rtol=0.01,
    )  # fmt: skip


def test_heads_trained_on_a_token_subset_draft_from_it(tmp_path, smollm2, capsys):
    """--train-vocab: the loss scores the target's most frequent choices only; the heads keep
    that list, rank only it when drafting, and decoding stays token-identical."""
    import json

    from quickdraft.cli import main

    folder, corpus = tiny_folder_and_corpus(tmp_path, smollm2, "llama-untied")
    out = tmp_path / "heads"
    args = ["train", "medusa", "--target", str(folder), "--data", str(corpus), "--out",
            str(out), "--heads", "2", "--budget-tokens", "400", "--epochs", "1",
            "--train-vocab", "256", "--cache", str(tmp_path / "cache")]  # fmt: skip
    assert main(args) == 0
    heads = load_heads(out)
    assert heads.vocab is not None and heads.vocab.numel() == 256
    assert heads.vocab.unique().numel() == 256
    runs = {}
    for method in ("ar", "medusa"):
        argv = ["generate", "Hello there", "--target", str(folder), "--method", method,
                "--max-new-tokens", "12", "--json"]  # fmt: skip
        if method == "medusa":
            argv += ["--medusa-dir", str(out), "--tree", "3,2"]
        capsys.readouterr()
        assert main(argv) == 0
        runs[method] = json.loads(capsys.readouterr().out)["token_ids"]
    assert runs["ar"] == runs["medusa"]
    with pytest.raises(ValueError, match="train_vocab"):
        from quickdraft.train.medusa import MedusaTraining

        MedusaTraining(train_vocab=100, soft_labels=False)


@pytest.mark.parametrize("kind", ["fr", "fr-pa", "dyna", "dyna-pa", "hybrid"])
def test_shortlisted_medusa_heads_are_token_identical(targets, kind):
    """Each head ranks its shortlist's rows of the target's head (the router reads the
    pending token and the target's state): drafts stay inside an FR-Spec list, and greedy
    decoding, alone and in a batch, equals plain decoding. Heads of their own are refused."""
    target = targets["llama-untied"]
    heads = random_heads(target.config.hidden_size, target.vocab_size)
    shortlist = random_shortlists(target.vocab_size, target.config.hidden_size)[kind]
    drafter = MedusaDrafter(target, heads, parse_tree("3,2,1", 3), shortlist=shortlist)
    drafted = recorded_drafts(drafter)
    expected = [generate(target, p, sampling=GREEDY).token_ids for p in PROMPTS]
    assert [generate(target, p, sampling=GREEDY, draft=drafter).token_ids for p in PROMPTS] == (
        expected
    )
    assert generate_batch(target, PROMPTS, sampling=GREEDY, draft=drafter).token_ids == expected
    if kind.startswith("fr"):
        assert drafted <= set(shortlist.ranked[:40].tolist())
    own = random_heads(
        target.config.hidden_size, target.vocab_size, 3, own=target.head_weight.float()
    )
    with pytest.raises(ValueError, match="LM heads of their own"):
        MedusaDrafter(target, own, parse_tree("3,2,1", 3), shortlist=shortlist)
