"""What one client of the server may learn of another, and what a request may make the server
do (issue 67): step traces show no rejected draft of a drafter that pools requests' text;
cached tokens and the suffix trie are per API key; constraints compile off the event loop
within bounds, are refused up front when the grammar library would fail on them, and fail as
an error when it fails mid-output; only JSON bodies; the Host header is checked."""

from __future__ import annotations

import json
import threading
import time

import openai
import pytest
from test_server import MODEL, client, raw, serving, target, tokenizer  # noqa: F401

from quickdraft import Engine, SamplingParams
from quickdraft.constraints import matcher as matcher_module
from quickdraft.drafters.ngram import NGramDrafter
from quickdraft.drafters.suffix.drafter import SuffixDrafter
from quickdraft.drafters.suffix.options import SuffixOptions
from quickdraft.server.guard import HostRules

ALWAYS = {"disable_by_batch_size": None}
REGEX = {"type": "regex"}


def _completion(url: str, body: dict, key: str | None = None) -> tuple[int, dict]:
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    return raw(url, "POST", "/v1/completions", json.dumps(body).encode(), headers)


# -- 1. step traces ------------------------------------------------------------------------


def test_traces_of_a_pooling_drafter_show_no_rejected_token(target, tokenizer):  # noqa: F811
    """Suffix decoding with one trie for every tenant drafts a client's text from another's
    output; the client's trace shows its accepted nodes (its own output) and counts, never
    a token the target rejected."""
    drafter = SuffixDrafter(target.vocab_size, 4, SuffixOptions(suffix_cross_tenant=True))
    engine = Engine(target, drafter, tokenizer=tokenizer, max_batch=2, **ALWAYS)
    prompt = "one two three one two three one two three"
    with serving(engine, tokenizer) as url:
        greedy = {"prompt": prompt, "max_tokens": 24, "temperature": 0}
        assert _completion(url, greedy)[0] == 200  # its output goes into the shared trie
        body = {
            "prompt": prompt,
            "max_tokens": 24,
            "temperature": 1.0,
            "seed": 3,
            "return_token_ids": True,
            "quickdraft": {"steps": True},
        }
        status, second = _completion(url, body)
    assert status == 200
    choice = second["choices"][0]
    output, position, rejected = choice["token_ids"], 0, 0
    for step in choice["quickdraft"]["steps"]:
        accepted = set(step["accepted"])
        for index, node in enumerate(step["draft"]):
            if index in accepted:  # the client's own output, where the output kept it
                at = position + step["accepted"].index(index)
                assert at >= len(output) or node["id"] == output[at]
            else:
                rejected += 1
                assert node["id"] is None and node["text"] is None and node["bytes"] is None
            assert isinstance(node["parent"], int)
        position += step["emitted"]
    assert rejected > 0  # the redaction was exercised


def test_traces_of_a_drafter_of_the_requests_own_text_show_its_rejections(
    target,  # noqa: F811
    tokenizer,  # noqa: F811
):
    engine = Engine(target, NGramDrafter(target.vocab_size, 4), tokenizer=tokenizer, **ALWAYS)
    body = {
        "prompt": "a b c a b c a b c a b d a b",
        "max_tokens": 24,
        "temperature": 1.0,
        "seed": 1,
        "quickdraft": {"steps": True},
    }
    with serving(engine, tokenizer) as url:
        status, reply = _completion(url, body)
    assert status == 200
    nodes = [n for s in reply["choices"][0]["quickdraft"]["steps"] for n in s["draft"]]
    assert nodes and all(node["id"] is not None for node in nodes)


# -- 1 and 2. tenants ----------------------------------------------------------------------


