"""Suffix decoding (Oliaro et al., SuffixDecoding, NeurIPS 2025): drafts from what the text
and earlier requests' outputs continued with, no model at all.

Two count tries of every substring up to ``max_depth`` tokens long:

* a request's own (its prompt and its output so far), made when it joins and extended as it
  decodes;
* a global one over the outputs of every request of this engine, running ones included, so
  a later request (the next turn of an agentic loop, the same query pattern) drafts from what
  earlier ones wrote. Its size is capped in tokens (``cache_tokens``): the oldest requests'
  outputs are taken out first; an aborted request's partial output leaves it at once. It is
  one per tenant (``SamplingParams.tenant``: a server's API key), so that no client drafts
  from another's outputs, unless ``suffix_cross_tenant`` makes it one for all.

Each step, for each trie, the longest suffix of the row's text that occurred before with a
continuation is found (up to ``max_depth - 1`` tokens); from there the trie's most frequent
continuations grow a tree best-first, a node's probability being its count over its
siblings' times its parent's. Nodes below ``min_prob`` are not drafted, and a match of m
tokens drafts at most ``spec_factor * m`` nodes (never more than k): a short match is
weak evidence. Of the two tries' trees the one with the larger expected accepted length (the
sum of its nodes' probabilities) is drafted. The drafts are deterministic, point masses, so
the tree rules accept them exactly at any temperature.

A batch of several rows drafts each row's most probable chain (grown with the whole budget,
padded by repeating its last token), since rows share one tree shape in a verify pass; a lone
request drafts its whole tree. The match leaves k tokens of the trie's depth below it, so a
long repetition still drafts k deep.

trie.py (the count tries and the trees and chains they grow), options.py (``SuffixOptions``),
drafter.py (the drafter and its builder).
"""
