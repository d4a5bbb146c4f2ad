import itertools

import pytest
import torch

from quickdraft.models import Model, NGramLM, ToyTokenizer
from quickdraft.models.base import Slots
from quickdraft.theory import kl_divergence


def logits_of(model, tokens):
    tokens = torch.as_tensor(tokens).unsqueeze(0)
    cache = model.new_cache(1, tokens.shape[1])
    return model.forward(tokens, torch.arange(tokens.shape[1]).unsqueeze(0), cache).logits[0]


def test_ngram_reads_its_table_with_bos_padding():
    model = NGramLM.random(5, order=3, seed=0)
    assert isinstance(model, Model)
    logits = logits_of(model, [4, 2, 0])
    bos = 5
    torch.testing.assert_close(logits[0], model.table[bos * 6 + 4])
    torch.testing.assert_close(logits[1], model.table[4 * 6 + 2])
    torch.testing.assert_close(logits[2], model.table[2 * 6 + 0])


def test_incremental_forward_with_cache_matches_one_pass():
    model = NGramLM.random(7, order=4, seed=1)
    tokens = torch.randint(0, 7, (3, 9), generator=torch.Generator().manual_seed(0))
    cache = model.new_cache(3, 16)
    full = model.forward(tokens, torch.arange(9).expand(3, -1), model.new_cache(3, 16)).logits
    pieces = []
    for start, stop in ((0, 4), (4, 5), (5, 9)):
        out = model.forward(tokens[:, start:stop], torch.arange(start, stop).expand(3, -1), cache)
        cache.commit(stop - start)
        pieces.append(out.logits)
    torch.testing.assert_close(torch.cat(pieces, 1), full)


def test_uncommitted_entries_are_overwritten_by_the_next_forward():
    model = NGramLM.random(6, order=3, seed=2)
    cache = model.new_cache(1, 8)
    model.forward(torch.tensor([[1, 2, 3]]), torch.arange(3).unsqueeze(0), cache)
    cache.commit(1)  # keep only token 1
    out = model.forward(torch.tensor([[5]]), torch.tensor([[1]]), cache)
    torch.testing.assert_close(out.logits[0, 0], model.table[1 * 7 + 5])  # context (1, 5)


def test_perturbed_distance_zero_is_identical_and_kl_grows_with_distance():
    model = NGramLM.random(10, order=1, seed=3)
    assert torch.equal(model.perturbed(0.0).table, model.table)
    target = torch.softmax(model.table[0], -1)
    kls = [
        kl_divergence(target, torch.softmax(model.perturbed(d).table[0], -1))
        for d in (0.0, 0.2, 0.5, 0.8, 1.0)
    ]
    assert kls[0] == 0 and all(a < b for a, b in itertools.pairwise(kls))


def test_bad_arguments_raise_value_errors():
    model = NGramLM.random(4, order=2, seed=0)
    with pytest.raises(ValueError, match="distance"):
        model.perturbed(1.5)
    with pytest.raises(ValueError, match="tree_mask"):
        model.forward(
            torch.tensor([[1]]),
            torch.tensor([[0]]),
            model.new_cache(1, 4),
            tree_mask=torch.ones(2, 2, dtype=torch.bool),  # one new token needs a [1, 1] mask
        )
    with pytest.raises(ValueError, match="capacity"):
        model.forward(
            torch.tensor([[1, 2, 3]]), torch.arange(3).unsqueeze(0), model.new_cache(1, 2)
        )
    with pytest.raises(ValueError, match="table"):
        NGramLM(torch.zeros(3, 4), order=2)


def test_rollback_moves_back_only():
    cache = NGramLM.random(4, order=2, seed=0).new_cache(2, 8)
    cache.commit(torch.tensor([3, 5]))
    cache.rollback(torch.tensor([1, 5]))
    assert cache.lengths.tolist() == [1, 5]
    with pytest.raises(ValueError, match="rollback"):
        cache.rollback(torch.tensor([2, 2]))


def test_toy_tokenizer_round_trip():
    tokenizer = ToyTokenizer(26)
    assert tokenizer.decode(tokenizer.encode("speculate")) == "speculate"
    with pytest.raises(ValueError, match="text"):
        tokenizer.encode("Z")


def test_a_gathered_view_of_the_token_cache_writes_its_slots_only():
    """The toy's cache behind ``Cache.select`` of slots with holes: each row's logits are its
    own, its tokens land in its slot, the lengths come back, the slot between is untouched."""
    model = NGramLM.random(5, order=3, seed=0)
    cache = model.new_cache(3, 8)
    model.forward(torch.tensor([[1, 2], [3, 4], [0, 0]]), torch.arange(2).expand(3, -1), cache)
    cache.commit(2)
    view = cache.select(Slots.of([2, 0]))
    logits = model.forward(torch.tensor([[4, 1], [2, 3]]), torch.tensor([[2, 3]] * 2), view).logits
    view.commit(torch.tensor([2, 1]))
    assert cache.lengths.tolist() == [3, 2, 4]
    assert cache.tokens[0, :3].tolist() == [1, 2, 2]
    assert cache.tokens[2, :4].tolist() == [0, 0, 4, 1]
    assert cache.tokens[1, :2].tolist() == [3, 4] and cache.tokens[1, 2:].eq(0).all()
    torch.testing.assert_close(logits[0], logits_of(model, [0, 0, 4, 1])[2:])
    torch.testing.assert_close(logits[1], logits_of(model, [1, 2, 2, 3])[2:])