def test_each_api_key_has_its_own_suffix_trie_and_cached_tokens(target, tokenizer):  # noqa: F811
    drafter = SuffixDrafter(target.vocab_size, 4)
    engine = Engine(target, drafter, tokenizer=tokenizer, max_batch=2, **ALWAYS)
    first = [{"role": "user", "content": "List three colours."}]
    with serving(engine, tokenizer, api_keys=("alice", "bob")) as url:
        alice, bob = client(url, "alice"), client(url, "bob")
        reply = alice.chat.completions.create(
            model=MODEL, messages=first, max_tokens=12, temperature=0
        )
        turn = [
            *first,
            {"role": "assistant", "content": reply.choices[0].message.content},
            {"role": "user", "content": "And three more."},
        ]
        own = alice.chat.completions.create(
            model=MODEL, messages=turn, max_tokens=12, temperature=0
        )
        other = bob.chat.completions.create(
            model=MODEL, messages=turn, max_tokens=12, temperature=0
        )
    assert own.usage.prompt_tokens_details.cached_tokens >= len(tokenizer.apply_chat(first))
    assert other.usage.prompt_tokens_details.cached_tokens == 0  # alice's prefix: not told
    tries = list(drafter.shared.values())
    assert len(tries) == 2  # one per key: bob drafts from none of alice's outputs
    assert sorted(trie.tokens for trie in tries)[0] <= 12


def test_the_engine_counts_cached_tokens_of_another_tenant_as_not_its_own(target):  # noqa: F811
    engine = Engine(target, max_batch=1)
    prompt = list(range(5, 40))
    # After b reused a's prefix the row holds both tenants' text: nobody's own from then on
    # (else b, asking again, would learn how much of a's text it shares).
    for tenant, own in (("a", False), ("a", True), ("b", False), ("b", False), ("a", False)):
        sampling = SamplingParams(temperature=0, max_new_tokens=2, tenant=tenant)
        request_id = engine.add_request(prompt, sampling)
        stats = engine.requests[request_id].stats
        while engine.has_unfinished():
            engine.step()
        assert (stats.cached_own_tokens > 0) == own
        assert stats.cached_own_tokens in (0, stats.cached_prompt_tokens)
    with pytest.raises(ValueError, match="tenant"):
        SamplingParams(tenant="")


# -- 3. compiling constraints --------------------------------------------------------------


def test_a_constraint_over_the_size_bound_is_refused_at_once(target, tokenizer):  # noqa: F811
    engine = Engine(target, tokenizer=tokenizer, max_batch=1)
    schema = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(40)}}
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
        "response_format": {"type": "json_schema", "json_schema": {"schema": schema}},
    }
    with serving(engine, tokenizer, max_constraint_bytes=200) as url:
        start = time.monotonic()
        status, error = raw(url, "POST", "/v1/chat/completions", json.dumps(body).encode())
        took = time.monotonic() - start
    assert status == 400 and took < 5
    assert error["error"]["param"].startswith("response_format")
    assert (
        error["error"]["message"].startswith("response_format")
        and "bytes" in (error["error"]["message"])
    )


def test_a_slow_compile_is_a_400_and_health_answers_meanwhile(
    target,  # noqa: F811
    tokenizer,  # noqa: F811
    monkeypatch,
):
    engine = Engine(target, tokenizer=tokenizer, max_batch=1)
    compile_matcher = engine.constraints.matcher

    def slow(constraint, held=False):
        time.sleep(3)
        return compile_matcher(constraint, held)

    monkeypatch.setattr(engine.constraints, "matcher", slow)
    body = {"prompt": "a", "max_tokens": 2, "structured_outputs": {"regex": "[a-z]+"}}
    with serving(engine, tokenizer, constraint_timeout=0.5) as url:
        answer: dict = {}
        thread = threading.Thread(target=lambda: answer.update(got=_completion(url, body)))
        thread.start()
        time.sleep(0.2)  # the compile has begun
        start = time.monotonic()
        assert raw(url, "GET", "/health") == (200, {"status": "ok"})
        assert time.monotonic() - start < 2  # not behind the compile
        thread.join(30)
    status, error = answer["got"]
    assert status == 400 and error["error"]["param"] == "structured_outputs.regex"
    assert "not compiled within 0.5 s" in error["error"]["message"]


