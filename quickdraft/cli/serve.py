"""`quickdraft serve`: the OpenAI-compatible server over one engine."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import threading
from typing import Any

from quickdraft.cli.common import (
    _positive_int,
    _threads,
    add_quant,
    auto_method,
    console,
    finite_float,
    load_speculation,
    strict_int,
)

# Keys of --speculative-config besides the methods' options: the spec's own fields, and the
# draft model (vLLM calls it "model"); "drafter_int8" is also how a draft model loads.
_SPEC_KEYS = ("num_speculative_tokens", "acceptance", "disable_by_batch_size", "adaptive_k")
_DRAFT_KEYS = ("draft", "model")


def _add_serve(commands: argparse._SubParsersAction) -> None:
    from quickdraft.engine.core import DEFAULT_MAX_BATCH, DEFAULT_PREFILL_CHUNK
    from quickdraft.models.loading import DEFAULT_MODEL
    from quickdraft.models.sources import ALIASES

    serve = commands.add_parser(
        "serve",
        help="an OpenAI-compatible HTTP server (completions, chat, streaming) with "
        "speculative decoding",
        description="Serves POST /v1/completions, POST /v1/chat/completions, GET /v1/models, "
        "GET /health and GET /metrics (Prometheus). SIGTERM or Ctrl-C stops taking requests, "
        "lets running ones finish for --shutdown-grace seconds, aborts the rest and exits 0.",
    )
    serve.add_argument(
        "--target",
        default=DEFAULT_MODEL,
        help=f"alias ({', '.join(ALIASES)}), GGUF file, folder or hub id",
    )
    serve.add_argument("--draft", default=None, help="draft model (method draft_model)")
    serve.add_argument(
        "--speculative-config",
        default=None,
        help="JSON of SpecConfig's keys, as `quickdraft pick` prints them, such as "
        '\'{"method": "eagle", "tree": "4,4,12"}\' or \'{"method": "ngram", '
        '"num_speculative_tokens": 5}\'; "draft" (or vLLM\'s "model") names the draft model. '
        "Default: the automatic choice of `quickdraft generate` (EAGLE where a drafter "
        'ships for the target, else prompt lookup); {"method": "ar"} serves without '
        "speculation",
    )
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=strict_int, default=8000)
    serve.add_argument(
        "--api-key",
        action="append",
        default=None,
        help="require Authorization: Bearer KEY on /v1 routes; repeat it for several keys, "
        "each a tenant, whose suffix-decoding trie and reported cached tokens are its own "
        "(default: $QUICKDRAFT_API_KEY, one key; a key is taken whole, commas included)",
    )
    serve.add_argument(
        "--allowed-hosts",
        default=None,
        metavar="HOST[:PORT],...",
        help="Host headers the server answers (* for any); others get 421. Default: without "
        "--api-key, localhost, 127.0.0.1, [::1] and --host at --port (and any IP address when "
        "--host is 0.0.0.0 or ::), against DNS rebinding; with --api-key, any",
    )
    serve.add_argument(
        "--served-model-name", default=None, help="the model id clients send (default --target)"
    )
    serve.add_argument(
        "--max-batch",
        type=_positive_int,
        default=DEFAULT_MAX_BATCH,
        help=f"requests decoding at once, the KV cache's rows (default {DEFAULT_MAX_BATCH})",
    )
    serve.add_argument(
        "--max-queue",
        type=strict_int,
        default=64,
        help="requests waiting for a row beyond --max-batch; more get 429 (default 64)",
    )
    serve.add_argument(
        "--max-model-len",
        type=_positive_int,
        default=None,
        help="longest prompt + max_tokens (default: the model's context, at most 4096)",
    )
    serve.add_argument(
        "--no-prefix-caching",
        dest="prefix_caching",
        action="store_false",
        help="prefill every prompt whole; by default a request takes the free KV row that "
        "holds the most of its prompt's beginning (a conversation's next turn) and prefills "
        "the rest (not with EAGLE or Medusa, which read every prompt position's features)",
    )
    serve.add_argument(
        "--prefill-chunk",
        type=_positive_int,
        default=DEFAULT_PREFILL_CHUNK,
        help=f"prompt tokens prefilled per step (default {DEFAULT_PREFILL_CHUNK})",
    )
    serve.add_argument(
        "--request-timeout",
        type=finite_float,
        default=600.0,
        help="seconds before a request is aborted (default 600)",
    )
    serve.add_argument(
        "--shutdown-grace",
        type=finite_float,
        default=30.0,
        help="seconds running requests get to finish after SIGTERM (default 30)",
    )
    serve.add_argument(
        "--method-rows",
        type=_positive_int,
        default=2,
        help="rows of the engine made for another method the first time a request names it "
        "(quickdraft.method, as the playground's method menu and race do; default 2)",
    )
    serve.add_argument(
        "--no-playground",
        dest="playground",
        action="store_false",
        help="serve no playground page at / and run every request with the served method",
    )
    serve.add_argument(
        "--seed", type=strict_int, default=None, help="seeds unseeded requests' draws"
    )
    serve.add_argument("--threads", type=_threads, default=None, help="torch intra-op threads")
    serve.add_argument("--device", default="cpu")
    serve.add_argument("--backend", default="auto", choices=["auto", "native", "hf"])
    add_quant(serve)
    serve.add_argument(
        "--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"]
    )


def speculative_config(
    text: str | None, target: str, draft: str | None, backend: str
) -> tuple[Any, str | None, bool]:
    """(SpecConfig, draft model or None, int8 draft weights) from --speculative-config: the
    spec's own fields and the method's options, flat as vLLM's speculative_config takes
    them, and ``model``/``draft_model`` for the draft model."""
    from quickdraft.config import check_flag
    from quickdraft.drafters import registry

    data: dict[str, Any] = {}
    if text is not None:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"--speculative-config: not valid JSON ({error})") from None
        if not isinstance(data, dict):
            raise ValueError("--speculative-config must be a JSON object")
    data = dict(data)
    names = {"method", *_SPEC_KEYS} | {
        name for entry in registry.entries() for name in entry.option_names()
    }
    unknown = sorted(set(data) - names - set(_DRAFT_KEYS))
    if unknown:
        raise ValueError(
            f"--speculative-config: unknown key {unknown[0]!r}; keys are "
            f"{', '.join(sorted(names | set(_DRAFT_KEYS)))}"
        )
    for key in _DRAFT_KEYS:
        if key in data:
            if draft is not None and data[key] != draft:
                raise ValueError(f"--speculative-config: {key!r} and --draft disagree")
            draft = data.pop(key)
            if not isinstance(draft, str):
                raise ValueError(f"--speculative-config: {key!r} must be a model name or path")
    method = data.pop("method", "auto")
    if method == "auto":
        method = auto_method(target, draft, backend)
    entry = registry.get(method)
    own = {key: data.pop(key) for key in _SPEC_KEYS if key in data}
    if "num_speculative_tokens" in own and own["num_speculative_tokens"] is None:
        raise ValueError("num_speculative_tokens must be an integer, got None")
    owned = "drafter_int8" in entry.option_names()
    int8 = data.get("drafter_int8", True) if owned else data.pop("drafter_int8", True)
    check_flag("drafter_int8", int8)  # for a draft model: how it loads
    # Options of other methods at their defaults are no error, as on the command line.
    spec = registry.make_spec(entry.name, **own, **registry.given_options(data))
    return spec, draft, int8


def keys_and_hosts(
    keys: list[str] | None, hosts: str | None
) -> tuple[tuple[str, ...], tuple[str, ...] | None]:
    """--api-key's keys (else $QUICKDRAFT_API_KEY's one) and --allowed-hosts' entries,
    checked before any loading."""
    from quickdraft.server.guard import HostRules

    if keys is None:
        variable = os.environ.get("QUICKDRAFT_API_KEY")
        keys = None if variable is None else [variable]
    if keys is not None and any(not key.strip() for key in keys):
        raise ValueError("--api-key: give a key, or leave the option out")
    api_keys = tuple(dict.fromkeys(key.strip() for key in keys or ()))
    allowed = None
    if hosts is not None:
        allowed = tuple(entry.strip() for entry in hosts.split(","))
        try:
            HostRules.parse(allowed)
        except ValueError as error:
            raise ValueError(f"--{error}".replace("allowed_hosts", "allowed-hosts", 1)) from None
    return api_keys, allowed


def _server_class(loop, grace: float):
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, with a drain: the first SIGTERM or SIGINT stops new requests
        (uvicorn closes the listener; /health turns 503) and, ``grace`` seconds later, aborts
        what still runs, so that every handler answers before uvicorn's own deadline
        (``timeout_graceful_shutdown``, a few seconds later) cancels them. Exits 0: uvicorn
        would re-raise the signal after its shutdown, killing the process with it."""

        def handle_exit(self, sig, frame) -> None:
            if not self.should_exit:
                loop.drain(grace)
            super().handle_exit(sig, frame)

        @contextlib.contextmanager
        def capture_signals(self):
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            signals = (signal.SIGINT, signal.SIGTERM)
            previous = {sig: signal.signal(sig, self.handle_exit) for sig in signals}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    return Server


