"""The conformance grid: each case a rule, sampling settings and a kind of drafter on the toys
(``quickdraft.toys``), and the rows that name them."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass

from quickdraft.config import LOSSLESS_RULES, AcceptRule, SamplingParams
from quickdraft.models.toy import ToyTokenizer
from quickdraft.toys import TOY_VOCAB, eagle_row, lookahead_row, toy_tree

# The prompt of every case (toy models and drafters: ``quickdraft.toys``).
PROMPT = (3, 1)
# Shortlist rows: sizes that often leave the target's likely tokens out of the draft's support.
SHORTLIST_ROWS = ("fr:3", "fr-pa:6", "dyna:2", "dyna-pa:3", "dyna-hybrid-pa:3")
# Tree rows: siblings sampled without replacement from the draft (2 + 4 + 4 nodes, depth 3), and
# a Medusa-style tree of deterministic top-ranked candidates (point masses, 7 nodes, depth 3).
TREE_ROWS = ("sample:2,2,1", "top:0|1|2|0.0|0.1|1.0|0.0.0")
# EAGLE rows: a tiny random Llama target over the same 8 tokens and an untrained EAGLE-3
# drafter on its features, growing a dynamic tree (depth 3, top-3, 6 nodes) from a draft
# vocabulary of 6 of the 8 tokens. Its shape changes from step to step with the drafts. The
# second row keeps only nodes of path probability >= 0.1 and grafts up to 3 tokens of prompt
# lookup onto each tree (frequent over 8 tokens), merged into the tree's own nodes.
EAGLE_ROWS = ("eagle:3,3,6", "eagle:3,3,6,0.1+3")
# EAGLE with each shortlist kind: the head scores the shortlist's rows of all 8 tokens (the
# toy network's own draft vocabulary is 6), FR-Spec lists or DynaSpec clusters per depth.
EAGLE_SHORTLIST_ROWS = ("fr:4", "fr-pa:6", "dyna:2", "dyna-pa:2")
# Lookahead rows: the toy target itself runs the Jacobi window (W 2, 3 levels) beside up to 2
# pool candidates of 3 tokens (N 4); pool and window change with every step.
LOOKAHEAD_ROWS = ("lookahead:2,4,2",)
# Constrained rows: the toys' tokens as the letters a..h (``models.toy.ToyTokenizer``) under a
# regex that allows 3 of them first and 6 after: the target's logits are masked at every
# verify position, and the exact joint is the masked target's.
CONSTRAINED_REGEX = "[abc][a-f]{3,}"
# And under a small JSON Schema (an object of integers, compact), the toys' tokens read as
# JSON's characters: ``{`` is forced first (drafted for free), then ``}`` or a key's quote,
# then the key's characters (any of the 8, the last one the end token llguidance knows).
JSON_ALPHABET = '{}":ab1.'
CONSTRAINED_SCHEMA = (
    '{"type": "object", "additionalProperties": {"type": "integer"}, '
    '"x-guidance": {"whitespace_flexible": false}}'
)
# Suffix decoding rows: chains of up to 3 tokens from the tries of each row's text and of
# every row's output so far (50,000 rows share the global one, so a draft depends on what
# the other rows sampled); any match drafts (factor 4, no probability floor).
SUFFIX_ROWS = ("suffix",)
SUFFIX_K = 3
MIN_SAMPLES = 2
# Serving rows: the engine's table holds this many rows, far fewer than the samples, so
# requests wait, join at every step as others leave, and arrive in random bursts.
SERVING_ROWS = 1024
# Every step drafts, however many rows run (the batch policy would verify none at 50,000).
ALWAYS_DRAFT = {"disable_by_batch_size": None}


@dataclass(frozen=True, slots=True)
class Case:
    rule: AcceptRule
    temperature: float
    top_k: int
    top_p: float
    k: int
    shortlist: str = "full"
    tree: str = ""  # "" for a chain of k, else a ``toy_tree`` spec; k is then its depth
    serving: bool = False  # requests join at random steps, ragged prompts, mixed sampling
    # The EAGLE rows' Llama target: "float", or "int8" weights (``models.int8``): speculation
    # must sample the quantized target's own distribution, which is the exact one here.
    target: str = "float"
    adaptive: bool = False  # k chosen per step by goodput (``SpecConfig.adaptive_k``)
    # A constraint on the output, a regex or a JSON Schema's text (the engine then has the
    # toy tokenizer: letters for a regex, ``JSON_ALPHABET`` for a schema).
    regex: str = ""
    schema: str = ""

    @property
    def constrained(self) -> bool:
        return bool(self.regex or self.schema)

    @property
    def tokenizer(self) -> ToyTokenizer | None:
        if not self.constrained:
            return None
        return ToyTokenizer(TOY_VOCAB, JSON_ALPHABET if self.schema else None)

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            max_new_tokens=self.k + 1,
            regex=self.regex or None,
            json_schema=json.loads(self.schema) if self.schema else None,
        )


@dataclass(frozen=True, slots=True)
class CaseResult:
    case: Case
    p_value: float
    total_variation: float
    bins: int
    samples: int
    mean_accepted_length: float
    seconds: float


def quick_cases() -> list[Case]:
    """The default proof, a minute or two on 2 cores: every lossless rule with every kind of
    drafter (chain draft model, each shortlist family, sampled and top-ranked trees, EAGLE's
    dynamic tree with floor and grafted lookup, with a DynaSpec shortlist and on an int8
    target, lookahead, suffix decoding),
    plain and with temperature, top-k and top-p together. ``full_cases`` adds the whole
    sampling grid and every variant (92 rows): the EAGLE rows cost most (a 50,000-row batch
    through a Llama and its drafter, 30-50 s each on 2 shared cores)."""
    plain, shaped = (1.0, 0, 1.0), (0.6, 5, 0.9)
    cases = []
    for rule in LOSSLESS_RULES:
        cases.append(Case(rule, *plain, 4))
        cases.append(Case(rule, *shaped, 1))
        cases += [Case(rule, *shaped, 4, s) for s in ("fr-pa:6", "dyna-pa:3")]
        cases += [Case(rule, *shaped, toy_tree(t).max_depth, tree=t) for t in TREE_ROWS]
        cases.append(Case(rule, *plain, 3, tree=EAGLE_ROWS[-1]))
        cases.append(Case(rule, *shaped, 3, "dyna-pa:2", tree=EAGLE_ROWS[0]))
        cases.append(Case(rule, *shaped, 3, tree=EAGLE_ROWS[0], target="int8"))
        cases.append(Case(rule, *shaped, 3, tree=LOOKAHEAD_ROWS[0]))
        cases.append(Case(rule, *shaped, SUFFIX_K, tree=SUFFIX_ROWS[0]))
        cases.append(Case(rule, *shaped, 4, serving=True))
    cases.append(Case(LOSSLESS_RULES[0], *shaped, 3, tree=TREE_ROWS[0], serving=True))
    cases.append(Case(LOSSLESS_RULES[0], *shaped, 4, serving=True, adaptive=True))
    return cases


def full_cases() -> list[Case]:
    """Every lossless rule over temperature x top-k x top-p x k, then every rule with each
    kind of drafter vocabulary shortlist, then every rule with sampled and top-ranked trees,
    EAGLE trees, lookahead and suffix decoding."""
    grid = itertools.product(LOSSLESS_RULES, (0.6, 1.0), (0, 5), (1.0, 0.9), (1, 4))
    cases = [Case(rule, t, top_k, top_p, k) for rule, t, top_k, top_p, k in grid]
    shortlisted = itertools.product(LOSSLESS_RULES, SHORTLIST_ROWS, ((1.0, 0, 1.0), (0.6, 5, 0.9)))
    cases += [Case(r, t, top_k, top_p, 4, s) for r, s, (t, top_k, top_p) in shortlisted]
    trees = itertools.product(LOSSLESS_RULES, TREE_ROWS, ((1.0, 0, 1.0), (0.6, 5, 0.9)))
    for rule, tree, (t, top_k, top_p) in trees:
        cases.append(Case(rule, t, top_k, top_p, toy_tree(tree).max_depth, tree=tree))
    eagle = itertools.product(LOSSLESS_RULES, EAGLE_ROWS, ((1.0, 0, 1.0), (0.6, 5, 0.9)))
    for rule, tree, (t, top_k, top_p) in eagle:
        cases.append(Case(rule, t, top_k, top_p, eagle_row(tree)[0].depth, tree=tree))
    for rule, shortlist in itertools.product(LOSSLESS_RULES, EAGLE_SHORTLIST_ROWS):
        cases.append(Case(rule, 0.6, 5, 0.9, 3, shortlist, tree=EAGLE_ROWS[0]))
    for rule in LOSSLESS_RULES:  # a quantized target
        cases.append(Case(rule, 0.6, 5, 0.9, 3, tree=EAGLE_ROWS[0], target="int8"))
    lookahead = itertools.product(LOSSLESS_RULES, LOOKAHEAD_ROWS, ((1.0, 0, 1.0), (0.6, 5, 0.9)))
    for rule, tree, (t, top_k, top_p) in lookahead:
        cases.append(Case(rule, t, top_k, top_p, lookahead_row(tree).ngram - 1, tree=tree))
    suffix = itertools.product(LOSSLESS_RULES, SUFFIX_ROWS, ((1.0, 0, 1.0), (0.6, 5, 0.9)))
    for rule, tree, (t, top_k, top_p) in suffix:
        cases.append(Case(rule, t, top_k, top_p, SUFFIX_K, tree=tree))
    for rule in LOSSLESS_RULES:  # serving: a chain (k fixed and adaptive), a tree, lookahead
        cases.append(Case(rule, 0.6, 5, 0.9, 4, serving=True))
        cases.append(Case(rule, 0.6, 5, 0.9, 4, serving=True, adaptive=True))
        cases.append(Case(rule, 0.6, 5, 0.9, SUFFIX_K, tree=SUFFIX_ROWS[0], adaptive=True))
        cases.append(Case(rule, 0.6, 5, 0.9, 3, tree=TREE_ROWS[0], serving=True))
        cases.append(Case(rule, 0.6, 5, 0.9, 3, tree=LOOKAHEAD_ROWS[0], serving=True))
    # Under a constraint, every kind of draft (25-55 s a row: the grammar's masks are
    # computed row by row, 50,000 rows a step).
    constrained = ["", *TREE_ROWS, SUFFIX_ROWS[0], LOOKAHEAD_ROWS[0], EAGLE_ROWS[0]]
    for rule, tree in itertools.product(LOSSLESS_RULES, constrained):
        cases.append(Case(rule, 0.8, 0, 0.9, 3, tree=tree, regex=CONSTRAINED_REGEX))
        cases.append(Case(rule, 0.8, 0, 0.9, 3, tree=tree, schema=CONSTRAINED_SCHEMA))
    return cases