def test_a_panic_of_the_grammar_library_is_one_plain_line(
    target,  # noqa: F811
    tokenizer,  # noqa: F811
    monkeypatch,
):
    import llguidance

    class PanicException(BaseException):  # pyo3's, by name
        pass

    class Panicking:
        @staticmethod
        def grammar_from_regex(_):
            raise PanicException("panicked at src/derivre/ast.rs:123:9: index out of bounds")

    monkeypatch.setattr(llguidance, "LLMatcher", Panicking)
    engine = Engine(target, tokenizer=tokenizer, max_batch=1)
    with serving(engine, tokenizer) as url:
        body = {"prompt": "a", "max_tokens": 2, "guided_regex": "[a-z]+"}
        status, error = _completion(url, body)
    assert status == 400 and error["error"]["param"] == "guided_regex"
    message = error["error"]["message"]
    assert message.startswith("guided_regex: ") and "panicked" not in message
    assert "\n" not in message and ".rs" not in message


# -- 4 and 5. constraints the library would fail on ----------------------------------------


def test_regexes_the_library_would_fail_on_or_drop_are_refused(target, tokenizer):  # noqa: F811
    engine = Engine(target, tokenizer=tokenizer, max_batch=1)
    with serving(engine, tokenizer) as url:
        for pattern, words in (("a{1000000}", "too complex"), ("ab\\", "lone backslash")):
            body = {"prompt": "a", "max_tokens": 4, "structured_outputs": {"regex": pattern}}
            status, error = _completion(url, body)
            assert status == 400, (pattern, error)
            assert error["error"]["param"] == "structured_outputs.regex"
            assert error["error"]["message"].startswith("structured_outputs.regex: ")
            assert words in error["error"]["message"]


def test_a_choice_of_ten_thousand_options_answers_one_of_them(target, tokenizer):  # noqa: F811
    engine = Engine(target, tokenizer=tokenizer, max_batch=1)
    options = [f"option {i}" for i in range(10_000)]
    with serving(engine, tokenizer) as url:
        body = {"prompt": "a", "max_tokens": 8, "temperature": 0, "guided_choice": options}
        status, reply = _completion(url, body)
    assert status == 200
    assert reply["choices"][0]["text"] in options
    assert reply["choices"][0]["finish_reason"] == "stop"


def test_a_grammar_that_fails_mid_output_is_an_error_not_a_200(
    target,  # noqa: F811
    tokenizer,  # noqa: F811
    monkeypatch,
):
    """The library's per-step limits can still stop a grammar past the probe: the request
    fails (400 naming the field; an error event in a stream), never a 200 with its text."""
    advance = matcher_module.Matcher.advance

    def counting(self, tokens):
        taken = advance(self, tokens)
        self.walked = getattr(self, "walked", 0) + taken
        return taken

    def failing(self):  # past the probe's 4 tokens, "a limit" is hit
        return "a limit of the library" if getattr(self, "walked", 0) > 12 else None

    monkeypatch.setattr(matcher_module.Matcher, "advance", counting)
    monkeypatch.setattr(matcher_module.Matcher, "error", property(failing))
    engine = Engine(target, NGramDrafter(target.vocab_size, 3), tokenizer=tokenizer, **ALWAYS)
    body = {"prompt": "a", "max_tokens": 40, "temperature": 0, "guided_regex": "[a-z ]+"}
    with serving(engine, tokenizer) as url:
        status, error = _completion(url, body)
        assert status == 400 and error["error"]["param"] == "guided_regex"
        assert "could not follow" in error["error"]["message"]
        with pytest.raises(openai.APIError, match="could not follow"):
            list(
                client(url).completions.create(
                    model=MODEL, prompt="a", max_tokens=40, temperature=0, stream=True,
                    extra_body={"guided_regex": "[a-z ]+"},
                )
            )  # fmt: skip


# -- 6. what a browser page may send -------------------------------------------------------


def test_only_json_bodies_are_taken_with_or_without_a_key(target, tokenizer):  # noqa: F811
    engine = Engine(target, tokenizer=tokenizer, max_batch=1)
    body = json.dumps({"prompt": "a", "max_tokens": 2}).encode()
    for options, headers in (({}, {}), ({"api_keys": ("k",)}, {"Authorization": "Bearer k"})):
        with serving(engine, tokenizer, **options) as url:
            for kind in ("text/plain", "application/x-www-form-urlencoded"):
                sent = {**headers, "Content-Type": kind}
                status, error = raw(url, "POST", "/v1/completions", body, sent)
                assert status == 415 and error["error"]["param"] == "Content-Type"
            sent = {**headers, "Content-Type": "application/json; charset=utf-8"}
            assert raw(url, "POST", "/v1/completions", body, sent)[0] == 200


