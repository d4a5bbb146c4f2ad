"""The OpenAI-compatible server, driven by the real ``openai`` client over loopback: every
method's responses equal offline ``generate`` token for token at temperature 0, streamed or
not; logprobs, stop strings, n, usage; disconnects, timeouts and a full queue free their rows;
bad input gets a 4xx naming the field."""

from __future__ import annotations

import http.client
import json
import threading
import time
from contextlib import contextmanager

import openai
import pytest
import torch
import uvicorn
from conftest import tiny_hf_model
from test_eagle import random_net
from test_medusa import random_heads

from quickdraft import Engine, SamplingParams, SpecConfig, generate
from quickdraft.drafters.draft_model.drafter import DraftModelDrafter
from quickdraft.drafters.eagle.drafter import EagleDrafter
from quickdraft.drafters.eagle.tree import DynamicTree
from quickdraft.drafters.lookahead import LookaheadConfig, LookaheadDrafter
from quickdraft.drafters.medusa.drafter import MedusaDrafter
from quickdraft.drafters.ngram import NGramDrafter
from quickdraft.drafters.registry import make_spec
from quickdraft.drafters.suffix.drafter import SuffixDrafter
from quickdraft.models.llama import LlamaRunner
from quickdraft.server import ServerConfig, create_app
from quickdraft.server.detok import TextStream

ALWAYS = {"disable_by_batch_size": None}
METHODS = ["ar", "draft_model", "ngram", "medusa", "eagle", "lookahead"]
MODEL = "tiny"
SERVED: list = []  # the apps ``serving`` started, latest last


@pytest.fixture(scope="module")
def tokenizer(smollm2):
    return smollm2[1]


def tiny_target(tokenizer) -> LlamaRunner:
    """A 3-layer random Llama over SmolLM2's vocabulary: the servers' model in tests."""
    hf = tiny_hf_model("llama-untied", vocab_size=len(tokenizer), layers=3)
    return LlamaRunner.from_state_dict(hf.config.to_dict(), hf.state_dict())


@pytest.fixture(scope="module")
def target(tokenizer) -> LlamaRunner:
    return tiny_target(tokenizer)


def drafter(target: LlamaRunner, method: str):
    return {
        "ar": lambda: None,
        "draft_model": lambda: DraftModelDrafter(target.truncated(2), 3),
        "ngram": lambda: NGramDrafter(target.vocab_size, 4),
        "medusa": lambda: MedusaDrafter(target, random_heads(64, target.vocab_size, 3)),
        "eagle": lambda: EagleDrafter(
            target, random_net(target, "eagle3", 400), DynamicTree(3, 2, 5), lookup=3
        ),
        "lookahead": lambda: LookaheadDrafter(target.vocab_size, LookaheadConfig(2, 3, 2)),
    }[method]()


@contextmanager
def serving(engine: Engine, tokenizer, others=None, **options):
    """The app on 127.0.0.1 at a free port, in a thread; yields its base URL. others: the
    methods a request may name besides the served one (``server.pool.OtherMethods``)."""
    app = create_app(engine, tokenizer, ServerConfig(MODEL, **options), others)
    SERVED.append(app)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


def client(url: str, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=60)


