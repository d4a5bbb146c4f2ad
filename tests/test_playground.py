"""What the playground reads: each verify step's draft and verdict from the engine
(``SamplingParams.draft_steps``), over HTTP as the ``quickdraft.steps`` extension, requests
that name another method (``quickdraft.method``), ``GET /v1/methods`` and the page itself.
And the page itself in headless Chromium: a prompt, a method change and a race."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from test_server import MODEL, SERVED, client, drafter, raw, serving, tiny_target

from quickdraft import Engine, SamplingParams
from quickdraft.drafters.draft_model.drafter import DraftModelDrafter
from quickdraft.engine.requests import Origin, StepDetail, step_details
from quickdraft.server.pool import MethodOption, OtherMethods

ALWAYS = {"disable_by_batch_size": None, "adaptive_k": False}  # every step drafts whole
PROMPT = "def add(a, b):\n    return a + b\n\ndef add(a, b):"


@pytest.fixture(scope="module")
def tokenizer(smollm2):
    return smollm2[1]


@pytest.fixture(scope="module")
def target(tokenizer):
    return tiny_target(tokenizer)


def rebuilt(steps: list[StepDetail]) -> list[int]:
    """The output the steps say they made: each step's accepted drafts, then its token."""
    out: list[int] = []
    for step in steps:
        made = [step.draft[node] for node in step.accepted] + [step.token]
        out += made[: step.emitted]
    return out


def run_with_steps(
    target, tokenizer, draft, n: int = 24, steps: bool = True, **sampling
) -> tuple[list, object]:
    engine = Engine(target, draft, **ALWAYS, tokenizer=tokenizer, max_batch=2)
    params = SamplingParams(max_new_tokens=n, draft_steps=steps, **sampling)
    engine.add_request(tokenizer.encode(PROMPT), params, "r")
    made, last = [], None
    while engine.has_unfinished():
        for out in engine.step():
            made += out.new_steps or []
            last = out
    return made, last


def test_origins_on_hand_made_steps():
    """A chain accepted to its end gives a bonus token, a rejection a corrected one, no
    draft a plain one; in a tree, a leaf ends a branch, an inner node does not. Each row:
    draft tokens, accepted path (-1 padded), accepted count, next token."""
    chain = step_details([[5, 6, 7, 0, 1, 2, 3, 9], [5, 6, 7, 0, -1, -1, 1, 8]], (-1, 0, 1), [4, 2])
    assert [d.origin for d in chain] == [Origin.BONUS, Origin.CORRECTED]
    assert chain[1].accepted == (0,) and chain[1].token == 8 and chain[1].draft == (5, 6, 7)
    assert step_details([[0, 9]], (), [1])[0].origin == Origin.PLAIN
    tree = (-1, -1, 0, 0, 1)  # nodes 2, 3 under 0; node 4 under 1
    rows = [[1, 2, 3, 4, 5, 1, 4, 2, 9], [1, 2, 3, 4, 5, 0, -1, 1, 9]]
    assert [d.origin for d in step_details(rows, tree, [3, 2])] == ["bonus", "corrected"]


@pytest.mark.parametrize("method", ["ar", "ngram", "eagle", "lookahead", "self"])
def test_steps_rebuild_the_output_one_step_per_target_pass(target, tokenizer, method):
    """Every method's steps rebuild its output token for token, one step per verify pass;
    a drafter that is the target itself is accepted whole at temperature 0 (draft tokens,
    then a bonus token), plain decoding drafts nothing."""
    draft = DraftModelDrafter(target, 3) if method == "self" else drafter(target, method)
    steps, last = run_with_steps(target, tokenizer, draft, temperature=0)
    assert rebuilt(steps) == last.token_ids
    assert len(steps) == last.stats.target_forwards
    origins = {step.origin for step in steps}
    if method == "ar":
        assert origins == {"plain"}
    elif method == "self":
        assert origins == {"bonus"} and all(len(s.accepted) == 3 for s in steps[:-1])
    else:  # a lookup that finds no match drafts nothing: a plain step
        assert origins <= {"bonus", "corrected", "plain"} and origins - {"plain"}
    for step in steps:
        assert len(step.parents) == len(step.draft)
        assert all(-1 <= p < i for i, p in enumerate(step.parents))
        # the accepted nodes form a path from the root
        for parent, child in zip([-1, *step.accepted], step.accepted, strict=False):
            assert step.parents[child] == parent


