"""What every drafter training loop shares: its schedule, its global batches, and one run
through accelerate (processes, gradient accumulation, mixed precision, resumable state).

A run's result does not depend on how it is cut. ``batch_size`` is the global batch of one
optimizer step; each process takes ``batch[rank::processes]`` of it and cuts its share into
``accumulation_steps`` pieces. Every loss is a sum over its piece's scored positions divided
by the count over the whole global batch (which every process can compute from the batch
itself), times ``processes * accumulation_steps`` to undo the mean that
DistributedDataParallel and ``Accelerator.backward`` each take. The gradient is then the
global batch's mean whatever the process count, up to float summation order: one process
with batch 8 and two with 4 each take the same steps.

accelerate's prepared data loader is not used: its ``split_batches`` needs every batch
divisible by the process count and pads an uneven one by repeating samples, which would
change the objective; the slicing here does not.

A run is stopped between steps, never inside one: inside ``Run.stoppable()`` the first Ctrl-C
or SIGTERM (how a background job is stopped: its shell ignores SIGINT) asks for a stop, and
``Run.after_step`` then saves the step just finished and raises KeyboardInterrupt, so a run
that spans sessions loses nothing when it is stopped, not up to ``checkpoint_every`` steps.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import nn

from quickdraft.artifacts import ArtifactError

if TYPE_CHECKING:
    from accelerate import PartialState

T = TypeVar("T")

PRECISIONS = ("auto", "no", "bf16", "fp16")


def fingerprint(settings: dict) -> str:
    """A short stable key of JSON-able settings: cache folders and checkpoints are named by it."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def _flat(record: dict, prefix: str = "") -> dict:
    """A nested record's leaves by dotted name (``settings.steps``)."""
    flat = {}
    for name, value in record.items():
        if isinstance(value, dict):
            flat |= _flat(value, f"{prefix}{name}.")
        else:
            flat[f"{prefix}{name}"] = value
    return flat


def sample_digest(sample: Iterable[Any]) -> str:
    """What a training sample holds (each sequence's tokens and first scored position): its
    features and checkpoints are keyed by it, so a data file that changed at the same path
    makes another run instead of resuming, or reusing, the old one."""
    digest = hashlib.sha256()
    for sequence in sample:
        digest.update(json.dumps([sequence.tokens, sequence.start]).encode())
    return digest.hexdigest()[:16]


def folder_digest(folder: str | Path) -> str:
    """What a saved drafter folder holds (its weights and config, by name): a run started from it
    (``--init``) or reading it (``--eagle-dir``) is keyed by its content, not its path, which a
    later run may have rewritten."""
    digest = hashlib.sha256()
    for path in sorted(Path(folder).iterdir()):
        weights = path.suffix in (".safetensors", ".pt")
        if path.is_file() and (weights or path.name in ("eagle.json", "config.json")):
            digest.update(path.name.encode())
            with path.open("rb") as handle:
                for block in iter(lambda: handle.read(1 << 22), b""):
                    digest.update(block)
    return digest.hexdigest()[:16]


def check_settings(settings: object, counts: Sequence[str]) -> None:
    """What every training run's settings share: ``counts`` integers >= 1, ``lr`` > 0,
    ``validation_fraction`` in (0, 1), and ``decay`` in (0, 1] where there is one; ValueError
    naming the field otherwise."""
    for name in counts:
        value = getattr(settings, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    lr, fraction = settings.lr, settings.validation_fraction
    if not lr > 0:
        raise ValueError(f"lr must be > 0, got {lr}")
    decay = getattr(settings, "decay", None)
    if decay is not None and not 0 < decay <= 1:
        raise ValueError(f"decay must be in (0, 1], got {decay}")
    if not 0 < fraction < 1:
        raise ValueError(f"validation_fraction must be in (0, 1), got {fraction}")


def one_cycle(
    optimizer: torch.optim.Optimizer, lr: float, total: int
) -> torch.optim.lr_scheduler.LRScheduler:
    """One-cycle learning rate over ``total`` steps (10% warm-up); a constant rate when there
    are too few steps for a warm-up phase."""
    if total >= 20:
        return torch.optim.lr_scheduler.OneCycleLR(optimizer, lr, total_steps=total, pct_start=0.1)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)


