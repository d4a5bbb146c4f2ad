"""Constraints: compiled once, checked by name, and matched along draft paths with rollback."""

import json

import pytest

from quickdraft.constraints import Constraint, Grammars

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def grammars(smollm2):
    target, tokenizer = smollm2
    return Grammars(tokenizer, target.vocab_size), tokenizer


def _texts(tokenizer, mask) -> set[str]:
    return {tokenizer.hf.decode([i]) for i in mask.nonzero().flatten().tolist()}


def test_a_schema_allows_exactly_its_objects_and_paths_roll_back(grammars):
    grammars, tokenizer = grammars
    matcher = grammars.matcher(Constraint.json_schema(json.dumps(PERSON)))
    assert _texts(tokenizer, matcher.allowed()) <= {"{", '{"', " {", "{\n"}
    ids = tokenizer.hf.encode('{"name": "Ann", "age": 3}')
    masks = matcher.path_masks(ids)
    assert all(bool(masks[i, token]) for i, token in enumerate(ids))  # every token allowed
    assert masks.shape == (len(ids) + 1, grammars.vocab_size)
    assert bool(masks[1:].any(1).all())
    before = matcher.allowed()
    assert matcher.path_masks(tokenizer.hf.encode('{"nome"')).sum(1).tolist()[-1] == 0
    assert bool((matcher.allowed() == before).all())  # rolled back to where it began
    assert matcher.advance(ids[:-1]) == len(ids) - 1 and not matcher.done
    assert matcher.advance(ids[-1:]) == 1 and matcher.done  # the object is complete
    eos = tokenizer.hf.eos_token_id
    assert matcher.allowed().nonzero().flatten().tolist() == [eos]


def test_regex_choice_and_grammar_allow_only_their_strings(grammars):
    grammars, tokenizer = grammars
    digits = grammars.matcher(Constraint.regex("[0-9]{3}"))
    assert _texts(tokenizer, digits.allowed()) == {str(d) for d in range(10)}
    choice = grammars.matcher(Constraint.choice(["yes", "no"]))
    assert _texts(tokenizer, choice.allowed()) <= {"y", "ye", "yes", "n", "no"}
    lark = grammars.matcher(Constraint.lark('start: "A" "B"'))
    assert lark.advance(tokenizer.hf.encode("A")) == 1
    assert lark.forced() == tokenizer.hf.encode("B")  # the only continuation: free to draft
    gbnf = grammars.matcher(Constraint("grammar", 'root ::= "ok"'))
    assert bool(gbnf.allowed()[tokenizer.hf.encode("ok")[0]])


@pytest.mark.parametrize(
    ("kind", "value", "message"),
    [
        ("json_schema", "{not json", "json_schema: not valid JSON"),
        ("json_schema", ["a list"], "json_schema: must be a JSON object"),
        ("json_schema", {"type": "objectx"}, "json_schema: "),
        ("regex", "[0-9", "regex: "),
        ("choice", [], "choice: must be a non-empty list"),
        ("choice", ["a", ""], "choice: every option"),
        ("grammar", "start: undefined_rule", "grammar: "),
        ("xml", "x", "constraint: kind must be one of"),
    ],
)
def test_bad_constraints_are_one_line_naming_the_field(kind, value, message):
    with pytest.raises(ValueError, match=message) as error:
        Constraint(kind, value)
    assert "\n" not in str(error.value)


def test_equal_constraints_are_equal_and_keep_their_key_order():
    first = Constraint.json_schema(PERSON)
    assert first == Constraint.json_schema(json.dumps(PERSON)) and hash(first) == hash(
        Constraint.json_schema(dict(PERSON))
    )
    assert list(json.loads(first.value)["properties"]) == ["name", "age"]


def test_constrained_speculation_is_token_identical_and_valid(smollm2):
    from quickdraft import Engine, SamplingParams, generate
    from quickdraft.bench.labels import parse_label
    from quickdraft.drafters.draft_model.drafter import DraftModelDrafter
    from quickdraft.drafters.registry import build_drafter

    target, tokenizer = smollm2
    prompt = tokenizer.apply_chat("Extract the person as JSON: Maria Lopez is 34, from Lima.")
    sampling = SamplingParams(temperature=0, max_new_tokens=40, json_schema=PERSON)
    plain = generate(target, prompt, sampling=sampling, tokenizer=tokenizer)
    data = json.loads(plain.text)
    assert set(data) == {"name", "age"} and isinstance(data["age"], int)
    drafters = [
        build_drafter(parse_label(label)[1], target, target_name="smollm2-135m")
        for label in ("ngram", "suffix", "eagle+suffix", "lookahead")
    ]
    drafters.append(DraftModelDrafter(target.truncated(2), 3))
    for drafter in drafters:
        out = generate(target, prompt, sampling=sampling, draft=drafter, tokenizer=tokenizer)
        assert out.token_ids == plain.token_ids, type(drafter).__name__
    with pytest.raises(ValueError, match="needs the engine's tokenizer"):
        Engine(target).add_request([1, 2, 3], sampling)
    with pytest.raises(ValueError, match="set one constraint"):
        SamplingParams(regex="a", choice=["a"])