def test_steps_cut_by_a_stop_string_or_max_tokens_say_so(target, tokenizer):
    draft = DraftModelDrafter(target, 3)
    steps, last = run_with_steps(target, tokenizer, draft, n=5, temperature=0)
    assert rebuilt(steps) == last.token_ids and len(last.token_ids) == 5
    assert steps[-1].emitted < len(steps[-1].accepted) + 1  # 5 = 4 + 1 of the second step
    quiet, last = run_with_steps(target, tokenizer, draft, steps=False, temperature=0)
    assert quiet == [] and last.new_steps is None


def test_steps_cut_by_a_stop_string_or_a_stop_token_inside_the_drafts(target, tokenizer):
    """Self-drafting at k = 3 makes 4 tokens a step; a stop inside the second step's accepted
    drafts keeps only part of it, and the steps say how much."""
    draft = DraftModelDrafter(target, 3)
    _, free = run_with_steps(target, tokenizer, draft, temperature=0)
    ids = free.token_ids
    texts = [tokenizer.decode(ids[:i]) for i in range(len(ids) + 1)]
    cut = next(i for i in (5, 6) if ids[i] not in ids[:i])
    stop_id = (ids[cut],)
    steps, last = run_with_steps(target, tokenizer, draft, stop_token_ids=stop_id, temperature=0)
    assert last.token_ids == ids[: cut + 1] and rebuilt(steps) == last.token_ids
    assert [s.emitted for s in steps] == [4, cut - 3]
    stop = texts[cut + 1][len(texts[cut]) :]  # the text token ``cut`` adds
    if stop.strip() and stop not in texts[cut]:
        steps, last = run_with_steps(target, tokenizer, draft, stop=(stop,), temperature=0)
        assert rebuilt(steps) == last.token_ids and len(last.token_ids) == cut + 1
        assert last.finish_reason == "stop" and steps[-1].emitted == cut - 3


def test_a_step_the_batch_policy_runs_without_drafts_is_plain(target, tokenizer):
    engine = Engine(target, DraftModelDrafter(target, 3), disable_by_batch_size=1,
                    tokenizer=tokenizer, max_batch=2)  # fmt: skip
    params = SamplingParams(max_new_tokens=6, draft_steps=True, temperature=0)
    for name in ("a", "b"):
        engine.add_request(tokenizer.encode(PROMPT), params, name)
    steps: dict[str, list] = {"a": [], "b": []}
    while engine.has_unfinished():
        for out in engine.step():
            steps[out.request_id] += out.new_steps or []
    for made in steps.values():  # two running requests, threshold 1: no step drafts
        assert [s.origin for s in made] == [Origin.PLAIN] * 6


def others_for(target, tokenizer) -> OtherMethods:
    def make(method: str) -> Engine:
        if method == "lookahead":
            raise ValueError("lookahead: refused for the test")
        draft = DraftModelDrafter(target, 3) if method == "draft_model" else drafter(target, method)
        return Engine(target, draft, **ALWAYS, tokenizer=tokenizer, max_batch=2)

    options = [
        MethodOption(m, f"{m} drafting") for m in ("ar", "ngram", "draft_model", "lookahead")
    ]
    options.append(MethodOption("medusa", "Medusa heads", "no Medusa heads for tiny"))
    return OtherMethods(tuple(options), make)