def global_batches(items: Sequence[T], size: int) -> list[list[T]]:
    """``items`` in consecutive batches of ``size``; a last batch under half the size joins
    the one before it (a tiny batch would be a noisy step, and could not be cut among
    processes)."""
    batches = [list(items[i : i + size]) for i in range(0, len(items), size)]
    if len(batches) > 1 and 2 * len(batches[-1]) < size:
        batches[-2] += batches.pop()
    return batches


def running_processes() -> PartialState:
    """The processes of this run: one, or those ``torchrun``/``accelerate launch`` started
    (gloo on CPUs). Asked the same way everywhere, so the first question fixes the answer."""
    from accelerate import PartialState

    return PartialState(cpu=not torch.cuda.is_available())


@dataclass(frozen=True, slots=True)
class Scaling:
    """How a run is spread: ``accumulation_steps`` pieces per process and optimizer step
    (memory, not arithmetic: the result is the same), and the precision of the forward and
    backward passes: ``auto`` is bf16 on a GPU that has it, else full precision."""

    accumulation_steps: int = 1
    mixed_precision: str = "auto"

    def __post_init__(self) -> None:
        steps = self.accumulation_steps
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
            raise ValueError(f"accumulation_steps must be an integer >= 1, got {steps!r}")
        if self.mixed_precision not in PRECISIONS:
            raise ValueError(
                f"mixed_precision must be one of {', '.join(PRECISIONS)}, "
                f"got {self.mixed_precision!r}"
            )

    def precision(self) -> str:
        if self.mixed_precision != "auto":
            return self.mixed_precision
        gpu = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        return "bf16" if gpu else "no"


# Where Debian's and Red Hat's packages put jemalloc.
JEMALLOC_PATHS = (
    Path("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"),
    Path("/usr/lib/aarch64-linux-gnu/libjemalloc.so.2"),
    Path("/usr/lib64/libjemalloc.so.2"),
)
KEEP_FREED = "MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1"


def allocator_note(environ: Mapping[str, str], paths: Sequence[Path], gpu: bool) -> str | None:
    """A line for a CPU training run under the C library's allocator. Each training step
    allocates and frees tensors of tens of MB; glibc returns them to the kernel, which zeroes
    every page again on the next step: on the 1.5B's EAGLE run (AMD EPYC, 2 threads) a third
    of the CPU time went to the kernel, and the steps a minute rose from about 10.5 to 16 under
    jemalloc told to keep freed memory. An allocator is a process's own, chosen before it
    starts, so this says how rather than doing it."""
    if gpu or sys.platform != "linux" or "malloc" in environ.get("LD_PRELOAD", ""):
        return None
    found = next((p for p in paths if p.exists()), None)
    run = (
        f"LD_PRELOAD={found} {KEEP_FREED} quickdraft train ..."
        if found
        else "install jemalloc (Debian: apt-get install libjemalloc2), then LD_PRELOAD it "
        f"with {KEEP_FREED}"
    )
    return (
        "CPU training spends about a third of its time zeroing memory glibc gave back; about "
        f"1.5x the steps a minute with jemalloc keeping it: {run}"
    )


