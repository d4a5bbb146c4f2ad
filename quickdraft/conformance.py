"""Statistical proof of exactness: does speculative decoding sample the target's distribution?

For each case, a toy target with an exactly computable distribution and a perturbed draft of it
generate k+1 tokens from one prompt, ``samples`` times in one batch, through the real engine.
The empirical joint distribution of those k+1 tokens (so corrected and bonus tokens are both
covered) is compared with the exact one by a chi-square test, bins of expected count below 5
pooled together. A sequence the target cannot produce that shows up fails the case outright.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import random
import time
from dataclasses import dataclass

import torch
from scipy import stats as scipy_stats

from quickdraft.accept import ACCEPT_RULES, TREE_RULES, AcceptFn, TreeAcceptFn
from quickdraft.config import LOSSLESS_RULES, AcceptRule, SamplingParams
from quickdraft.constraints import Grammars
from quickdraft.drafters.base import Drafter
from quickdraft.drafters.draft_model.drafter import DraftModelDrafter
from quickdraft.engine import Engine, RequestOutput
from quickdraft.engine.constrain import node_masks
from quickdraft.models.base import Model
from quickdraft.models.toy import HeadedNGramLM, ToyTokenizer
from quickdraft.sampling import probs_from_logits
from quickdraft.toys import (
    TOY_VOCAB,
    NGramTreeDrafter,
    eagle_row,
    lookahead_row,
    toy_eagle,
    toy_llama,
    toy_pair,
    toy_shortlist,
    toy_tree,
)

# The prompt of every case (toy models and drafters: ``quickdraft.toys``).
PROMPT = (3, 1)
MIN_EXPECTED = 5.0
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


def exact_distribution(
    model: Model,
    prompt: tuple[int, ...],
    params: SamplingParams,
    length: int,
    tokenizer: ToyTokenizer | None = None,
) -> torch.Tensor:
    """P(first ``length`` tokens) for every sequence: [V^length], index base V, first token
    most significant. Computed with the same ``probs_from_logits`` the engine samples with;
    under a constraint, after the logits are masked to what the grammar allows after each
    sequence (``tokenizer``'s characters; the toy letters by default)."""
    vocab = model.vocab_size
    sequences = torch.tensor([prompt], dtype=torch.long)
    joint = torch.ones(1, dtype=torch.float64)
    matcher = None
    if params.constraint is not None:
        reader = tokenizer or ToyTokenizer(TOY_VOCAB)
        matcher = Grammars(reader, vocab).matcher(params.constraint)
    for _ in range(length):
        rows, width = sequences.shape
        cache = model.new_cache(rows, width)
        positions = torch.arange(width).expand(rows, -1)
        device = model.device
        logits = model.forward(sequences.to(device), positions.to(device), cache).logits[:, -1]
        if matcher is not None:
            outputs = sequences[:, len(prompt) :].tolist()
            allowed = torch.stack([node_masks(matcher, row, list(range(-1, len(row) - 1)))[-1]
                                   for row in outputs])  # fmt: skip
            logits = logits.masked_fill(~allowed.to(logits.device), float("-inf"))
        step = probs_from_logits(logits, params).double().cpu()  # [rows, V]
        joint = (joint.unsqueeze(1) * step).reshape(-1)
        sequences = torch.cat(
            [sequences.repeat_interleave(vocab, 0), torch.arange(vocab).repeat(rows).unsqueeze(1)],
            dim=1,
        )
    return joint


def chi_square(observed: torch.Tensor, probs: torch.Tensor) -> tuple[float, float, int]:
    """(p-value, total variation, bins used) of observed counts [M] against probs [M]."""
    samples = int(observed.sum())
    observed, probs = observed.double(), probs.double()
    total_variation = 0.5 * float((observed / samples - probs).abs().sum())
    if bool((observed[probs <= 0] > 0).any()):
        return 0.0, total_variation, int(observed.numel())  # an impossible sequence appeared
    expected = probs * samples
    possible = probs > 0
    observed, expected = observed[possible], expected[possible]
    order = torch.argsort(expected)
    observed, expected = observed[order], expected[order]
    small = int((expected < MIN_EXPECTED).sum())
    if small:
        # Pool the small bins into one; if even that is too small, add the next bin to it.
        pooled = max(small, 2)
        while pooled < expected.numel() and float(expected[:pooled].sum()) < MIN_EXPECTED:
            pooled += 1
        observed = torch.cat([observed[:pooled].sum().view(1), observed[pooled:]])
        expected = torch.cat([expected[:pooled].sum().view(1), expected[pooled:]])
    if expected.numel() < 2:
        return 1.0, total_variation, int(expected.numel())
    statistic = float(((observed - expected) ** 2 / expected).sum())
    p_value = float(scipy_stats.chi2.sf(statistic, df=expected.numel() - 1))
    return p_value, total_variation, int(expected.numel())


def run_case(
    case: Case,
    *,
    samples: int = 50_000,
    seed: int = 0,
    drafter: Drafter | None = None,
    accept_fn: AcceptFn | None = None,
    tree_accept_fn: TreeAcceptFn | None = None,
    device: str = "cpu",
) -> CaseResult:
    """Sample ``samples`` continuations of k+1 tokens and test them against the exact joint.

    drafter and accept_fn default to the draft-model drafter and the case's rule; the tests pass
    deliberately broken ones to check that the test has the power to catch them. device: where
    the EAGLE rows' tiny Llama runs (the n-gram toys are the host's).
    """
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < MIN_SAMPLES:
        raise ValueError(
            f"samples must be an integer of at least {MIN_SAMPLES} (a serving row tests two "
            f"sampling settings, each on its share), got {samples!r}"
        )
    start = time.perf_counter()
    target, draft = toy_pair(seed)
    if case.tree.startswith("eagle"):
        target = toy_llama(seed, device, int8=case.target == "int8")
        drafter = drafter or toy_eagle(target, case.tree, seed, case.shortlist)
    if case.tree.startswith("lookahead") and drafter is None:
        from quickdraft.drafters.lookahead import LookaheadDrafter

        drafter = LookaheadDrafter(TOY_VOCAB, lookahead_row(case.tree, seed))
    if case.tree.startswith("suffix") and drafter is None:
        from quickdraft.drafters.suffix.drafter import SuffixDrafter
        from quickdraft.drafters.suffix.options import SuffixOptions

        options = SuffixOptions(suffix_max_depth=8, suffix_spec_factor=4.0, suffix_min_prob=0.0)
        drafter = SuffixDrafter(TOY_VOCAB, case.k, options)
    if drafter is None and case.tree:
        shape = toy_tree(case.tree)
        drafter = NGramTreeDrafter(draft, shape, sampled=case.tree.startswith("sample"))
    if drafter is None:
        shortlist = toy_shortlist(case.shortlist, case.k, seed)
        if shortlist is not None:
            draft = HeadedNGramLM.from_ngram(draft)
        drafter = DraftModelDrafter(draft, case.k, shortlist=shortlist)
    if drafter.needs.depth != case.k:
        raise ValueError(
            f"drafter: drafts {drafter.needs.depth} positions deep, the case needs {case.k}"
        )
    rules = (accept_fn or ACCEPT_RULES[case.rule], tree_accept_fn or TREE_RULES[case.rule])
    if case.serving:
        groups, mean_accepted = _serve(case, target, drafter, rules, samples, seed)
    else:
        engine = Engine(
            target,
            drafter,
            **ALWAYS_DRAFT,
            rules=rules,
            adaptive_k=case.adaptive,
            tokenizer=case.tokenizer,
            max_batch=samples,
            max_model_len=16,
            seed=seed,
        )
        sampling = dataclasses.replace(case.sampling, seed=None)
        for _ in range(samples):
            engine.add_request(PROMPT, sampling)
        outputs = _drain(engine)
        groups = [(case.sampling, [out.token_ids for out in outputs])]
        mean_accepted = engine.stats.mean_accepted_length
    tests = []
    for sampling, rows in groups:
        sequences = torch.tensor(rows, dtype=torch.long)  # [samples, k+1]
        index = (sequences * TOY_VOCAB ** torch.arange(case.k, -1, -1)).sum(1)
        observed = torch.bincount(index, minlength=TOY_VOCAB ** (case.k + 1))
        probs = exact_distribution(target, PROMPT, sampling, case.k + 1, case.tokenizer)
        tests.append(chi_square(observed, probs))
    # Several groups: the smallest p-value, Bonferroni-corrected; the largest distance.
    p_value = min(1.0, min(t[0] for t in tests) * len(tests))
    return CaseResult(
        case,
        p_value,
        max(t[1] for t in tests),
        sum(t[2] for t in tests),
        samples,
        mean_accepted,
        time.perf_counter() - start,
    )


def _drain(engine: Engine) -> list[RequestOutput]:
    """Step until every request finished; their final outputs in the order added."""
    finished: dict[str, RequestOutput] = {}
    while engine.has_unfinished():
        finished.update((out.request_id, out) for out in engine.step() if out.finished)
    return [finished[key] for key in sorted(finished, key=int)]


def _serve(
    case: Case,
    target: Model,
    drafter: Drafter,
    rules: tuple[AcceptFn, TreeAcceptFn],
    samples: int,
    seed: int,
) -> tuple[list[tuple[SamplingParams, list[list[int]]]], float]:
    """The case as a server sees it: requests arrive in random bursts between steps into
    a table of fewer rows than requests (so they also wait, and join as others leave), with
    prompts of three lengths ending alike (the n-gram toy then has one distribution for
    them) and two sampling settings, the case's and plain sampling, tested separately."""
    engine = Engine(
        target,
        drafter,
        **ALWAYS_DRAFT,
        rules=rules,
        adaptive_k=case.adaptive,
        tokenizer=case.tokenizer,
        max_batch=SERVING_ROWS,
        max_model_len=16,
        seed=seed,
    )
    settings = [
        case.sampling,
        dataclasses.replace(case.sampling, temperature=1.0, top_k=0, top_p=1.0),
    ]
    prompts = [PROMPT, (5, *PROMPT), (0, 6, 2, *PROMPT)]
    chooser = random.Random(seed)
    # Each setting gets half the requests, in a shuffled order: a random choice per request
    # could leave one setting without rows when the samples are few.
    order = [index % len(settings) for index in range(samples)]
    chooser.shuffle(order)
    setting_of: dict[str, int] = {}
    outputs: dict[str, RequestOutput] = {}
    while len(setting_of) < samples or engine.has_unfinished():
        burst = min(chooser.randint(0, 2 * SERVING_ROWS // 3), samples - len(setting_of))
        for _ in range(burst):
            which = order[len(setting_of)]
            rid = engine.add_request(chooser.choice(prompts), settings[which])
            setting_of[rid] = which
        outputs.update((o.request_id, o) for o in engine.step() if o.finished)
    groups = [
        (sampling, [o.token_ids for rid, o in outputs.items() if setting_of[rid] == which])
        for which, sampling in enumerate(settings)
    ]
    return groups, engine.stats.mean_accepted_length