def test_a_request_names_its_method_and_streams_its_steps(target, tokenizer):
    """Served: plain decoding. A request naming ngram or draft_model runs on that method's
    engine, made on first use, and gives plain decoding's tokens at temperature 0; its
    streamed steps rebuild its tokens; /v1/methods says what runs and why not."""
    engine = Engine(target, None, **ALWAYS, tokenizer=tokenizer, max_batch=2)
    with serving(engine, tokenizer, others=others_for(target, tokenizer)) as url:
        api = client(url)
        extra = {"return_token_ids": True}
        plain = api.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=20, temperature=0, extra_body=extra
        )
        expected = plain.choices[0].model_extra["token_ids"]
        assert plain.model_extra["quickdraft"]["method"] == "ar"
        for method in ("ngram", "draft_model"):
            options = {"method": method, "steps": True}
            stream = api.completions.create(
                model=MODEL, prompt=PROMPT, max_tokens=20, temperature=0, stream=True,
                extra_body={**extra, "quickdraft": options},
            )  # fmt: skip
            steps, ids, text = [], None, ""
            for chunk in stream:
                text += chunk.choices[0].text
                ext = chunk.model_extra.get("quickdraft") or {}
                steps += ext.get("steps", [])
                ids = chunk.choices[0].model_extra.get("token_ids") or ids
            assert ids == expected and text == plain.choices[0].text
            made = []
            for step in steps:
                tokens = [step["draft"][node]["id"] for node in step["accepted"]]
                made += [*tokens, step["token"]["id"]][: step["emitted"]]
                # the draft model is the target itself: every draft accepted
                allowed = {"bonus"} if method == "draft_model" else {"bonus", "corrected", "plain"}
                assert step["origin"] in allowed
                assert all(node["parent"] < i for i, node in enumerate(step["draft"]))
            assert made == expected
            whole = api.completions.create(
                model=MODEL, prompt=PROMPT, max_tokens=20, temperature=0,
                extra_body={"quickdraft": options},
            )  # fmt: skip
            assert whole.model_extra["quickdraft"]["method"] == method
            assert len(whole.choices[0].model_extra["quickdraft"]["steps"]) == len(steps)

        status, listing = raw(url, "GET", "/v1/methods")
        assert status == 200 and listing["served"] == "ar"
        by_name = {m["name"]: m for m in listing["methods"]}
        assert by_name["ngram"]["loaded"] and by_name["draft_model"]["loaded"]
        assert not by_name["medusa"]["available"]
        assert by_name["medusa"]["reason"] == "no Medusa heads for tiny"


def _post(url: str, body: dict) -> tuple[int, dict]:
    return raw(url, "POST", "/v1/completions", json.dumps(body).encode(),
               {"Content-Type": "application/json"})  # fmt: skip


def test_bad_quickdraft_options_get_a_400_naming_the_field(target, tokenizer):
    engine = Engine(target, None, **ALWAYS, tokenizer=tokenizer, max_batch=2)
    base = {"prompt": "hi", "max_tokens": 2}
    with serving(engine, tokenizer, others=others_for(target, tokenizer)) as url:
        cases = [
            ({"method": "warp"}, "quickdraft.method", "'warp' is not a method"),
            ({"method": "medusa"}, "quickdraft.method", "no Medusa heads for tiny"),
            ({"method": "lookahead"}, "quickdraft.method", "refused for the test"),
            ({"method": 3}, "quickdraft.method", "string"),
            ({"stpes": True}, "quickdraft.stpes", "Extra inputs"),
            ({"steps": "yes"}, "quickdraft.steps", "boolean"),
        ]
        for options, param, words in cases:
            status, body = _post(url, {**base, "quickdraft": options})
            assert status == 400, (options, body)
            assert body["error"]["param"] == param and words in body["error"]["message"]
        # a method whose engine could not be made is listed as unavailable from then on
        _, listing = raw(url, "GET", "/v1/methods")
        lookahead = next(m for m in listing["methods"] if m["name"] == "lookahead")
        assert not lookahead["available"] and "refused" in lookahead["reason"]
    with serving(engine, tokenizer) as url:  # no other methods: only the served one
        status, body = _post(url, {**base, "quickdraft": {"method": "ngram"}})
        assert status == 400 and "not a method this server runs (ar)" in body["error"]["message"]
        assert _post(url, {**base, "quickdraft": {"method": "ar"}})[0] == 200


def test_the_page_is_self_contained_and_talks_to_its_own_server_only(target, tokenizer):
    engine = Engine(target, None, **ALWAYS, tokenizer=tokenizer, max_batch=2)
    with serving(engine, tokenizer, api_keys=("k",)) as url:
        host, port = url.removeprefix("http://").split(":")
        import http.client

        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        conn.request("GET", "/")
        response = conn.getresponse()
        page = response.read().decode()
        assert response.status == 200  # the page needs no key; the API behind it does
        policy = response.getheader("Content-Security-Policy")
        assert "default-src 'none'" in policy and "connect-src 'self'" in policy
        assert "<script src" not in page and "http://" not in page and "https://" not in page
        assert "@import" not in page and "url(" not in page
        assert raw(url, "GET", "/v1/methods")[0] == 401
    with serving(engine, tokenizer, playground=False) as url:  # quickdraft serve --no-playground
        assert raw(url, "GET", "/")[0] == 404