class Run:
    """One training run of ``module`` (whose forward returns the loss of a piece) through
    accelerate. Its state (weights, optimizer, schedule, every process's random state, the
    history) is saved under ``folder`` with ``identity`` (settings and data size), and a run
    with the same identity resumes from it."""

    def __init__(
        self,
        module: nn.Module,
        optimizer: torch.optim.Optimizer,
        schedule: torch.optim.lr_scheduler.LRScheduler,
        folder: Path,
        identity: dict,
        scaling: Scaling,
        clip: float | None = None,
    ):
        from accelerate import Accelerator
        from accelerate.state import AcceleratorState

        precision = scaling.precision()
        if int(os.environ.get("WORLD_SIZE", "1")) == 1:
            # accelerate keeps one state per process and refuses another precision once set;
            # one process may train several drafters (a notebook, a test run), each its own way.
            AcceleratorState._reset_state(reset_partial_state=True)
        self.accelerator = Accelerator(
            cpu=not torch.cuda.is_available(),
            mixed_precision=precision,
            gradient_accumulation_steps=scaling.accumulation_steps,
            # The schedule counts optimizer steps: one step of it per optimizer step.
            step_scheduler_with_optimizer=False,
        )
        self.model, self.optimizer, self.schedule = self.accelerator.prepare(
            module, optimizer, schedule
        )
        # Stored as JSON, compared as JSON (tuples read back as lists).
        self.identity = json.loads(json.dumps({**identity, "mixed_precision": precision}))
        self.folder, self.clip = folder, clip
        note = allocator_note(os.environ, JEMALLOC_PATHS, self.device.type != "cpu")
        if note is not None and self.is_main:
            warnings.warn(note, stacklevel=2)
        self.scaling = scaling
        self.history: list[dict] = []
        self.step = 0
        self._stop_asked = False

    @property
    def device(self) -> torch.device:
        return self.accelerator.device

    @property
    def is_main(self) -> bool:
        return self.accelerator.is_main_process

    @property
    def module(self) -> nn.Module:
        """The module itself, unwrapped from DistributedDataParallel."""
        return self.accelerator.unwrap_model(self.model)

    @property
    def scale(self) -> int:
        """By how much a piece's loss is multiplied (see the module's docstring)."""
        return self.accelerator.num_processes * self.scaling.accumulation_steps

    def check(self, batches: list[list]) -> None:
        """Every global batch must give every process a non-empty piece per accumulation step:
        a process without a backward pass would leave the others waiting."""
        smallest = min(len(b) for b in batches)
        if smallest < self.scale:
            raise ValueError(
                f"batch_size: the smallest batch ({smallest}) cannot be cut for "
                f"{self.accelerator.num_processes} processes x "
                f"{self.scaling.accumulation_steps} accumulation steps; raise batch_size or "
                "lower either"
            )

    def pieces(self, batch: list[T]) -> list[list[T]]:
        """This process's share of a global batch, cut into one piece per accumulation step."""
        mine = batch[self.accelerator.process_index :: self.accelerator.num_processes]
        cuts = self.scaling.accumulation_steps
        return [mine[i * len(mine) // cuts : (i + 1) * len(mine) // cuts] for i in range(cuts)]

    def update(self, batch: list[T], loss_of: Callable[[list[T]], torch.Tensor]) -> float:
        """One optimizer step over a global batch; ``loss_of(piece)`` runs the prepared model.
        Returns the global batch's loss (the same figure on every process)."""
        total = torch.zeros((), device=self.device)
        for piece in self.pieces(batch):
            with self.accelerator.accumulate(self.model):
                loss = loss_of(piece)
                self.accelerator.backward(loss)
                total += loss.detach().float()
                if self.accelerator.sync_gradients:
                    if self.clip is not None:
                        self.accelerator.clip_grad_norm_(self.model.parameters(), self.clip)
                    self.optimizer.step()
                    self.schedule.step()
                    self.optimizer.zero_grad(set_to_none=True)
        return float(self.accelerator.reduce(total, reduction="sum")) / self.scale

    @contextlib.contextmanager
    def stoppable(self) -> Iterator[None]:
        """While inside, the first Ctrl-C or SIGTERM asks the run to stop after the step in
        progress (``after_step`` saves it); a second one stops it at once, as before. Signals
        are the main thread's: from another thread this changes nothing."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def ask(signum: int, frame: object) -> None:
            if self._stop_asked:
                raise KeyboardInterrupt
            self._stop_asked = True
            print(
                "stopping after this step, once its checkpoint is saved (again to stop now)",
                file=sys.stderr,
                flush=True,
            )

        previous = {sig: signal.signal(sig, ask) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def after_step(self, step: int, every: int, last: bool = False) -> None:
        """After optimizer step ``step`` (counted from 1): save every ``every`` steps and at an
        epoch's ``last`` step, and when a stop was asked on any process, save and raise
        KeyboardInterrupt on all of them."""
        asked = self._stop_asked
        if self.accelerator.num_processes > 1:  # all stop at the same step, or none does
            flag = torch.tensor([float(asked)], device=self.device)
            asked = bool(self.accelerator.reduce(flag, reduction="sum").item() > 0)
        if asked or last or step % every == 0:
            self.save(step)
        if asked:
            raise KeyboardInterrupt

    def train(
        self,
        epochs: int,
        batches_of: Callable[[int], list[list[T]]],
        step: Callable[[list[T]], float],
        every: int,
        progress: Callable[[str, int, int], None] | None = None,
        stage: str = "training",
    ) -> list[dict]:
        """The epochs from the resumed step on. ``batches_of(epoch)``: that epoch's global
        batches, as many every epoch; it is called for every epoch in order, skipped ones
        too, so seeded shuffles repeat on resume. ``step(batch)``: one optimizer step
        (``update``), returning its loss. Saves every ``every`` steps and at each epoch's end;
        Ctrl-C or SIGTERM stop it after a step, saved. Returns the history: each epoch's mean
        training loss (over the steps this run took of it)."""
        done = self.step
        with self.stoppable():
            for epoch in range(epochs):
                batches = batches_of(epoch)
                self.check(batches)
                self.model.train()
                running, counted, total = 0.0, 0, epochs * len(batches)
                for index, batch in enumerate(batches):
                    global_step = epoch * len(batches) + index
                    if global_step < done:
                        continue
                    running += step(batch)
                    counted += 1
                    if progress is not None and self.is_main:
                        progress(stage, global_step + 1, total)
                    last = index + 1 == len(batches)
                    if last:  # recorded before the epoch's state is saved, so a stop keeps it
                        self.history.append({"epoch": epoch + 1, "train_loss": running / counted})
                    self.after_step(global_step + 1, every, last)
        return self.history

    def resume(self) -> None:
        """Load the saved state, when there is one made with the same identity."""
        pointer = self.folder / "latest"
        if not pointer.exists():
            return
        state = self.folder / pointer.read_text().strip()
        try:
            record = json.loads((state / "progress.json").read_text())
            identity, history, step = record["identity"], record["history"], record["step"]
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise ArtifactError(
                state, f"not a quickdraft training state ({error})", "delete the folder"
            ) from None
        if identity != self.identity:
            saved, now = _flat(identity), _flat(self.identity)
            differ = [
                f"{name} {saved.get(name)!r} (now {now.get(name)!r})"
                for name in sorted(set(saved) | set(now))
                if saved.get(name) != now.get(name)
            ]
            raise ValueError(
                f"checkpoint: {self.folder} was made with other settings or data: "
                f"{', '.join(differ)}; give those again to resume, or delete the folder to start "
                "over"
            )
        self.accelerator.load_state(str(state))
        self.history, self.step = history, step

    def save(self, step: int) -> None:
        """Write the state after ``step`` optimizer steps into a folder of its own, then point
        ``latest`` at it (a rename, so an interruption leaves the previous state whole)."""
        self.step = step
        name = f"step-{step:07d}"
        state = self.folder / name
        self.accelerator.save_state(str(state))  # each process writes its random state
        self.accelerator.wait_for_everyone()
        if self.is_main:
            record = {"identity": self.identity, "history": self.history, "step": step}
            (state / "progress.json").write_text(json.dumps(record, indent=1) + "\n")
            pointer = self.folder / "latest"
            pointer.with_suffix(".tmp").write_text(name + "\n")
            pointer.with_suffix(".tmp").rename(pointer)
            for old in self.folder.glob("step-*"):
                if old.name != name:
                    shutil.rmtree(old)
        self.accelerator.wait_for_everyone()