def test_the_host_header_must_name_this_server(target, tokenizer):  # noqa: F811
    engine = Engine(target, tokenizer=tokenizer, max_batch=1)
    with serving(engine, tokenizer) as url:
        port = url.rsplit(":", 1)[1]
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST"):
            assert raw(url, "GET", "/health", headers={"Host": host})[0] == 200, host
        for host in ("evil.example", f"evil.example:{port}", "127.0.0.1.evil.example"):
            status, error = raw(url, "GET", "/v1/models", headers={"Host": host})
            assert status == 421 and error["error"]["param"] == "Host", host
            assert "--allowed-hosts" in error["error"]["message"]
    with serving(engine, tokenizer, allowed_hosts=("evil.example",)) as url:
        assert raw(url, "GET", "/health", headers={"Host": "evil.example"})[0] == 200
        assert raw(url, "GET", "/health", headers={"Host": "other.example"})[0] == 421
    with serving(engine, tokenizer, api_keys=("k",)) as url:  # a key: any name (a proxy's)
        assert raw(url, "GET", "/health", headers={"Host": "evil.example"})[0] == 200


def test_host_rules():
    bound = HostRules.bound("127.0.0.1", 8000)
    assert bound.allows("127.0.0.1:8000") and bound.allows("[::1]:8000")
    assert not bound.allows("127.0.0.1:8001") and not bound.allows("localhost")
    assert not bound.allows(None) and not bound.allows("") and not bound.allows("a b")
    every = HostRules.bound("0.0.0.0", 80)
    assert every.allows("10.1.2.3") and every.allows("[fe80::1]:80")
    assert not every.allows("rebound.example") and not every.allows("10.1.2.3:81")
    assert HostRules.parse(("*",)).allows("anything.example:1")
    named = HostRules.parse(("api.example", "b.example:9000"))
    assert named.allows("API.example:1234") and named.allows("b.example:9000")
    assert not named.allows("b.example:9001")
    for bad in ((), ("a b",), ("x:99999",), ("[::1",), ("::1",)):  # v6 needs brackets
        with pytest.raises(ValueError, match="allowed_hosts"):
            HostRules.parse(bad)


def test_a_constraint_compiled_ahead_of_its_request_is_not_evicted_before_it_queues(
    target,  # noqa: F811
    tokenizer,  # noqa: F811
    monkeypatch,
):
    """A front end compiles on a worker (``held``); a flood of other constraints compiled
    meanwhile evicts older entries, never the held one, so the engine's thread finds it."""
    from quickdraft.constraints import Constraint
    from quickdraft.engine import constrain

    monkeypatch.setattr(constrain, "MAX_COMPILED", 3)
    engine = Engine(target, tokenizer=tokenizer, max_batch=1)
    held = Constraint("regex", "held[0-9]+")
    engine.constraints.matcher(held, held=True)
    for i in range(6):
        engine.constraints.matcher(Constraint("regex", f"other{i}[a-z]"))
    assert held in engine.constraints.compiled and len(engine.constraints.compiled) == 3


def test_api_keys_are_taken_whole_one_an_option(monkeypatch):
    """A key with a comma is one key (it was split into keys that each authenticated);
    several keys are several --api-key options; $QUICKDRAFT_API_KEY is one key."""
    from quickdraft.cli.serve import keys_and_hosts

    assert keys_and_hosts(["se,same"], None)[0] == ("se,same",)
    assert keys_and_hosts(["a", "b", "a"], None)[0] == ("a", "b")
    monkeypatch.setenv("QUICKDRAFT_API_KEY", "x,y")
    assert keys_and_hosts(None, None)[0] == ("x,y",)
    with pytest.raises(ValueError, match="--api-key"):
        keys_and_hosts([" "], None)