def test_no_draft_node_the_grammar_forbids_reaches_the_verify(smollm2):
    """Point-mass drafts lose their forbidden nodes before the verify; a draft model samples
    from its distribution masked along its chain. Checked on every step's draft."""
    from quickdraft import Engine, SamplingParams
    from quickdraft.bench.labels import parse_label
    from quickdraft.drafters.draft_model.drafter import DraftModelDrafter
    from quickdraft.drafters.registry import build_drafter
    from quickdraft.engine.constrain import reachable

    target, tokenizer = smollm2
    prompt = tokenizer.apply_chat("Extract the person as JSON: Ken Sato is 51, from Osaka.")
    sampling = SamplingParams(
        temperature=0.7, seed=3, max_new_tokens=24, json_schema=PERSON, draft_steps=True
    )
    grammars = Grammars(tokenizer, target.vocab_size)
    drafters = [
        build_drafter(parse_label(label)[1], target, target_name="smollm2-135m")
        for label in ("eagle",)  # a point-mass tree, pruned as every point-mass draft is
    ]
    drafters.append(DraftModelDrafter(target.truncated(2), 4))
    for drafter in drafters:
        engine = Engine(target, drafter, tokenizer=tokenizer, disable_by_batch_size=None)
        engine.add_request(prompt, sampling)
        steps = []
        while engine.has_unfinished():
            for out in engine.step():
                steps += out.new_steps or []
        matcher, drafted = grammars.matcher(sampling.constraint), 0
        for step in steps:
            # What follows an end token is never used (the request stops): not checked.
            ends = [i for i, t in enumerate(step.draft) if t in tokenizer.eos_token_ids]
            cut = ends[0] + 1 if ends else None
            nodes = reachable(matcher, list(step.draft), list(step.parents))
            assert all(nodes[:cut]), step
            drafted += len(step.draft)
            emitted = [step.draft[i] for i in step.accepted] + [step.token]
            matcher.advance(emitted[: step.emitted])
        assert drafted > 0, type(drafter).__name__


def test_a_constrained_sampling_chain_keeps_the_masked_distribution():
    """A conformance row under a regex on fewer samples (``make test-slow`` runs every method
    at 50,000): drafts sampled from an unmasked draft model, the masked target's joint."""
    from quickdraft.config import AcceptRule
    from quickdraft.conformance import CONSTRAINED_REGEX, Case, run_case

    case = Case(AcceptRule.REJECTION_SAMPLING, 0.8, 0, 0.9, 3, regex=CONSTRAINED_REGEX)
    result = run_case(case, samples=8_000, seed=1)
    assert result.p_value >= 1e-3, result
    assert result.mean_accepted_length > 1.3


def test_a_sampling_tree_under_a_json_schema_keeps_the_masked_distribution():
    """The same under a small JSON Schema over the toys' tokens read as JSON characters: a
    sampled tree, the forced ``{`` drafted for free."""
    from quickdraft.config import AcceptRule
    from quickdraft.conformance import CONSTRAINED_SCHEMA, TREE_ROWS, Case, run_case

    case = Case(AcceptRule.REJECTION_SAMPLING, 0.8, 0, 0.9, 3, tree=TREE_ROWS[0],
                schema=CONSTRAINED_SCHEMA)  # fmt: skip
    result = run_case(case, samples=8_000, seed=1)
    assert result.p_value >= 1e-3, result
    assert result.mean_accepted_length > 1.3


def test_an_engine_keeps_its_most_recent_compiled_constraints(monkeypatch):
    from quickdraft.engine import constrain
    from quickdraft.models.toy import ToyTokenizer

    monkeypatch.setattr(constrain, "MAX_COMPILED", 2)
    kept = constrain.Constraints(ToyTokenizer(8), 8)
    first, second, third = (Constraint.regex(text) for text in ("a+", "b+", "c+"))
    for constraint in (first, second, first, third):
        kept.matcher(constraint)
    assert list(kept.compiled) == [first, third]  # the least recently used left


def test_a_request_whose_grammar_fails_ends_alone_with_an_error():
    """llguidance leaves a matcher in an error state (on a grammar past its per-step limits)
    instead of raising; its row would be all -inf, NaN under a temperature, which stopped the
    whole engine. That request now ends with finish reason "error" and no token of the step;
    the request beside it goes on exactly as alone."""
    from quickdraft import Engine, SamplingParams, SpecConfig, generate
    from quickdraft.models.toy import NGramLM, ToyTokenizer

    target, tokenizer = NGramLM.random(8, order=3, seed=4, sharpness=2.0), ToyTokenizer(8)
    free = SamplingParams(temperature=0.8, seed=7, max_new_tokens=16)
    spec = SpecConfig(num_speculative_tokens=3, disable_by_batch_size=None)
    alone = generate(target, [1, 2, 3], sampling=free, spec=spec, draft=target.perturbed(0.3),
                     tokenizer=tokenizer).token_ids  # fmt: skip
    engine = Engine.from_spec(target, spec, target.perturbed(0.3), tokenizer=tokenizer)
    constrained = SamplingParams(temperature=0.8, seed=3, max_new_tokens=16, regex="[abc]+")
    broken = engine.add_request([1, 2, 3], constrained)
    other = engine.add_request([1, 2, 3], free)
    outputs: dict[str, object] = {}
    kept = None
    while engine.has_unfinished():
        for out in engine.step():
            outputs[out.request_id] = out
        request = engine.requests.get(broken)
        if kept is None and request is not None and request.output:
            kept = list(request.output)
            assert not request.matcher.inner.consume_token(5)  # "f": refused, now in error
            assert request.matcher.error is not None
    assert outputs[broken].finish_reason == "error"
    assert list(outputs[broken].token_ids) == kept  # the failed step's tokens dropped
    assert list(outputs[other].token_ids) == alone
