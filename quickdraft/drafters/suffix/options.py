"""``SuffixOptions``: the method's settings, checked where they are made."""

from __future__ import annotations

from dataclasses import dataclass

from quickdraft.config import MethodOptions, check_flag, check_range

MAX_DEPTH = 64


@dataclass(frozen=True, slots=True)
class SuffixOptions(MethodOptions):
    """suffix_max_depth: the longest substring counted (the match is at most one less);
    suffix_spec_factor: draft nodes per matched token (the paper's ``max_spec_factor``);
    suffix_min_prob: the least probability a drafted node may have (``min_token_prob``);
    suffix_cache_tokens: the global trie's cap in output tokens, oldest requests out first.
    suffix_cross_tenant: one global trie for every tenant (``SamplingParams.tenant``: a
        server's API keys) rather than one per tenant, so that one client's drafts may come
        from another's outputs. Off by default: a client could tell from its drafts' speed what
        another wrote. Requests without a tenant share one trie either way.
    ``num_speculative_tokens`` caps the nodes a step drafts."""

    suffix_max_depth: int = 24
    suffix_spec_factor: float = 1.0
    suffix_min_prob: float = 0.1
    suffix_cache_tokens: int = 1_000_000
    suffix_cross_tenant: bool = False

    def __post_init__(self) -> None:
        check_range("suffix_max_depth", self.suffix_max_depth, 2, MAX_DEPTH, integer=True)
        check_range("suffix_spec_factor", self.suffix_spec_factor, 0.1, 64.0)
        check_range("suffix_min_prob", self.suffix_min_prob, 0.0, 1.0)
        check_range("suffix_cache_tokens", self.suffix_cache_tokens, 0, 10**9, integer=True)
        check_flag("suffix_cross_tenant", self.suffix_cross_tenant)