def test_drain_reaches_engines_made_for_other_methods_and_refuses_new_ones(target, tokenizer):
    engine = Engine(target, None, **ALWAYS, tokenizer=tokenizer, max_batch=2, max_model_len=512)
    body = {"prompt": "x", "max_tokens": 400, "ignore_eos": True, "stream": True}
    with serving(engine, tokenizer, others=others_for(target, tokenizer)) as url:
        stream = client(url).completions.create(
            model=MODEL, prompt="x", max_tokens=400, stream=True,
            extra_body={"ignore_eos": True, "quickdraft": {"method": "ngram"}},
        )  # fmt: skip
        chunks = iter(stream)
        next(chunks)
        SERVED[-1].state.loop.drain(0.2)
        assert list(chunks)[-1].choices[0].finish_reason == "abort"  # ngram's engine drained
        status, error = _post(url, {**body, "quickdraft": {"method": "draft_model"}})
        assert status == 503 and "shutting down" in error["error"]["message"]
        _, listing = raw(url, "GET", "/v1/methods")
        assert not next(m for m in listing["methods"] if m["name"] == "draft_model")["loaded"]


def test_another_methods_failure_leaves_the_server_healthy(target, tokenizer):
    """An engine made for another method that fails makes that method unavailable (503 from
    then on, the reason listed), not the server; an engine that cannot be made for a reason
    other than its options (out of memory, say) answers 503 and is not tried again."""
    made = []

    def make(method: str) -> Engine:
        made.append(method)
        if method == "lookahead":
            raise RuntimeError("out of memory")
        failing = Engine(target, None, **ALWAYS, tokenizer=tokenizer, max_batch=2)

        def step():
            raise RuntimeError("a bug")

        failing.step = step
        return failing

    options = (MethodOption("ngram", "n"), MethodOption("lookahead", "l"))
    engine = Engine(target, None, **ALWAYS, tokenizer=tokenizer, max_batch=2)
    with serving(engine, tokenizer, others=OtherMethods(options, make)) as url:
        base = {"prompt": "x", "max_tokens": 4}
        status, error = _post(url, {**base, "quickdraft": {"method": "ngram"}})
        assert status == 500 and "a bug" in error["error"]["message"]
        assert raw(url, "GET", "/health") == (200, {"status": "ok"})
        status, error = _post(url, {**base, "quickdraft": {"method": "ngram"}})
        assert status == 503 and error["error"]["param"] == "quickdraft.method"
        for _ in range(2):
            status, error = _post(url, {**base, "quickdraft": {"method": "lookahead"}})
            assert status == 503 and "RuntimeError: out of memory" in error["error"]["message"]
        assert made == ["ngram", "lookahead"]
        assert _post(url, {**base, "quickdraft": {"method": None, "steps": None}})[0] == 200
        _, listing = raw(url, "GET", "/v1/methods")
        reasons = {m["name"]: m["reason"] for m in listing["methods"]}
        assert "a bug" in reasons["ngram"] and "out of memory" in reasons["lookahead"]


def test_registry_methods_on_smollm2_say_what_runs_and_make_engines_that_do(smollm2):
    """What `quickdraft serve` offers beside its served method on the real SmolLM2-135M: the
    drafters it ships (EAGLE, Medusa) and those that need nothing run; a draft model does not
    (one is loaded only for the served method); an engine made for EAGLE decodes as plain
    decoding does at temperature 0."""
    from quickdraft import generate
    from quickdraft.server.pool import registry_methods

    model, tok = smollm2
    others = registry_methods(
        model, tok, served="ar", target_name="smollm2-135m", device="cpu", rows=1,
        max_model_len=256, prefill_chunk=64,
    )  # fmt: skip
    reasons = {o.name: o.reason for o in others.options}
    assert {"ar", "ngram", "lookahead", "medusa", "eagle"} <= {
        m for m, r in reasons.items() if r is None
    }
    assert "--draft" in reasons["draft_model"]
    engine = others.make("eagle")
    assert engine.max_model_len == 256 and engine.scheduler.num_rows == 1
    ids = tok.apply_chat([{"role": "user", "content": "Name three primary colours."}])
    greedy = SamplingParams(temperature=0, max_new_tokens=24)
    engine.add_request(ids, greedy, "r")
    out = None
    while engine.has_unfinished():
        out = engine.step()[-1] if engine.requests or out is None else out
    assert out.token_ids == generate(model, ids, sampling=greedy).token_ids


