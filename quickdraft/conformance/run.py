"""Running a conformance case: its toys and drafter, the engine (one batch of ``samples``
rows, or a server's random arrivals), and the test of what it sampled."""

from __future__ import annotations

import dataclasses
import random
import time

import torch

from quickdraft.accept import ACCEPT_RULES, TREE_RULES, AcceptFn, TreeAcceptFn
from quickdraft.config import SamplingParams
from quickdraft.conformance.cases import (
    ALWAYS_DRAFT,
    MIN_SAMPLES,
    PROMPT,
    SERVING_ROWS,
    Case,
    CaseResult,
)
from quickdraft.conformance.stats import chi_square, exact_distribution
from quickdraft.drafters.base import Drafter
from quickdraft.drafters.draft_model.drafter import DraftModelDrafter
from quickdraft.engine import Engine, RequestOutput
from quickdraft.models.base import Model
from quickdraft.models.toy import HeadedNGramLM
from quickdraft.toys import (
    TOY_VOCAB,
    NGramTreeDrafter,
    lookahead_row,
    toy_eagle,
    toy_llama,
    toy_pair,
    toy_shortlist,
    toy_tree,
)


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
    target, drafter = _case_models(case, seed, device, drafter)
    rules = (accept_fn or ACCEPT_RULES[case.rule], tree_accept_fn or TREE_RULES[case.rule])
    if case.serving:
        groups, mean_accepted = _serve(case, target, drafter, rules, samples, seed)
    else:
        engine = _engine(case, target, drafter, rules, samples, seed)
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


def _case_models(
    case: Case, seed: int, device: str, drafter: Drafter | None
) -> tuple[Model, Drafter]:
    """The case's toy target and its drafter (``drafter`` where the caller gave one)."""
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
    return target, drafter


def _engine(
    case: Case,
    target: Model,
    drafter: Drafter,
    rules: tuple[AcceptFn, TreeAcceptFn],
    rows: int,
    seed: int,
) -> Engine:
    """The engine a case runs on: it drafts every step (``ALWAYS_DRAFT``), ``rows`` at once."""
    return Engine(
        target,
        drafter,
        **ALWAYS_DRAFT,
        rules=rules,
        adaptive_k=case.adaptive,
        tokenizer=case.tokenizer,
        max_batch=rows,
        max_model_len=16,
        seed=seed,
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
    engine = _engine(case, target, drafter, rules, SERVING_ROWS, seed)
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
