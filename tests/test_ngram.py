import pytest

from quickdraft.config import SamplingParams
from quickdraft.drafters.base import Batch
from quickdraft.drafters.ngram import NGramDrafter
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