# -- the page in a real browser ----------------------------------------------------------
# Headless Chromium (Playwright driving Debian's chromium): a prompt, a method change and a
# race, checked in the DOM. Needs the ``playwright`` package (a dev dependency) and a Chromium
# binary: Debian's ``apt-get install chromium`` (what ``.ci/run`` installs), or
# $QUICKDRAFT_CHROMIUM; without one the test is skipped, saying so.

CHROMIUM = os.environ.get("QUICKDRAFT_CHROMIUM") or shutil.which("chromium")
# Without the background-networking flags Chromium calls home at start (refused here).
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
]  # fmt: skip

needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="no Chromium (apt-get install chromium, or set QUICKDRAFT_CHROMIUM)"
)


@pytest.fixture
def page_server(target, tokenizer):
    """Served: a draft model that is the target itself (every draft accepted at temperature
    0), and plain decoding, prompt lookup and an untrained EAGLE tree (mostly rejected) as
    methods a request may name."""

    def make(method: str) -> Engine:
        if method == "lookahead":
            raise ValueError("lookahead: refused for the test")
        return Engine(target, drafter(target, method), **ALWAYS, tokenizer=tokenizer, max_batch=2)

    names = ("ar", "ngram", "eagle", "lookahead")
    options = tuple(MethodOption(m, f"{m} drafting") for m in names)
    served = Engine(
        target, DraftModelDrafter(target, 3), **ALWAYS, tokenizer=tokenizer, max_batch=2
    )
    others = OtherMethods((MethodOption("draft_model", "draft model"), *options), make)
    with serving(served, tokenizer, others=others, method="draft_model") as url:
        yield url


def _numbers(page, pane: str) -> dict[str, str]:
    return {
        name: page.inner_text(f"#{pane} .fig-{name}") for name in ("tps", "tau", "forwards", "time")
    }