def _serve(args: argparse.Namespace) -> int:
    import prometheus_client
    import torch
    import uvicorn

    from quickdraft.engine import Engine
    from quickdraft.server import ServerConfig, create_app
    from quickdraft.server.pool import registry_methods

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be in 0..65535, got {args.port}")
    if args.max_queue < 0:
        raise ValueError(f"--max-queue must be >= 0, got {args.max_queue}")
    api_keys, allowed_hosts = keys_and_hosts(args.api_key, args.allowed_hosts)
    for name in ("request_timeout", "shutdown_grace"):
        value = getattr(args, name)
        if not value > 0:
            raise ValueError(f"--{name.replace('_', '-')} must be > 0, got {value}")
    spec, draft, int8 = speculative_config(
        args.speculative_config, args.target, args.draft, args.backend
    )
    listener = claim_port(args.host, args.port)  # before minutes of loading, not after
    args.port = listener.getsockname()[1]  # port 0: the one the system gave
    target, tokenizer, draft_model, draft_tokenizer = load_speculation(
        args.target, spec, draft, device=args.device, backend=args.backend, draft_int8=int8,
        quant=args.quant,
    )  # fmt: skip
    engine = Engine.from_spec(
        target,
        spec,
        draft_model,
        draft_tokenizer=draft_tokenizer,
        draft_name=draft,
        target_name=args.target,
        tokenizer=tokenizer,
        max_batch=args.max_batch,
        max_model_len=args.max_model_len,
        prefill_chunk=args.prefill_chunk,
        seed=args.seed,
        prefix_caching=args.prefix_caching,
    )
    name = args.served_model_name or args.target
    drafter = engine.drafter
    label = spec.method if drafter is None else f"{spec.method}, {drafter.describe()}"
    config = ServerConfig(
        model_name=name,
        method=str(spec.method),
        api_keys=api_keys,
        host=args.host,
        port=args.port,
        allowed_hosts=allowed_hosts,
        max_queue=args.max_queue,
        request_timeout=args.request_timeout,
        playground=args.playground,
    )
    others = None
    if args.playground:
        others = registry_methods(
            target, tokenizer, served=spec.method, target_name=args.target, device=args.device,
            rows=args.method_rows, max_model_len=engine.max_model_len,
            prefill_chunk=args.prefill_chunk, seed=args.seed,
        )  # fmt: skip
    app = create_app(engine, tokenizer, config, others)
    console.print(
        f"quickdraft: serving {name!r} ({label}) on http://{args.host}:{args.port}/v1, "
        f"{args.max_batch} rows, context {engine.max_model_len}"
    )
    if args.playground:
        console.print(f"quickdraft: playground on http://{args.host}:{args.port}/")
    prometheus_client.disable_created_metrics()  # the *_created series only add noise
    server = _server_class(app.state.loop, args.shutdown_grace)(
        uvicorn.Config(
            app,
            host=args.host,
            port=args.port,
            log_level=args.log_level,
            timeout_graceful_shutdown=args.shutdown_grace + 5,
        )
    )
    server.run(sockets=[listener])
    return 0 if server.started else 1


def claim_port(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (as uvicorn binds one), or ValueError naming --port
    when the address is taken or cannot be had. Serving takes this very socket, so nothing
    can take the port between the check and the server's start."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as error:
        raise ValueError(f"--host: cannot resolve {host!r} ({error.strerror})") from None
    # IPv4 first where the name has both (``localhost``): what uvicorn binds and clients try.
    infos.sort(key=lambda info: info[0] != socket.AF_INET)
    family, kind, proto, _, address = infos[0]
    listener = socket.socket(family, kind, proto)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(address)
    except OSError as error:
        listener.close()
        raise ValueError(
            f"--port: cannot listen on {host}:{port} ({error.strerror}); another server "
            "may be using it, or pick another with --port"
        ) from None
    listener.set_inheritable(True)
    return listener