def raw(url: str, method: str, path: str, body: bytes | None = None, headers=None):
    """(status, parsed JSON or text) of one plain HTTP request; a body is sent as JSON
    unless ``headers`` give its Content-Type."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    headers = dict(headers or {})
    if body is not None and not any(k.lower() == "content-type" for k in headers):
        headers["Content-Type"] = "application/json"
    conn.request(method, path, body=body, headers=headers)
    response = conn.getresponse()
    data = response.read().decode()
    conn.close()
    try:
        return response.status, json.loads(data)
    except json.JSONDecodeError:
        return response.status, data


def metric(url: str, name: str) -> float:
    _, text = raw(url, "GET", "/metrics")
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)


def settled(url: str) -> dict[str, float]:
    """The gauges once the engine is idle (its thread sets them after its last step)."""
    names = ["quickdraft_running_requests", "quickdraft_cache_rows_in_use"]
    names += ["quickdraft_cache_tokens_in_use", "quickdraft_queue_depth"]
    deadline = time.monotonic() + 10
    while True:
        values = {name: metric(url, name) for name in names}
        if not any(values.values()) or time.monotonic() > deadline:
            return values
        time.sleep(0.05)


def offline(target, tokenizer, ids: list[int], n: int, method: str) -> list[int]:
    greedy = SamplingParams(temperature=0, max_new_tokens=n)
    draft = drafter(target, method)
    spec = None if draft is None else make_spec(**ALWAYS)
    out = generate(target, ids, sampling=greedy, draft=draft, spec=spec)
    return out.token_ids


@pytest.mark.parametrize("method", METHODS)
def test_every_method_over_http_equals_offline_generate(target, tokenizer, method):
    engine = Engine(target, drafter(target, method), **ALWAYS, tokenizer=tokenizer, max_batch=4)
    prompt = "def add(a, b):\n    return a + b\n\ndef add(a, b):"
    chat = [{"role": "user", "content": "Write a haiku about the sea."}]
    ids = tokenizer.encode(prompt)
    chat_ids = tokenizer.apply_chat(chat)
    with serving(engine, tokenizer) as url:
        api = client(url)
        extra = {"return_token_ids": True}
        whole = api.completions.create(
            model=MODEL, prompt=prompt, max_tokens=20, temperature=0, extra_body=extra
        )
        expected = offline(target, tokenizer, ids, 20, "ar")
        assert whole.choices[0].model_extra["token_ids"] == expected
        assert whole.choices[0].text == tokenizer.decode(expected)
        assert whole.usage.prompt_tokens == len(ids) and whole.usage.completion_tokens == 20
        assert whole.model_extra["quickdraft"]["target_forwards"] >= 1
        as_ids = api.completions.create(
            model=MODEL, prompt=ids, max_tokens=20, temperature=0, extra_body=extra
        )
        assert as_ids.choices[0].model_extra["token_ids"] == expected
        stream = api.completions.create(
            model=MODEL, prompt=prompt, max_tokens=20, temperature=0, stream=True
        )
        assert "".join(chunk.choices[0].text for chunk in stream) == whole.choices[0].text

        chat_expected = offline(target, tokenizer, chat_ids, 24, "ar")
        reply = api.chat.completions.create(
            model=MODEL, messages=chat, max_tokens=24, temperature=0, extra_body=extra
        )
        assert reply.choices[0].model_extra["token_ids"] == chat_expected
        assert reply.choices[0].message.content == tokenizer.decode(chat_expected)
        chunks = list(
            api.chat.completions.create(
                model=MODEL,
                messages=chat,
                max_tokens=24,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == reply.choices[0].message.content
        assert chunks[0].choices[0].delta.role == "assistant"
        assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 24
        assert settled(url)["quickdraft_cache_rows_in_use"] == 0
    # The drafter's own offline run agrees too (the identity above is with plain decoding).
    assert offline(target, tokenizer, ids, 20, method) == expected


def test_logprobs_stop_strings_n_and_seeds(target, tokenizer):
    engine = Engine(target, drafter(target, "eagle"), **ALWAYS, tokenizer=tokenizer, max_batch=4)
    prompt = "Once upon a time"
    ids = tokenizer.encode(prompt)
    expected = offline(target, tokenizer, ids, 30, "ar")
    text = tokenizer.decode(expected)
    with serving(engine, tokenizer) as url:
        api = client(url)
        out = api.completions.create(
            model=MODEL, prompt=prompt, max_tokens=30, temperature=0, logprobs=3
        )
        logprobs = out.choices[0].logprobs
        full = torch.tensor([ids + expected])
        cache = target.new_cache(1, full.shape[1])
        logits = target.forward(full, torch.arange(full.shape[1])[None], cache).logits[0]
        reference = torch.log_softmax(logits[len(ids) - 1 : -1], -1)
        chosen = reference.gather(1, torch.tensor(expected)[:, None]).squeeze(1)
        assert torch.allclose(torch.tensor(logprobs.token_logprobs), chosen, atol=1e-4)
        assert all(len(top) <= 3 for top in logprobs.top_logprobs)
        assert "".join(logprobs.tokens) == out.choices[0].text
        chat = api.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=5,
            temperature=0,
            logprobs=True,
            top_logprobs=2,
        )
        entries = chat.choices[0].logprobs.content
        assert len(entries) == 5 and all(len(e.top_logprobs) == 2 for e in entries)
        assert all(e.top_logprobs[0].logprob >= e.logprob - 1e-6 for e in entries)

        # A stop string from the middle of the output: the text ends before it.
        stop = text[len(text) // 2 : len(text) // 2 + 3]
        cut = api.completions.create(
            model=MODEL, prompt=prompt, max_tokens=30, temperature=0, stop=[stop]
        )
        assert cut.choices[0].text == text[: text.index(stop)]
        assert cut.choices[0].finish_reason == "stop"
        streamed = api.completions.create(
            model=MODEL, prompt=prompt, max_tokens=30, temperature=0, stop=stop, stream=True
        )
        assert "".join(c.choices[0].text for c in streamed) == cut.choices[0].text

        # n = 2 at temperature 0.8 with a seed: two different, reproducible choices.
        def sampled():
            return api.completions.create(
                model=MODEL, prompt=prompt, max_tokens=12, temperature=0.8, n=2, seed=5
            )

        first, second = sampled(), sampled()
        assert [c.index for c in first.choices] == [0, 1]
        assert [c.text for c in first.choices] == [c.text for c in second.choices]
        assert first.choices[0].text != first.choices[1].text
        assert first.usage.prompt_tokens == len(ids)
        assert first.usage.completion_tokens == 24
        batch = api.completions.create(model=MODEL, prompt=[prompt, "Hello"], max_tokens=4)
        assert len(batch.choices) == 2 and batch.usage.completion_tokens == 8
        listed = api.models.list().data
        assert [m.id for m in listed] == [MODEL]


def test_disconnects_timeouts_and_a_full_queue_free_their_rows(target, tokenizer):
    engine = Engine(target, None, tokenizer=tokenizer, max_batch=1, max_model_len=512)
    with serving(engine, tokenizer, max_queue=0) as url:
        api = client(url)
        body = {"prompt": "x", "max_tokens": 400, "ignore_eos": True}
        stream = api.completions.create(
            model=MODEL, prompt="x", max_tokens=400, stream=True, extra_body={"ignore_eos": True}
        )
        next(iter(stream))  # running: the one row is taken
        status, error = raw(url, "POST", "/v1/completions", json.dumps(body).encode())
        assert status == 429 and error["error"]["code"] == "queue_full"
        stream.close()  # the client goes away mid-stream
        assert settled(url)["quickdraft_cache_rows_in_use"] == 0
        assert metric(url, 'quickdraft_requests_total{outcome="abort"}') == 1

        # A non-streamed request whose client leaves before the answer.
        host, port = url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port))
        conn.request(
            "POST",
            "/v1/completions",
            body=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        time.sleep(0.3)
        conn.close()
        assert settled(url)["quickdraft_cache_rows_in_use"] == 0
        assert metric(url, 'quickdraft_requests_total{outcome="abort"}') == 2
        assert raw(url, "GET", "/health") == (200, {"status": "ok"})

    with serving(engine, tokenizer, request_timeout=0.3) as url:
        status, error = raw(url, "POST", "/v1/completions", json.dumps(body).encode())
        assert status == 408 and error["error"]["type"] == "timeout_error"
        with pytest.raises(openai.APIError, match=r"timeout of 0\.3 s"):  # an error event
            list(
                client(url).completions.create(
                    model=MODEL,
                    prompt="x",
                    max_tokens=400,
                    stream=True,
                    extra_body={"ignore_eos": True},
                )
            )
        assert settled(url)["quickdraft_cache_rows_in_use"] == 0
        assert metric(url, 'quickdraft_requests_total{outcome="timeout"}') == 2


def test_api_key(target, tokenizer):
    engine = Engine(target, None, tokenizer=tokenizer, max_batch=1, max_model_len=256)
    with serving(engine, tokenizer, api_keys=("sesame",)) as url:
        with pytest.raises(openai.AuthenticationError):
            client(url, "wrong").models.list()
        status, error = raw(url, "GET", "/v1/models")
        assert status == 401 and error["error"]["code"] == "invalid_api_key"
        assert client(url, "sesame").completions.create(model=MODEL, prompt="a", max_tokens=2)
        assert raw(url, "GET", "/health")[0] == 200  # health and metrics stay open


_NO_SUCH_TOKEN = 'start: <[999999]> "a"'  # a token id past the vocabulary


def _bad_requests() -> list[tuple[str, object, str | None, int]]:
    """(path, body, the param the error must name, status)."""
    c, chat = "/v1/completions", "/v1/chat/completions"
    msgs = [{"role": "user", "content": "hi"}]
    cases: list[tuple[str, object, str | None, int]] = [
        (c, b"{not json", "body", 400),
        (c, b"\xff\xfe\x00garbage", "body", 400),
        (c, b"[1, 2]", "body", 400),
        (c, b"", "body", 400),
        (c, b"[" * 100_000 + b"]" * 100_000, "body", 400),
        (c, b'"just a string"', "body", 400),
        (c, {"model": "gpt-4", "prompt": "a"}, "model", 404),
        (c, {}, "prompt", 400),
        (c, {"prompt": None}, "prompt", 400),
        (c, {"prompt": 5}, "prompt", 400),
        (c, {"prompt": [1, "a"]}, "prompt", 400),
        (c, {"prompt": []}, "prompt", 400),
        (c, {"prompt": ""}, "prompt", 400),
        (c, {"prompt": [10**9]}, "prompt", 400),
        (c, {"prompt": [-1]}, "prompt", 400),
        (c, {"prompt": "a", "max_tokens": 10**6}, "max_tokens", 400),
        (c, {"prompt": "a", "max_tokens": 0}, "max_tokens", 400),
        (c, {"prompt": "a", "max_tokens": -5}, "max_tokens", 400),
        (c, {"prompt": "a", "max_tokens": "5"}, "max_tokens", 400),
        (c, {"prompt": "a", "max_tokens": 1.5}, "max_tokens", 400),
        (c, {"prompt": "a", "max_tokens": 10**400}, "max_tokens", 400),
        (c, b'{"prompt": "a", "max_tokens": 1' + b"0" * 5000 + b"}", "body", 400),
        (c, b'{"prompt": "\\ud800 lone surrogate"}', "prompt", 400),
        (c, {"prompt": "a", "temperature": -1}, "temperature", 400),
        (c, {"prompt": "a", "temperature": "hot"}, "temperature", 400),
        (c, {"prompt": "a", "temperature": 1e31}, "temperature", 400),
        (c, b'{"prompt": "a", "temperature": NaN}', "temperature", 400),
        (c, b'{"prompt": "a", "temperature": Infinity}', "temperature", 400),
        (c, {"prompt": "a", "top_p": 1.5}, "top_p", 400),
        (c, {"prompt": "a", "top_p": 0}, "top_p", 400),
        (c, {"prompt": "a", "top_k": -2}, "top_k", 400),
        (c, {"prompt": "a", "top_k": True}, "top_k", 400),
        (c, {"prompt": "a", "seed": -1}, "seed", 400),
        (c, {"prompt": "a", "seed": 2**70}, "seed", 400),
        (c, {"prompt": "a", "stop": 5}, "stop", 400),
        (c, {"prompt": "a", "stop": [""]}, "stop", 400),
        (c, {"prompt": "a", "stop": ["x"] * 100}, "stop", 400),
        (c, {"prompt": "a", "stream": "yes"}, "stream", 400),
        (c, {"prompt": "a", "n": 0}, "n", 400),
        (c, {"prompt": "a", "n": 1000}, "n", 400),
        (c, {"prompt": ["a"] * 100}, "prompt", 400),
        (c, {"prompt": ["a"] * 10, "n": 16}, "n", 400),
        (c, {"prompt": "a", "logprobs": 50}, "logprobs", 400),
        (c, {"prompt": "a", "logprobs": "3"}, "logprobs", 400),
        (c, {"prompt": "a", "echo": True}, "echo", 400),
        (c, {"prompt": "a", "presence_penalty": 1.0}, "presence_penalty", 400),
        (c, {"prompt": "a", "logit_bias": {"5": 10}}, "logit_bias", 400),
        (c, {"prompt": "a", "stream_options": {"include_usage": True}}, "stream_options", 400),
        (c, {"prompt": "a", "user": 7}, "user", 400),
        (chat, {}, "messages", 400),
        (chat, {"messages": []}, "messages", 400),
        (chat, {"messages": "hi"}, "messages", 400),
        (chat, {"messages": [{"content": "hi"}]}, "messages.0.role", 400),
        (chat, {"messages": [{"role": "wizard", "content": "hi"}]}, "messages.0.role", 400),
        (chat, {"messages": [{"role": "user", "content": 5}]}, "messages.0.content", 400),
        (chat, {"messages": msgs, "max_completion_tokens": 10**7}, "max_completion_tokens", 400),
        (chat, {"messages": msgs, "top_logprobs": 3}, "top_logprobs", 400),
        (chat, {"messages": msgs, "logprobs": True, "top_logprobs": 99}, "top_logprobs", 400),
        (chat, {"messages": msgs, "tools": [{"type": "function"}]}, "tools", 400),
        (chat, {"messages": msgs, "stream_options": 3}, "stream_options", 400),
        (chat, {"messages": msgs, "response_format": {"type": "xml"}}, "response_format.type", 400),
        (
            chat,
            {"messages": msgs, "response_format": {"type": "json_schema", "json_schema": {}}},
            "response_format.json_schema",
            400,
        ),
        (
            chat,
            {
                "messages": msgs,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "objectx"}},
                },
            },
            "response_format.json_schema.schema",
            400,
        ),
        (c, {"prompt": "a", "guided_regex": "[0-9"}, "guided_regex", 400),
        (c, {"prompt": "a", "guided_choice": []}, "guided_choice", 400),
        (c, {"prompt": "a", "guided_json": "{bad"}, "guided_json", 400),
        (c, {"prompt": "a", "structured_outputs": {"xml": "x"}}, "structured_outputs", 400),
        (c, {"prompt": "a", "guided_regex": "a", "guided_choice": ["a"]}, "guided_choice", 400),
        # Valid alone, but not with this tokenizer: refused before it queues, streamed too.
        (c, {"prompt": "a", "guided_grammar": _NO_SUCH_TOKEN}, "guided_grammar", 400),
        (
            c,
            {"prompt": "a", "guided_grammar": _NO_SUCH_TOKEN, "stream": True},
            "guided_grammar",
            400,
        ),
        (c, {"prompt": "a" * (5 << 20)}, None, 413),
        ("/v1/nothing", {"prompt": "a"}, None, 404),
    ]
    return cases


def test_bad_requests_get_a_4xx_naming_the_field(target, tokenizer):
    engine = Engine(target, None, tokenizer=tokenizer, max_batch=1, max_model_len=256)
    cases = _bad_requests()
    assert len(cases) >= 40
    with serving(engine, tokenizer) as url:
        for path, body, param, status in cases:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            got, error = raw(url, "POST", path, data, {"Content-Type": "application/json"})
            label = f"{path} {data[:60]!r}"
            assert got == status, (label, error)
            assert set(error["error"]) == {"message", "type", "param", "code"}, label
            assert "Traceback" not in error["error"]["message"], label
            if param is not None:
                assert error["error"]["param"] == param, (label, error)
                assert param.split(".")[0] in error["error"]["message"], (label, error)
        assert raw(url, "GET", "/health") == (200, {"status": "ok"})
        assert raw(url, "DELETE", "/v1/models")[0] == 405
        # The server still serves after all of that.
        assert client(url).completions.create(model=MODEL, prompt="a", max_tokens=2)


def test_text_stream_holds_partial_characters_and_possible_stop_strings(tokenizer):
    text = "naïve café, 你好 🎉 — done. STOP here"
    ids = tokenizer.encode(text)
    stream = TextStream(tokenizer, ("STOP",))
    pieces = [stream.add([token]) for token in ids]
    assert all("\ufffd" not in piece for piece in pieces)
    sent = "".join(pieces)
    final = tokenizer.decode(ids)
    assert final.startswith(sent) and len(final) - len(sent) <= 3
    assert sent + stream.finish(final) == final


def test_cli_serve_answers_then_drains_on_sigterm_and_exits_0(tmp_path, smollm2):
    """The real command on a tiny model folder: a stream running when SIGTERM arrives still
    gets all its tokens, new connections are refused, and the process exits 0."""
    import signal
    import socket
    import subprocess
    import sys

    from conftest import tiny_folder_and_corpus

    folder, _ = tiny_folder_and_corpus(tmp_path, smollm2, "llama-untied")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "quickdraft", "serve", "--target", str(folder)]
    command += ["--port", str(port), "--speculative-config", '{"method": "ngram"}']
    command += ["--served-model-name", MODEL, "--log-level", "warning", "--threads", "1"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None, process.stdout.read().decode()
            try:
                if raw(url, "GET", "/health")[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline
            time.sleep(0.2)
        stream = client(url).completions.create(
            model=MODEL, prompt="x", max_tokens=300, stream=True, extra_body={"ignore_eos": True}
        )
        chunks = iter(stream)
        first = next(chunks)
        process.send_signal(signal.SIGTERM)
        rest = list(chunks)
        assert rest[-1].choices[0].finish_reason == "length"
        assert process.wait(60) == 0
        with pytest.raises(OSError):
            raw(url, "GET", "/health")
        assert first.choices[0].text is not None
    finally:
        process.kill()
        process.wait()


@pytest.mark.parametrize("method", ["ar", "eagle"])
def test_smollm2_over_http_equals_offline_generate(smollm2, method):
    """The real model with its shipped EAGLE drafter (the server's automatic choice for it)
    and without: chat and completion, whole and streamed, equal offline plain decoding."""
    target, tokenizer = smollm2
    engine = Engine.from_spec(target, SpecConfig(method=method), tokenizer=tokenizer, max_batch=2)
    chat = [{"role": "user", "content": "Write a Python function that reverses a string."}]
    greedy = SamplingParams(temperature=0, max_new_tokens=40)
    expected = generate(target, tokenizer.apply_chat(chat), sampling=greedy, tokenizer=tokenizer)
    prompt = "The three primary colours are"
    plain = generate(target, prompt, sampling=greedy, tokenizer=tokenizer)
    with serving(engine, tokenizer) as url:
        api = client(url)
        extra = {"return_token_ids": True}
        reply = api.chat.completions.create(
            model=MODEL, messages=chat, max_tokens=40, temperature=0, extra_body=extra
        )
        assert reply.choices[0].model_extra["token_ids"] == expected.token_ids
        assert reply.choices[0].message.content == expected.text
        streamed = api.completions.create(
            model=MODEL, prompt=prompt, max_tokens=40, temperature=0, stream=True
        )
        assert "".join(c.choices[0].text for c in streamed) == plain.text
        if method == "eagle":
            assert reply.model_extra["quickdraft"]["accepted_length"] > 1.2


def test_nulls_mean_defaults(target, tokenizer):
    """OpenAI's clients send null for optional fields they leave unset."""
    engine = Engine(target, None, tokenizer=tokenizer, max_batch=1, max_model_len=256)
    nulls = dict.fromkeys(["n", "stream", "echo", "max_tokens", "logprobs", "seed", "stop"])
    with serving(engine, tokenizer) as url:
        status, body = raw(
            url, "POST", "/v1/completions", json.dumps({"prompt": "a", **nulls}).encode()
        )
        assert status == 200 and len(body["choices"]) == 1, body
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, **nulls}
        chat["logprobs"] = chat["top_logprobs"] = chat["return_token_ids"] = None
        status, body = raw(url, "POST", "/v1/chat/completions", json.dumps(chat).encode())
        assert status == 200 and body["choices"][0]["logprobs"] is None, body


