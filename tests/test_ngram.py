import dataclasses

import pytest
import torch

from quickdraft.config import SamplingParams
from quickdraft.drafters.base import Batch, Slots, StepResult
from quickdraft.drafters.ngram import FIRST, LATER, SPLIT, NGramDrafter
from quickdraft.drafters.registry import build_drafter, make_spec
from quickdraft.models import NGramLM


def state_for(rows: list[list[int]]) -> Batch:
    return Batch.from_rows(rows, SamplingParams(), room=8)


def test_longest_then_most_recent_match_is_proposed():
    drafter = NGramDrafter(vocab_size=50, num_tokens=3, min_n=1, max_n=3)
    # "7 8 9" occurred at the start followed by 1 2 3; "8 9" later followed by 4 5.
    draft = drafter.propose(state_for([[7, 8, 9, 1, 2, 3, 0, 8, 9, 4, 5, 6, 7, 8, 9]]))
    assert draft.tokens.tolist() == [[1, 2, 3]] and draft.probs is None and draft.tree is None
    draft = drafter.propose(state_for([[5, 8, 9, 4, 5, 6, 0, 1, 8, 9]]))
    assert draft.tokens.tolist() == [[4, 5, 6]]  # bigram "8 9", most recent occurrence


def test_rows_without_a_match_are_padded_and_an_empty_draft_is_allowed():
    drafter = NGramDrafter(vocab_size=50, num_tokens=4, min_n=2, max_n=2)
    draft = drafter.propose(state_for([[1, 2, 3, 1, 2], [9, 8, 7, 6, 5]]))
    assert draft.tokens.tolist() == [[3, 1, 2], [5, 5, 5]]  # the text ends after "3 1 2"
    assert drafter.propose(state_for([[1, 2, 3, 4]])).tokens.shape == (1, 0)


def test_continuation_is_cut_at_the_end_of_the_text():
    drafter = NGramDrafter(vocab_size=50, num_tokens=5, min_n=1, max_n=1)
    assert drafter.propose(state_for([[4, 1, 2, 4]])).tokens.tolist() == [[1, 2, 4]]


def test_builder_and_config_validation():
    target = NGramLM.random(20, order=2, seed=0)
    spec = make_spec(
        method="ngram", num_speculative_tokens=6, prompt_lookup_min=2, prompt_lookup_max=4
    )
    drafter = build_drafter(spec, target)
    assert isinstance(drafter, NGramDrafter) and (drafter.min_n, drafter.max_n) == (2, 4)
    with pytest.raises(ValueError, match="draft"):
        build_drafter(spec, target, target)
    with pytest.raises(ValueError, match="prompt_lookup_min"):
        make_spec(method="ngram", prompt_lookup_min=5, prompt_lookup_max=2)
    with pytest.raises(ValueError, match="prompt_lookup_max"):
        make_spec(method="ngram", prompt_lookup_max=0)


def _scan(text: list[int], low: int, high: int, most: int) -> list[int]:
    """Prompt lookup by a scan of the whole text: the longest n, the most recent match."""
    for n in range(min(high, len(text) - 1), low - 1, -1):
        starts = [i for i in range(len(text) - n) if text[i : i + n] == text[len(text) - n :]]
        if starts:
            return text[starts[-1] + n : starts[-1] + n + most]
    return []


def test_the_growing_index_finds_what_a_scan_of_the_text_finds():
    """An engine's drafter extends each slot's index as its text grows and starts it afresh
    when a request joins the slot; at every length it proposes what a scan would."""
    generator = torch.Generator().manual_seed(3)
    drafter = NGramDrafter(vocab_size=6, num_tokens=4, min_n=1, max_n=3)
    drafter.reserve(2, 64)
    for request in range(3):
        texts = [torch.randint(0, 6, (40,), generator=generator).tolist() for _ in range(2)]
        slots = Slots.of([0, 1])
        drafter.begin(StepResult(Batch.from_rows([t[:3] for t in texts]), torch.zeros(2)))
        for length in range(3, 41, 1 + request):  # steps that gain one token or several
            rows = [t[:length] for t in texts]
            draft = drafter.propose(dataclasses.replace(Batch.from_rows(rows), slots=slots))
            for b, row in enumerate(rows):
                found = _scan(row, 1, 3, 4)
                assert draft.tokens[b, : len(found)].tolist() == found, (request, length, b)


def test_a_draft_is_scored_by_the_match_it_came_from():
    """Scores are each token's chance to land with every one before it: the first token's by
    the n-gram's size and whether its earlier occurrences agreed, each later one's given the
    last."""
    drafter = NGramDrafter(vocab_size=50, num_tokens=3, min_n=1, max_n=3)
    agreed = drafter.propose(state_for([[7, 8, 9, 1, 2, 3, 0, 7, 8, 9]]))
    first, later = FIRST[2], LATER[2]
    assert agreed.scores.tolist()[0] == pytest.approx([first, first * later, first * later**2])
    # "8 9" went on as 1 once and as 4 once: the most recent (4) with half the chance.
    split = drafter.propose(state_for([[8, 9, 1, 2, 0, 8, 9, 4, 5, 6, 8, 9]]))
    assert split.tokens.tolist() == [[4, 5, 6]]
    assert split.scores[0, 0].item() == pytest.approx(FIRST[1] * SPLIT)
    one = drafter.propose(state_for([[5, 1, 2, 3, 5]]))
    assert one.scores[0, 0].item() == pytest.approx(FIRST[0])
    padded = drafter.propose(state_for([[7, 8, 9, 1, 2, 3, 0, 7, 8, 9], [9, 9, 1, 2, 1]]))
    assert padded.scores[1].tolist() == pytest.approx([FIRST[0], FIRST[0] * LATER[0], 0.0])


def test_a_match_below_the_floor_drafts_nothing():
    """``Batch.floor``: a first token that scores below it would be refused; the drafter
    leaves the row empty without building its draft."""
    drafter = NGramDrafter(vocab_size=50, num_tokens=3, min_n=1, max_n=3)
    rows = [[5, 1, 2, 3, 5]]  # a 1-gram match: FIRST[0]
    low = dataclasses.replace(state_for(rows), floor=FIRST[0] - 0.01)
    high = dataclasses.replace(state_for(rows), floor=FIRST[0] + 0.01)
    assert drafter.propose(low).tokens.tolist() == [[1, 2, 3]]
    assert drafter.propose(high).tokens.shape == (1, 0)
