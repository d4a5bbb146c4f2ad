"""Statistical proof of exactness: does speculative decoding sample the target's distribution?

For each case, a toy target with an exactly computable distribution and a perturbed draft of it
generate k+1 tokens from one prompt, ``samples`` times in one batch, through the real engine.
The empirical joint distribution of those k+1 tokens (so corrected and bonus tokens are both
covered) is compared with the exact one by a chi-square test, bins of expected count below 5
pooled together. A sequence the target cannot produce that shows up fails the case outright.
"""

from quickdraft.conformance.cases import (
    CONSTRAINED_REGEX,
    CONSTRAINED_SCHEMA,
    EAGLE_ROWS,
    EAGLE_SHORTLIST_ROWS,
    JSON_ALPHABET,
    LOOKAHEAD_ROWS,
    MIN_SAMPLES,
    SHORTLIST_ROWS,
    SUFFIX_ROWS,
    TREE_ROWS,
    Case,
    CaseResult,
    full_cases,
    quick_cases,
)
from quickdraft.conformance.run import run_case
from quickdraft.conformance.stats import chi_square, exact_distribution

__all__ = [
    "CONSTRAINED_REGEX",
    "CONSTRAINED_SCHEMA",
    "EAGLE_ROWS",
    "EAGLE_SHORTLIST_ROWS",
    "JSON_ALPHABET",
    "LOOKAHEAD_ROWS",
    "MIN_SAMPLES",
    "SHORTLIST_ROWS",
    "SUFFIX_ROWS",
    "TREE_ROWS",
    "Case",
    "CaseResult",
    "chi_square",
    "exact_distribution",
    "full_cases",
    "quick_cases",
    "run_case",
]
