"""What a verify pass of n tokens costs the target on this host: measured once, at load.

Speculation pays only where a pass over the pending token and k drafts costs little more
than a pass over one. How much more depends on the host (a 16-row product costs 1.6x one row
with AVX-512 VNNI, 4-6x with AVX2), the model and its quantization, so the engine measures it:
one forward of each width in ``WIDTHS`` after a short committed context, a warm-up pass then
rounds of passes until ``budget`` seconds (about a second), medians. The table is stored under
the cache (``$QUICKDRAFT_CACHE/costs``), keyed by the host (CPU model and flags, torch's thread
count, a forced q4 path) and the model (a digest of its logits on a fixed input, which tells
weights and quantization apart), and kept in memory for the process, so a model is measured
once per host.

    costs = verify_costs(target)        # VerifyCosts
    costs(9) / costs(1)                 # a 9-token verify against a decode step
"""

from __future__ import annotations

import bisect
import hashlib
import json
import statistics
import time
import weakref
from dataclasses import dataclass
from pathlib import Path

import torch

from quickdraft import kernels
from quickdraft.artifacts import written_whole
from quickdraft.models.base import Model

WIDTHS = (1, 2, 3, 4, 6, 8, 12, 16)
CONTEXT = 48  # committed tokens the measured passes attend to
ROUNDS = 5  # at most, after the warm-up
VERSION = 1  # of the stored tables' meaning

_MEMORY: dict[str, VerifyCosts] = {}
_KEYS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> its key


@dataclass(frozen=True, slots=True)
class VerifyCosts:
    """seconds[i]: the median time of one forward of widths[i] new tokens, one row."""

    widths: tuple[int, ...]
    seconds: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.widths or len(self.widths) != len(self.seconds):
            raise ValueError("verify costs: one time per width, at least one")
        if list(self.widths) != sorted(set(self.widths)) or self.widths[0] < 1:
            raise ValueError(f"verify costs: widths must rise from >= 1, got {self.widths}")
        if not all(s > 0 and s < float("inf") for s in self.seconds):
            raise ValueError(f"verify costs: times must be positive, got {self.seconds}")

    def __call__(self, tokens: float) -> float:
        """Seconds for a pass of ``tokens`` (>= 1): piecewise linear between the measured
        widths, on the last segment's slope past the widest, proportional below the first."""
        widths, seconds = self.widths, self.seconds
        if tokens <= widths[0]:
            return seconds[0] * tokens / widths[0]
        i = min(bisect.bisect_left(widths, tokens), len(widths) - 1)
        if i == 0:
            return seconds[0]
        slope = (seconds[i] - seconds[i - 1]) / (widths[i] - widths[i - 1])
        return max(seconds[i - 1] + max(slope, 0.0) * (tokens - widths[i - 1]), 1e-9)

    def monotone(self) -> VerifyCosts:
        """The table with each time at least the one before it: a wider pass never costs less
        (noise in a measurement can say otherwise, and the slope past the widest must not
        fall)."""
        seconds, top = [], 0.0
        for value in self.seconds:
            top = max(top, value)
            seconds.append(top)
        return VerifyCosts(self.widths, tuple(seconds))

    def to_json(self) -> dict:
        return {"version": VERSION, "widths": list(self.widths), "seconds": list(self.seconds)}

    @classmethod
    def from_json(cls, data: object) -> VerifyCosts:
        if not isinstance(data, dict) or data.get("version") != VERSION:
            raise ValueError("verify costs: another version")
        return cls(tuple(int(w) for w in data["widths"]), tuple(float(s) for s in data["seconds"]))


def verify_costs(target: Model, budget: float = 1.0, store: bool = True) -> VerifyCosts:
    """The target's verify costs on this host: from memory, from the cache, else measured
    (about ``budget`` seconds) and stored there (``store``)."""
    key = _KEYS.get(target) if _weak(target) else None
    if key is None:
        key = _key(target)  # a forward of the model: once per model object
        if _weak(target):
            _KEYS[target] = key
    known = _MEMORY.get(key)
    if known is not None:
        return known
    path = _root() / f"{key}.json"
    try:
        costs = VerifyCosts.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        costs = measure(target, budget)
        if store:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                with written_whole(path) as partial:
                    partial.write_text(json.dumps(costs.to_json()))
            except OSError:
                pass  # a read-only cache: measured again next time
    _MEMORY[key] = costs
    return costs


def measure(target: Model, budget: float = 1.0) -> VerifyCosts:
    """One warm-up pass of each width, then rounds until ``budget`` seconds or ``ROUNDS``."""
    context = max(1, min(CONTEXT, target.max_positions - WIDTHS[-1] - 1))
    widths = tuple(w for w in WIDTHS if context + w <= target.max_positions) or (1,)
    cache = target.new_cache(1, context + widths[-1] + 1)
    device = target.device
    with torch.inference_mode():
        prompt = _tokens(context, target.vocab_size, device)
        target.forward(prompt, torch.arange(context, device=device).unsqueeze(0), cache)
        cache.commit(context)
        passes = {
            w: (
                _tokens(w, target.vocab_size, device, offset=context),
                torch.arange(context, context + w, device=device).unsqueeze(0),
            )
            for w in widths
        }
        times: dict[int, list[float]] = {w: [] for w in widths}
        start = time.perf_counter()
        for round_ in range(ROUNDS + 1):
            for w, (tokens, positions) in passes.items():
                _sync(device)
                tick = time.perf_counter()
                target.forward(tokens, positions, cache)  # scratch: never committed
                _sync(device)
                if round_:  # the first round warms up
                    times[w].append(time.perf_counter() - tick)
            if round_ and time.perf_counter() - start > budget:
                break
    measured = VerifyCosts(widths, tuple(max(statistics.median(times[w]), 1e-9) for w in widths))
    return measured.monotone()


def _weak(target: Model) -> bool:
    """Whether ``target`` can key a weak dictionary (hashable and weakly referenced)."""
    try:
        weakref.ref(target)
        hash(target)
    except TypeError:
        return False
    return True


def _tokens(count: int, vocab: int, device: torch.device, offset: int = 0) -> torch.Tensor:
    return ((torch.arange(offset, offset + count) * 7919 + 11) % vocab).unsqueeze(0).to(device)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _key(target: Model) -> str:
    """Host and model: the CPU, its flags, torch's threads and the compiled kernels' build;
    the model's logits on a fixed input (weights and quantization), its class and device."""
    device = target.device
    tokens = _tokens(4, target.vocab_size, device)
    positions = torch.arange(4, device=device).unsqueeze(0)
    with torch.inference_mode():
        logits = target.forward(tokens, positions, target.new_cache(1, 5)).logits
    digest = hashlib.sha256()
    digest.update(logits.float().cpu().round(decimals=2).numpy().tobytes())
    for part in (
        type(target).__name__,
        str(device),
        str(target.vocab_size),
        _cpu(),
        str(torch.get_num_threads()),
        kernels.best_path(),  # the compiled path that runs (or the PyTorch reference) ...
        kernels.EXTENSION.key(),  # ... of which build: other costs
        torch.__version__,
    ):
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()[:20]


def _cpu() -> str:
    """The CPU's model name and flags (/proc/cpuinfo's first processor), or "" elsewhere."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    lines = text.splitlines()
    name = next((x for x in lines if x.startswith("model name")), "")
    flags = next((x for x in lines if x.startswith("flags")), "")
    return name + " " + " ".join(sorted(set(flags.split(":", 1)[-1].split())))


def _root() -> Path:
    return kernels.cache_root() / "costs"