def test_an_engine_failure_answers_every_request_and_turns_health_503(target, tokenizer):
    engine = Engine(target, None, tokenizer=tokenizer, max_batch=2, max_model_len=256)
    steps = 0
    step = engine.step

    def failing_step():
        nonlocal steps
        steps += 1
        if steps > 3:
            raise RuntimeError("a bug")
        return step()

    engine.step = failing_step
    body = json.dumps({"prompt": "a", "max_tokens": 50, "ignore_eos": True}).encode()
    with serving(engine, tokenizer) as url:
        status, error = raw(url, "POST", "/v1/completions", body)
        assert status == 500 and "a bug" in error["error"]["message"]
        assert error["error"]["type"] == "server_error"
        assert raw(url, "GET", "/health")[0] == 503
        status, error = raw(url, "POST", "/v1/completions", body)
        assert status == 503 and "the engine stopped" in error["error"]["message"]


def test_drain_answers_running_requests_and_refuses_new_ones(target, tokenizer):
    """What SIGTERM does before the server closes: running requests are aborted after the
    grace period and still answered; new ones get 503; /health says draining."""
    engine = Engine(target, None, tokenizer=tokenizer, max_batch=1, max_model_len=512)
    with serving(engine, tokenizer) as url:
        stream = client(url).completions.create(
            model=MODEL, prompt="x", max_tokens=500, stream=True, extra_body={"ignore_eos": True}
        )
        chunks = iter(stream)
        next(chunks)
        SERVED[-1].state.loop.drain(0.2)
        rest = list(chunks)
        assert rest[-1].choices[0].finish_reason == "abort"
        assert raw(url, "GET", "/health") == (503, {"status": "draining"})
        status, error = raw(url, "POST", "/v1/completions", b'{"prompt": "a"}')
        assert status == 503 and "shutting down" in error["error"]["message"]
        assert settled(url)["quickdraft_cache_rows_in_use"] == 0