@needs_chromium
def test_prompt_method_change_and_race_in_a_real_browser(page_server):
    from playwright.sync_api import sync_playwright

    url = page_server
    requests: list[str] = []
    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.on("request", lambda request: requests.append(request.url))
        page.goto(url + "/")
        page.wait_for_function("document.querySelectorAll('#method option').length >= 4")
        assert page.input_value("#method") == "draft_model"

        # 1. A prompt, sent from the keyboard (Enter in a field submits the form).
        page.select_option("#mode", "completion")
        page.fill("#prompt", "def add(a, b):\n    return a + b\n\ndef add(a, b):")
        page.fill("#max-tokens", "16")
        page.focus("#max-tokens")
        page.keyboard.press("Enter")
        page.wait_for_selector("#pane-main[data-state=done]")
        origins = page.eval_on_selector_all(
            "#pane-main .tok", "spans => spans.map(s => s.dataset.origin)"
        )
        assert len(origins) == 16 and set(origins) == {"draft", "bonus"}
        figures = _numbers(page, "pane-main")
        assert float(figures["tps"]) > 0 and float(figures["tau"]) > 3.0
        assert int(figures["forwards"]) == 4  # 16 tokens, 4 a step
        rates = page.eval_on_selector_all("#pane-main .bar", "b => b.map(x => x.dataset.rate)")
        assert rates == ["1.000"] * 3
        # keyboard: focus the answer, move through its steps
        page.focus("#pane-main .output")
        page.keyboard.press("ArrowRight")
        assert page.get_attribute("#pane-main .step.selected", "data-step") == "1"
        assert "step 2 of 4" in page.inner_text("#detail")
        assert "The draft, in order" in page.inner_text("#detail")

        # 2. Another method: an untrained EAGLE tree, mostly corrected by the target.
        page.select_option("#method", "eagle")
        page.click("#generate")
        page.wait_for_selector("#pane-main[data-state=done]")
        origins = page.eval_on_selector_all(
            "#pane-main .tok", "spans => spans.map(s => s.dataset.origin)"
        )
        assert len(origins) == 16 and "corrected" in origins
        assert "eagle" in page.inner_text("#pane-main-title")
        page.hover("#pane-main .step[data-step='0']")
        assert "draft tree" in page.inner_text("#detail")

        # 3. A race: plain decoding against the draft model, side by side, same text.
        page.select_option("#method", "draft_model")
        page.click("#race")
        page.wait_for_selector("#race-result[data-identical]")
        assert page.get_attribute("#race-result", "data-identical") == "true"
        assert page.is_visible("#pane-plain")
        plain = page.eval_on_selector_all("#pane-plain .tok", "s => s.map(x => x.dataset.origin)")
        assert set(plain) == {"plain"} and len(plain) == 16
        assert page.inner_text("#pane-plain .fig-forwards") == "16"
        texts = [page.inner_text(f"#{pane} .output") for pane in ("pane-plain", "pane-main")]
        assert texts[0] == texts[1] and texts[0]
        assert "Identical texts" in page.inner_text("#race-result")

        # 4. Server errors are shown in the page: a refused request, and a race whose method
        #    is refused, which stops its plain-decoding half at once.
        page.fill("#max-tokens", "100000")
        page.click("#generate")
        page.wait_for_selector("#error:not([hidden])")
        assert "400: max_tokens must be in" in page.inner_text("#error")
        assert page.is_enabled("#generate")
        # A long but valid plain half (context 512, a one-token prompt): were it refused too,
        # which 400 shows first would depend on which answer reaches the page first.
        page.fill("#max-tokens", "500")
        page.fill("#prompt", "x")
        page.select_option("#method", "lookahead")
        page.click("#race")
        page.wait_for_selector("#error:not([hidden])")
        page.wait_for_selector("#generate:enabled")
        assert "refused for the test" in page.inner_text("#error")
        assert page.eval_on_selector_all("#pane-plain .tok", "s => s.length") < 500
        assert page.get_attribute("#race-result", "data-identical") is None
        page.fill("#seed", "1.5")
        page.click("#generate")
        page.wait_for_function("document.querySelector('#error').textContent.includes('seed')")
        assert 'seed: "1.5" is not an integer' in page.inner_text("#error")

        # 4b. The schema box: bad JSON is refused in the page; a schema shapes the reply.
        page.fill("#seed", "")
        page.fill("#schema", "{bad")
        page.click("#generate")
        page.wait_for_function("document.querySelector('#error').textContent.includes('Schema')")
        assert "JSON Schema: not valid JSON" in page.inner_text("#error")
        schema = {
            "type": "object",
            "properties": {"pick": {"enum": ["red", "blue"]}},
            "required": ["pick"],
            "additionalProperties": False,
            "x-guidance": {"whitespace_flexible": False},
        }
        page.fill("#schema", json.dumps(schema))
        page.fill("#max-tokens", "30")
        page.select_option("#method", "ngram")
        page.click("#generate")
        page.wait_for_selector("#pane-main[data-state=done]")
        page.wait_for_selector("#generate:enabled")
        shown = page.inner_text("#pane-main .output")  # the end-of-sequence token's text follows
        reply, _ = json.JSONDecoder().raw_decode(shown)
        assert reply["pick"] in ("red", "blue"), shown
        page.fill("#schema", "")

        # 5. Bytes become text across tokens: a character split over two tokens shows whole,
        #    and token text is never read as HTML.
        shown = page.evaluate(
            r"""() => {
              const pane = panes.main;
              pane.reset("test");
              const bytes = (text) => Array.from(new TextEncoder().encode(text));
              const smile = bytes("\u{1F600}");
              const token = (b) => ({ id: 1, text: "", bytes: b });
              pane.addStep({ draft: [{ ...token(smile.slice(0, 2)), parent: -1 }],
                             accepted: [0], token: token(smile.slice(2)),
                             origin: "bonus", emitted: 2 });
              pane.addStep({ draft: [], accepted: [], token: token(bytes("<b>x</b>")),
                             origin: "plain", emitted: 1 });
              return [pane.output.textContent, pane.output.querySelectorAll("b").length];
            }"""
        )
        assert shown == ["\U0001f600<b>x</b>", 0]
        browser.close()

    assert requests and all(r.startswith(url + "/") for r in requests), requests
