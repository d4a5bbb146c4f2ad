"""The server's Prometheus metrics, in a registry of their own (one per app, so tests and
several apps in one process never share counters)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from quickdraft.engine.scheduler import Usage
from quickdraft.stats import Stats

# The drafter's gauges (``Usage.drafter``) by name, exported as quickdraft_<name>.
DRAFTER_GAUGES = {
    "suffix_cache_tokens": "Output tokens in suffix decoding's shared trie (capped, oldest out)",
    "suffix_lookups": "Rows suffix decoding looked up a draft for, since the engine began",
    "suffix_hits": "Lookups that found a draft (hit rate: divide by suffix_lookups)",
    "suffix_first_steps": "Steps that drafted with suffix decoding in front of the model",
    "suffix_first_model_steps": "Steps the model drafter drafted behind suffix decoding",
}

# Outcomes a request (one choice) ends with.
OUTCOMES = ("stop", "length", "abort", "timeout", "error", "rejected")


class Metrics:
    def __init__(self, depth: int):
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "quickdraft_requests",
            "Requests (one per choice) by how they ended: stop, length, abort (the client "
            "left), timeout, error, rejected (queue full)",
            ["outcome"],
            registry=r,
        )
        for outcome in OUTCOMES:
            self.requests.labels(outcome)
        self.invalid = Counter(
            "quickdraft_invalid_requests", "HTTP requests answered 4xx", ["status"], registry=r
        )
        self.prompt_tokens = Counter(
            "quickdraft_prompt_tokens", "Prompt tokens of requests taken", registry=r
        )
        self.generation_tokens = Counter(
            "quickdraft_generation_tokens", "Tokens generated", registry=r
        )
        self.accepted_length = Histogram(
            "quickdraft_accepted_length",
            "Tokens one verify step added to one request: accepted drafts + 1",
            buckets=[n + 0.5 for n in range(1, depth + 2)],
            registry=r,
        )
        self.draft_reached = Counter(
            "quickdraft_draft_position_verified",
            "Draft tokens verified at each depth with every earlier one accepted",
            ["position"],
            registry=r,
        )
        self.draft_accepted = Counter(
            "quickdraft_draft_position_accepted",
            "Draft tokens accepted at each depth (rate: divide by ..._verified)",
            ["position"],
            registry=r,
        )
        for position in range(1, depth + 1):
            self.draft_reached.labels(str(position))
            self.draft_accepted.labels(str(position))
        self.seconds = Counter(
            "quickdraft_engine_seconds",
            "Engine time by part: prefill, draft, verify",
            ["part"],
            registry=r,
        )
        self.steps = Counter("quickdraft_engine_steps", "Engine steps that decoded", registry=r)
        self.queue_depth = Gauge(
            "quickdraft_queue_depth", "Requests waiting for a row of the engine", registry=r
        )
        self.running = Gauge(
            "quickdraft_running_requests", "Requests prefilling or decoding", registry=r
        )
        self.cache_rows = Gauge(
            "quickdraft_cache_rows_in_use", "Rows of the KV cache held by requests", registry=r
        )
        self.cache_rows_total = Gauge(
            "quickdraft_cache_rows", "Rows of the KV cache (the most requests at once)", registry=r
        )
        self.cache_tokens = Gauge(
            "quickdraft_cache_tokens_in_use", "KV cache slots holding a request's token", registry=r
        )
        self.drafter: dict[str, Gauge] = {}

    def observe_steps(self, stats: Stats) -> None:
        """What the engine's steps since the last call did (``Engine.take_stats``)."""
        for accepted, drafted in zip(stats.accepted_drafts, stats.drafted, strict=True):
            self.accepted_length.observe(accepted + 1)
            for position in range(1, min(drafted, accepted + 1) + 1):
                self.draft_reached.labels(str(position)).inc()
                if accepted >= position:
                    self.draft_accepted.labels(str(position)).inc()
        self.seconds.labels("prefill").inc(stats.time_prefill)
        self.seconds.labels("draft").inc(stats.time_draft)
        self.seconds.labels("verify").inc(stats.time_verify)
        self.steps.inc(stats.target_forwards)

    def observe_usage(self, usage: Usage) -> None:
        self.queue_depth.set(usage.waiting)
        self.running.set(usage.prefilling + usage.running)
        self.cache_rows.set(usage.rows_in_use)
        self.cache_rows_total.set(usage.rows)
        self.cache_tokens.set(usage.cached_tokens)
        for name, value in usage.drafter.items():
            if name not in self.drafter:
                about = DRAFTER_GAUGES.get(name, f"The drafter's {name}")
                self.drafter[name] = Gauge(f"quickdraft_{name}", about, registry=self.registry)
            self.drafter[name].set(value)

    def render(self) -> bytes:
        return generate_latest(self.registry)