def test_speculative_config_json_takes_specconfig_keys_and_names_bad_ones():
    from quickdraft.cli.serve import speculative_config

    spec, draft, _ = speculative_config(None, "smollm2-135m", None, "auto")
    assert str(spec.method) == "eagle" and draft is None  # generate's automatic choice
    spec, draft, _ = speculative_config('{"method": "ngram"}', "smollm2-135m", None, "auto")
    assert str(spec.method) == "ngram" and spec.num_speculative_tokens == 5
    text = '{"model": "qwen2.5-coder-0.5b", "num_speculative_tokens": 3}'  # vLLM's key
    spec, draft, _ = speculative_config(text, "qwen2.5-coder-1.5b", None, "auto")
    assert str(spec.method) == "draft_model" and draft == "qwen2.5-coder-0.5b"
    assert spec.num_speculative_tokens == 3
    # Another method's options at their defaults are no error, as on the command line.
    text = '{"method": "ngram", "tree": "default", "draft_shortlist": "full"}'
    assert speculative_config(text, "smollm2-135m", None, "auto")[0] == make_spec("ngram")
    for bad, words in (
        ("{not json", "not valid JSON"),
        ("[1]", "must be a JSON object"),
        ('{"methd": "ngram"}', "unknown key 'methd'"),
        ('{"method": "nope"}', "method"),
        ('{"method": "ngram", "num_speculative_tokens": 0}', "num_speculative_tokens"),
        ('{"method": "ngram", "tree": "4,4,12"}', "tree applies to"),
        ('{"draft": 5}', "model name or path"),
        ('{"method": "ngram", "num_speculative_tokens": null}', "num_speculative_tokens"),
        ('{"model": "x", "drafter_int8": "false"}', "drafter_int8 must be True or False"),
    ):
        with pytest.raises(ValueError, match=words):
            speculative_config(bad, "smollm2-135m", None, "auto")


