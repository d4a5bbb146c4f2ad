"""Training Medusa heads on a frozen target: ``quickdraft train medusa``.

1. features: the target's final hidden state h_t and its own next-token choice (argmax) at every
   position of a balanced sample of the corpus, cached in shards (an interrupted run resumes);
2. heads: head i (1-based) learns from h_t the token the target itself would write i places
   after the next one, argmax at t + i given the text (self-distillation on real text, which
   is what greedy verification checks). Joint loss sum_i decay^(i-1) * CE_i through the target's
   frozen LM head (Medusa-1), AdamW with one-cycle schedule; a checkpoint after every epoch
   and every ``checkpoint_every`` steps, which an interrupted run resumes from;
3. metrics: on held-out sequences, each head's top-1 and top-k accuracy.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from quickdraft.drafters.medusa.net import MedusaConfig, MedusaHeads
from quickdraft.models.llama import LlamaRunner
from quickdraft.train.common import (
    Run,
    Scaling,
    check_settings,
    fingerprint,
    global_batches,
    one_cycle,
    running_processes,
    sample_digest,
)
from quickdraft.train.corpus import Sequence
from quickdraft.train.medusa_features import HeadFeatures, Progress, extract, head_labels, split


@dataclass(frozen=True, slots=True)
class MedusaTraining:
    num_heads: int = 3
    num_layers: int = 1
    own_head: bool = False
    epochs: int = 2
    batch_size: int = 32
    lr: float = 1e-3
    weight_decay: float = 0.0
    decay: float = 0.8
    validation_fraction: float = 0.1
    checkpoint_every: int = 200
    seed: int = 0
    # Head i learns the target's choice at t + i - 1 + label_offset: 1 for Medusa heads (head 1
    # predicts the token after the next), 0 for an early-exit head on a pruned model.
    label_offset: int = 1
    # Soft labels: the target's whole distribution there (its LM head on its hidden state at
    # that position, cross-entropy to it: Medusa-2's self-distillation), else its argmax.
    soft_labels: bool = True
    # With soft labels: score only this many tokens in the loss, the target's most frequent
    # choices in the training positions (0: the whole vocabulary). The heads still rank the
    # whole vocabulary when drafting; the loss costs as many fewer head rows (6x fewer at
    # 8192 of 49,152), and almost all of the target's probability mass lies in those rows.
    train_vocab: int = 0

    def __post_init__(self) -> None:
        counts = ("num_heads", "num_layers", "epochs", "batch_size", "checkpoint_every")
        check_settings(self, counts)
        if not isinstance(self.train_vocab, int) or self.train_vocab < 0:
            raise ValueError(f"train_vocab must be an integer >= 0, got {self.train_vocab!r}")
        if self.train_vocab and (self.own_head or not self.soft_labels):
            raise ValueError("train_vocab: needs soft labels through the target's own LM head")
        if self.label_offset not in (0, 1):
            raise ValueError(f"label_offset must be 0 or 1, got {self.label_offset}")


class _Objective(nn.Module):
    """The training loss as a module's forward, so that DistributedDataParallel (which syncs
    gradients around ``forward``) sees the whole pass."""

    def __init__(self, heads: MedusaHeads):
        super().__init__()
        self.heads = heads

    def forward(
        self, hidden: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor,
        loss_head: torch.Tensor, weights: torch.Tensor, scale: float,
    ) -> torch.Tensor:  # fmt: skip
        """The piece's share of the global batch's loss. hidden [b, d]; labels [b, H, V]
        (distributions) or [b, H] (tokens); mask [b, H], already divided by each head's count
        of valid positions over the global batch."""
        logits = self.heads.logits(self.heads(hidden), loss_head)  # [b, H, V]
        losses = F.cross_entropy(logits.flatten(0, 1), labels.flatten(0, 1), reduction="none")
        return (losses.view(mask.shape) * mask * weights).sum() * scale


def train_heads(
    features: HeadFeatures,
    lm_head: torch.Tensor,
    settings: MedusaTraining,
    checkpoint: Path,
    progress: Progress | None = None,
    scaling: Scaling | None = None,
) -> tuple[MedusaHeads, dict]:
    """Heads trained on the training split of ``features`` through the frozen ``lm_head``
    [V, d]; their state lives in the folder ``checkpoint``, which a run with the same
    settings resumes from. Returns them and the metrics."""
    train_mask, held_mask = split(features, settings.validation_fraction, settings.seed)
    labels, valid = head_labels(features, settings.num_heads, settings.label_offset)
    rows = torch.nonzero(train_mask & valid[:, 0]).flatten()
    if rows.numel() == 0 or not bool((held_mask & valid[:, 0]).any()):
        raise ValueError("features: too few positions to train on and to hold out")
    config = MedusaConfig(
        features.hidden.shape[1],
        lm_head.shape[0],
        settings.num_heads,
        settings.num_layers,
        settings.own_head,
    )
    torch.manual_seed(settings.seed)
    heads = MedusaHeads(config, lm_head)
    optimizer = torch.optim.AdamW(
        heads.parameters(), lr=settings.lr, weight_decay=settings.weight_decay
    )
    steps_per_epoch = len(global_batches(range(rows.numel()), settings.batch_size))
    total = settings.epochs * steps_per_epoch
    schedule = one_cycle(optimizer, settings.lr, total)
    weights = settings.decay ** torch.arange(settings.num_heads, dtype=torch.float32)
    loss_head = lm_head
    if settings.train_vocab:
        counts = torch.bincount(features.choice[rows], minlength=lm_head.shape[0])
        order = torch.sort(counts, descending=True, stable=True).indices
        heads.vocab = order[: settings.train_vocab].clone()
        loss_head = lm_head[heads.vocab]
    identity = {"settings": asdict(settings), "positions": len(features)}
    run = Run(_Objective(heads), optimizer, schedule, checkpoint, identity, scaling or Scaling())
    run.resume()
    device = run.device
    loss_head, weights = loss_head.to(device), weights.to(device)

    def loss_of(piece: list[int], counts: torch.Tensor) -> torch.Tensor:
        batch = torch.tensor(piece, dtype=torch.long)
        if settings.soft_labels:
            wanted = soft_targets(features, batch, loss_head, settings)  # [b, H, V]
        else:
            wanted = labels[batch]
        mask = valid[batch].float() / counts
        hidden = features.hidden[batch].float().to(device)
        return run.model(hidden, wanted.to(device), mask.to(device), loss_head, weights, run.scale)

    def step(batch: list[int]) -> float:
        # Each head's valid positions over the whole global batch: the mean's divisor.
        counts = valid[batch].sum(0).float().clamp_min(1)
        return run.update(batch, partial(loss_of, counts=counts))

    generator = torch.Generator().manual_seed(settings.seed)

    def batches_of(epoch: int) -> list[list[int]]:  # the same shuffles on resume
        order = rows[torch.randperm(rows.numel(), generator=generator)]
        return global_batches(order.tolist(), settings.batch_size)

    history = run.train(
        settings.epochs, batches_of, step, settings.checkpoint_every, progress, "heads"
    )
    heads = run.module.heads.cpu().eval()
    metrics = {
        "history": history,
        "train_positions": int(rows.numel()),
        "held_positions": int((held_mask & valid[:, 0]).sum()),
        "held_out": evaluate(
            heads, features, held_mask, lm_head, settings.num_heads, offset=settings.label_offset
        ),
    }
    return heads, metrics


@torch.no_grad()
def soft_targets(
    features: HeadFeatures, batch: torch.Tensor, lm_head: torch.Tensor, settings: MedusaTraining
) -> torch.Tensor:
    """[b, H, V]: the target's distribution at the position each head's label comes from
    (rows past a sequence's end are masked out of the loss by the caller)."""
    last = len(features) - 1
    shifts = torch.arange(settings.num_heads) + settings.label_offset  # [H]
    where = (batch.unsqueeze(1) + shifts).clamp_max(last)  # [b, H]
    hidden = features.hidden[where].to(lm_head.device).float()
    return torch.softmax(F.linear(hidden, lm_head), dim=-1)


@torch.inference_mode()
def evaluate(
    heads: MedusaHeads,
    features: HeadFeatures,
    mask: torch.Tensor,
    lm_head: torch.Tensor,
    num_heads: int,
    ranks: int = 10,
    offset: int = 1,
) -> list[dict]:
    """Per head: how often the target's own token is its top-1, top-3, top-5 candidate, and
    ``rank_accuracy``: how often it is exactly its r-th candidate, r = 1..ranks (what
    ``drafters.medusa.fit_tree`` builds trees from)."""
    labels, valid = head_labels(features, num_heads, offset)
    rows = torch.nonzero(mask).flatten()
    hits = torch.zeros(num_heads, ranks)
    counts = torch.zeros(num_heads)
    vocab = heads.vocab  # heads trained on a token subset rank it alone, as when drafting
    head = lm_head if vocab is None else lm_head[vocab]
    for batch in rows.split(256):
        logits = heads.logits(heads(features.hidden[batch].float()), head)
        ranked = logits.topk(ranks, dim=-1).indices  # [b, H, R]
        if vocab is not None:
            ranked = vocab[ranked]
        match = (ranked == labels[batch].unsqueeze(-1)) & valid[batch].unsqueeze(-1)
        hits += match.sum(0).float()
        counts += valid[batch].sum(0).float()
    rank_accuracy = hits / counts.clamp_min(1).unsqueeze(1)  # [H, R]
    cumulative = rank_accuracy.cumsum(1)
    return [
        {
            "head": i + 1,
            **{f"top{k}": float(cumulative[i, k - 1]) for k in (1, 3, 5) if k <= ranks},
            "rank_accuracy": [round(float(x), 5) for x in rank_accuracy[i]],
        }
        for i in range(num_heads)
    ]


def build_heads(
    target_name: str,
    data: list[str],
    training: MedusaTraining,
    out: Path,
    cache: Path,
    budget_tokens: int = 60_000,
    max_tokens: int = 512,
    progress: Progress | None = None,
    scaling: Scaling | None = None,
) -> dict:
    """The whole command: sample the corpus, extract features, train, save heads and
    metrics into ``out``. Returns the metrics. Under ``accelerate launch`` the first process
    extracts the features (the others read its shards) and writes the heads."""
    from quickdraft.drafters.medusa.net import save_heads
    from quickdraft.models.loading import load_model
    from quickdraft.train.corpus import balanced_sample, read_records, tokenize

    if budget_tokens < 1 or max_tokens < 2:
        raise ValueError("budget_tokens must be >= 1 and max_tokens >= 2")
    target, tokenizer = load_model(target_name)
    if not isinstance(target, LlamaRunner):
        raise ValueError(f"target: Medusa training needs the native runner, got {type(target)}")
    records = read_records(list(data))
    sequences = [tokenize(r, tokenizer, max_tokens) for r in records]
    sample = balanced_sample(sequences, budget_tokens, training.seed)
    feature_settings = {
        "target": target_name,
        "data": [str(d) for d in data],
        "budget_tokens": budget_tokens,
        "max_tokens": max_tokens,
        "seed": training.seed,
        "sample": sample_digest(sample),  # a data file changed at the same path: another run
    }
    folder = cache / f"medusa-features-{fingerprint(feature_settings)}"
    processes = running_processes()
    with processes.main_process_first():
        features = extract(target, sample, folder, progress if processes.is_main_process else None)
    key = fingerprint({**feature_settings, **asdict(training)})
    lm_head = target.head_weight.float()[: target.vocab_size]
    heads, metrics = train_heads(
        features, lm_head, training, cache / f"medusa-{key}", progress, scaling
    )
    record = {
        "target": target_name,
        "features": {**feature_settings, "positions": len(features), "sequences": len(sample)},
        "training": asdict(training),
        **metrics,
    }
    accuracy = [row["rank_accuracy"] for row in metrics["held_out"]]
    if processes.is_main_process:
        metadata = {"target": target_name, "training": asdict(training), "rank_accuracy": accuracy}
        save_heads(out, heads, metadata)
        (out / "metrics.json").write_text(json.dumps(record, indent=2) + "\n")
    processes.wait_for_everyone()
    return record


def train_exit(
    target: LlamaRunner,
    num_layers: int,
    sequences: list[Sequence],
    training: MedusaTraining,
    cache: Path,
    progress: Progress | None = None,
) -> tuple[nn.Module, dict]:
    """An exit adapter for ``target`` pruned to ``num_layers`` layers: residual blocks on the
    pruned model's final state, trained toward the full model's own next-token choices through
    the shared LM head. Returns the adapter (for ``models.pruned.PrunedModel``) and metrics."""
    settings = dataclasses.replace(training, num_heads=1, label_offset=0)
    pruned = target.truncated(num_layers)
    key = {
        "target_layers": target.config.num_layers,
        "num_layers": num_layers,
        "vocab": target.vocab_size,
        "hidden": target.config.hidden_size,
        "sequences": fingerprint({"tokens": [s.tokens for s in sequences]}),
    }
    features = extract(
        pruned, sequences, cache / f"exit-features-{fingerprint(key)}", progress, target
    )
    lm_head = target.head_weight.float()[: target.vocab_size]
    checkpoint = cache / f"exit-{fingerprint({**key, **dataclasses.asdict(settings)})}"
    heads, metrics = train_heads(features, lm_head, settings, checkpoint, progress)
    return heads.blocks[0], metrics