def test_suffix_decoding_exports_its_trie_and_hit_rate(target, tokenizer):
    drafter = SuffixDrafter(target.vocab_size, 4)
    engine = Engine(target, drafter, tokenizer=tokenizer, max_batch=2, **ALWAYS)
    with serving(engine, tokenizer) as url:
        api = client(url)
        for _ in range(2):  # the second request drafts from the first one's output
            reply = api.completions.create(
                model=MODEL, prompt="one two one two one two", max_tokens=12, temperature=0
            )
        extension = reply.model_extra["quickdraft"]
        assert extension["draft_tokens_per_step"] is not None
        deadline = time.monotonic() + 10
        while metric(url, "quickdraft_suffix_cache_tokens") == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert metric(url, "quickdraft_suffix_cache_tokens") >= 12
        lookups, hits = (
            metric(url, "quickdraft_suffix_lookups"),
            metric(url, "quickdraft_suffix_hits"),
        )
        assert lookups > 0 and 0 < hits <= lookups


def test_a_sessions_next_turn_reports_its_cached_prompt_tokens(target, tokenizer):
    engine = Engine(target, tokenizer=tokenizer, max_batch=2)
    first = [{"role": "user", "content": "List three colours."}]
    with serving(engine, tokenizer) as url:
        api = client(url)
        reply = api.chat.completions.create(
            model=MODEL, messages=first, max_tokens=12, temperature=0
        )
        assert reply.usage.prompt_tokens_details.cached_tokens == 0
        turn = [
            *first,
            {"role": "assistant", "content": reply.choices[0].message.content},
            {"role": "user", "content": "And three more."},
        ]
        extra = {"return_token_ids": True}
        again = api.chat.completions.create(
            model=MODEL, messages=turn, max_tokens=12, temperature=0, extra_body=extra
        )
    ids = tokenizer.apply_chat(turn)
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert len(tokenizer.apply_chat(first)) <= cached < len(ids)
    assert again.choices[0].model_extra["token_ids"] == offline(target, tokenizer, ids, 12, "ar")


def test_structured_outputs_parse_and_match_plain_decoding(target, tokenizer):
    """response_format's JSON Schema and vLLM's guided_choice, served with speculation: the
    replies follow their constraint, and greedy replies equal the plain engine's."""
    schema = {
        "type": "object",
        "properties": {"id": {"enum": [1, 2, 3]}, "ok": {"type": "boolean"}},
        "required": ["id", "ok"],
        "additionalProperties": False,
        # Compact JSON: a random model would spend its tokens on the whitespace JSON allows
        # (and on the digits of an unbounded integer).
        "x-guidance": {"whitespace_flexible": False},
    }
    replies = {}
    for method in ("ar", "ngram"):
        engine = Engine(target, drafter(target, method), tokenizer=tokenizer, **ALWAYS)
        with serving(engine, tokenizer) as url:
            api = client(url)
            reply = api.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "a record"}],
                max_tokens=40,
                temperature=0,
                response_format={
                    "type": "json_schema",
                    "json_schema": {"name": "record", "schema": schema, "strict": True},
                },
            )
            text = reply.choices[0].message.content
            assert reply.choices[0].finish_reason == "stop", text
            assert set(json.loads(text)) == {"id", "ok"}, text
            picked = api.completions.create(
                model=MODEL, prompt="pick", max_tokens=8, temperature=0,
                extra_body={"guided_choice": ["alpha", "beta"]},
            )  # fmt: skip
            assert picked.choices[0].text in ("alpha", "beta")
            replies[method] = (text, picked.choices[0].text)
    assert replies["ar"] == replies["ngram"]
