"""Training EAGLE drafters on a frozen target: ``quickdraft train eagle``.

1. features: the target's final hidden states (and, for EAGLE-3, the inputs of its three
   feature layers) over a balanced sample of the corpus, fp16, cached in shards on disk within
   a size bound; each sequence keeps ``context`` tokens before its reply (by default its whole
   prompt), so the draft layer learns to attend to a prompt as it will when drafting: a
   reply that copies from its prompt can only be learnt with the prompt in view;
2. draft vocabulary: the ``draft_vocab`` most frequent tokens of the training text (the
   target's own replies, when the corpus is self-generated), filled up in id order;
3. training: the draft net unrolled for ``steps`` steps over whole sequences
   (``EagleNet.unroll``: step j drafts token t + 2 + j from its own step j - 1 state, the
   training-time test of EAGLE-3); each step's loss is the cross-entropy to the target's own
   distribution over the draft vocabulary at that position, weighted ``decay``^j; EAGLE-1 adds
   the feature regression (smooth L1 to the target's next feature) and noise on its input
   features, as in the paper. AdamW, one-cycle schedule, gradient clipping; checkpoints after
   every epoch and every ``checkpoint_every`` steps, which an interrupted run resumes from;
   any number of processes, gradient accumulation and mixed precision through accelerate
   (``train.common.Run``: the result does not depend on the process count);
4. metrics: on held-out sequences, each step's top-1 agreement with the target's own token.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict, replace
from functools import partial
from pathlib import Path

import torch

from quickdraft.drafters.eagle.net import EagleConfig, EagleNet
from quickdraft.models.llama import LlamaRunner
from quickdraft.train.common import (
    Run,
    Scaling,
    fingerprint,
    folder_digest,
    global_batches,
    one_cycle,
    running_processes,
)
from quickdraft.train.eagle_features import (
    EagleFeatures,
    draft_vocabulary,
    extract,
    feature_bytes,
    sequence_key,
    store_folder,
)
from quickdraft.train.eagle_objective import (
    EagleTraining,
    Objective,
    collate,
    scored_counts,
    step_losses,
)

Progress = Callable[[str, int, int], None]


def split_held_out(count: int, fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """(training, held-out) indices of ``count`` sequences: the same split for the same
    ``seed``, so runs that continue one another (``--init``) never train on what an earlier
    one held out."""
    order = torch.randperm(count, generator=torch.Generator().manual_seed(seed)).tolist()
    held = max(1, round(fraction * count))
    return order[held:], order[:held]


def _batches(lengths: list[int], indices: list[int], size: int, seed: int) -> list[list[int]]:
    """Sequences of similar length together (less padding), batches in random order."""
    batches = global_batches(sorted(indices, key=lambda i: lengths[i]), size)
    order = torch.randperm(len(batches), generator=torch.Generator().manual_seed(seed)).tolist()
    return [batches[i] for i in order]


def train_net(
    features: EagleFeatures,
    config: EagleConfig,
    draft_vocab: torch.Tensor,
    embed: torch.Tensor,
    lm_head: torch.Tensor,
    settings: EagleTraining,
    checkpoint: Path,
    progress: Progress | None = None,
    scaling: Scaling | None = None,
) -> tuple[EagleNet, dict]:
    """A draft net trained on the training split of ``features`` with the target's frozen
    ``embed`` [V, d] and ``lm_head`` [V, d]; its state lives in the folder ``checkpoint``,
    which a run with the same settings resumes from. Returns the net and its metrics."""
    train_ids, held_ids = split_held_out(len(features), settings.validation_fraction, settings.seed)
    if not train_ids:
        raise ValueError("features: too few sequences to train on and to hold out")
    torch.manual_seed(settings.seed)
    net = EagleNet(config)
    if settings.init is not None:
        _start_from(net, Path(settings.init))
    net.draft_vocab = draft_vocab.clone()
    optimizer = torch.optim.AdamW(
        net.parameters(), lr=settings.lr, weight_decay=settings.weight_decay
    )
    lengths = [t.numel() for t in features.tokens]
    per_epoch = len(_batches(lengths, train_ids, settings.batch_size, settings.seed))
    total = settings.epochs * per_epoch
    schedule = one_cycle(optimizer, settings.lr, total)
    identity = {"settings": _settings_record(settings), "sequences": len(features)}
    run = Run(
        Objective(net, settings), optimizer, schedule, checkpoint, identity, scaling or Scaling(),
        clip=settings.clip,
    )  # fmt: skip
    run.resume()
    device = run.device
    embed, head = embed.to(device), lm_head[draft_vocab].to(device)

    def step(batch_ids: list[int]) -> float:
        counts = scored_counts(features, batch_ids, settings.steps).clamp_min(1).to(device)
        return run.update(
            batch_ids,
            lambda piece: run.model(
                collate(features, piece, settings.steps, device), embed, head, counts, run.scale
            ),
        )

    history = run.train(
        settings.epochs,
        lambda epoch: _batches(lengths, train_ids, settings.batch_size, settings.seed + epoch),
        step,
        settings.checkpoint_every,
        progress,
        "draft layer",
    )
    net = run.module.net.eval()
    held = evaluate(net, features, held_ids, embed, lm_head.to(device), settings, device)
    metrics = {
        "history": history,
        "train_sequences": len(train_ids),
        "held_sequences": len(held_ids),
        "held_out": held,
    }
    return net.cpu(), metrics


def _start_from(net: EagleNet, folder: Path) -> None:
    """Load the layers of the drafter saved in ``folder`` into ``net`` (``EagleTraining.init``);
    one error naming the folder when it was made for another target, variant or shape."""
    from quickdraft.drafters.eagle.io import load_eagle

    start = load_eagle(folder)
    if start.config.own_head:
        raise ValueError(f"init: {folder} scores an LM head of its own, not the target's rows")
    theirs = replace(start.config, draft_vocab_size=net.config.draft_vocab_size)
    if theirs != net.config:
        differ = [
            f"{name} {getattr(theirs, name)!r} (here {getattr(net.config, name)!r})"
            for name in net.config.to_dict()
            if getattr(theirs, name) != getattr(net.config, name)
        ]
        raise ValueError(f"init: {folder} was trained for another drafter: " + ", ".join(differ))
    state = start.state_dict()
    state["draft_vocab"] = net.draft_vocab
    net.load_state_dict(state)


def _settings_record(settings: EagleTraining) -> dict:
    record = asdict(settings)
    record["variant"] = str(settings.variant)
    return record


def head_argmax(states: torch.Tensor, head: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
    """The top row of ``head`` [V, d] for each of ``states`` [n, d], ``chunk`` states at a time:
    a batch's logits over a 151,936-token vocabulary at once are GBs (fp32), and an allocator
    that keeps what it frees (jemalloc, as training wants) kept them until the 1.5B's
    evaluation ran out of memory."""
    return torch.cat([(piece @ head.T).argmax(-1) for piece in states.split(chunk)])


@torch.inference_mode()
def evaluate(
    net: EagleNet,
    features: EagleFeatures,
    ids: list[int],
    embed: torch.Tensor,
    lm_head: torch.Tensor,
    settings: EagleTraining,
    device: torch.device,
    target_token: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> dict:
    """On held-out sequences, per unrolled step: how often the draft's top token is the
    target's own (its argmax over the whole vocabulary, which a draft vocabulary can miss),
    and how often the target's token lies in the draft vocabulary at all. Step j is teacher-
    forced along the text, so along a self-generated reply its agreement is the chance that
    draft position j + 1 is accepted given the ones before it were. ``target_token``: the
    target's token from its final hidden states [n, d] (default: the argmax of
    ``lm_head``; a quantized target passes its own head)."""
    if target_token is None:
        target_token = partial(head_argmax, head=lm_head)
    vocab = net.draft_vocab.to(device)
    head = lm_head[vocab]
    hits = torch.zeros(settings.steps)
    inside = torch.zeros(settings.steps)
    counts = torch.zeros(settings.steps)
    lengths = [t.numel() for t in features.tokens]
    for batch_ids in _batches(lengths, ids, settings.batch_size, 0):
        batch = collate(features, batch_ids, settings.steps, device)
        _, seen = step_losses(net, embed, head, batch, settings, noise=False)
        # The target's own token at every label place once (over the whole vocabulary it
        # costs what the draft layer does; the steps share most places).
        own = target_token(seen[0]["teachers"]) if seen else None
        for record in seen:
            j = record["step"]
            choice = own[record["place"]]
            hits[j] += float((vocab[record["draft"]] == choice).sum())
            inside[j] += float(torch.isin(choice, vocab).sum())
            counts[j] += choice.numel()
    agreement = hits / counts.clamp_min(1)
    return {
        "agreement_by_step": [round(float(x), 4) for x in agreement],
        "in_draft_vocab_by_step": [round(float(x), 4) for x in inside / counts.clamp_min(1)],
        "positions": int(counts[0]),
        # A greedy chain accepts position j + 1 only when every earlier one was accepted.
        "expected_chain_accepted_length": round(float(1 + agreement.cumprod(0).sum()), 3),
    }


def load_feature_target(name: str, quant: str | None) -> tuple[LlamaRunner, object]:
    """The target whose features a drafter learns from: ``quant`` "q4" or "int8" (the
    quantized target itself), "bf16" (float weights in bfloat16) or None (float32)."""
    from quickdraft.models.loading import load_model

    if quant == "bf16":
        target, tokenizer = load_model(name, dtype=torch.bfloat16)
    else:
        target, tokenizer = load_model(name, quant=quant)
    if not isinstance(target, LlamaRunner):
        raise ValueError(f"target: EAGLE training needs the native runner, got {type(target)}")
    return target, tokenizer


def train_eagle(
    target_name: str,
    data: list[str],
    settings: EagleTraining,
    out: Path,
    cache: Path,
    budget_tokens: int = 150_000,
    max_tokens: int = 512,
    context: int | None = None,
    max_cache_gb: float = 8.0,
    progress: Progress | None = None,
    scaling: Scaling | None = None,
    quant: str | None = None,
) -> dict:
    """The whole command: sample the corpus, extract features, choose the draft vocabulary,
    train, save the drafter (``drafters.eagle.io.save_eagle``) and metrics into ``out``.
    Under ``accelerate launch`` the first process extracts the features (the others read its
    shards) and writes the drafter. ``quant``: the target's weights while extracting
    features ("q4", "int8": the target the drafter will draft for; "bf16": float weights in
    bfloat16; None: float32). Measured prefill rates on the 1.5B, 2 cores: on an AMD EPYC
    (Zen 4, VNNI) q4 124 tokens/s, float32 76; on an Intel Xeon with AMX, q4 190 and bf16
    569, so bf16 features are the fast way there; on a CPU without AMX or AVX-512 bf16 they
    are slow (0.3 GFLOP/s on an AVX2 EPYC): take q4 there. A drafter trained on bf16
    features loses nothing drafting from the q4 target's: the 0.5B's agrees with it on 64.5%
    of held-out positions from q4 features, 64.6% from bf16 ones
    (``benchmarks/results/eagle_feature_quant``)."""
    from quickdraft.drafters.eagle.io import save_eagle
    from quickdraft.train.corpus import balanced_sample, read_records, tokenize

    # The drafter attends over the whole prompt when drafting, so by default it trains so too.
    context = max_tokens if context is None else context
    if budget_tokens < 1 or max_tokens < 2 or context < 0:
        raise ValueError("budget_tokens must be >= 1, max_tokens >= 2 and context >= 0")
    if not max_cache_gb > 0:
        raise ValueError(f"max_cache_gb must be > 0, got {max_cache_gb}")
    target, tokenizer = load_feature_target(target_name, quant)
    if settings.draft_vocab > target.vocab_size:
        raise ValueError(
            f"draft_vocab: {settings.draft_vocab} exceeds the target's vocabulary "
            f"({target.vocab_size})"
        )
    config = EagleConfig.for_target(
        target.config, settings.variant, settings.draft_vocab,
        intermediate_size=settings.intermediate_size,
    )  # fmt: skip
    records = read_records(list(data))
    sequences = [tokenize(r, tokenizer, max_tokens) for r in records]
    sample = balanced_sample(sequences, budget_tokens, settings.seed)
    size = feature_bytes(sample, context, config.hidden_size, len(config.feature_layers))
    if size > max_cache_gb * 2**30:
        raise ValueError(
            f"max_cache_gb: the features would take {size / 2**30:.1f} GB; lower "
            "--budget-tokens or --context, or raise --max-cache-gb"
        )
    feature_settings = {
        "target": target_name,
        "data": [str(d) for d in data],
        "budget_tokens": budget_tokens,
        "max_tokens": max_tokens,
        "context": context,
        "layers": list(config.feature_layers),
        "seed": settings.seed,
    }
    if quant is not None:  # float features keep the fingerprints they always had
        feature_settings["quant"] = quant
    folder = store_folder(cache, target_name, context, config.feature_layers, quant)
    processes = running_processes()
    with processes.main_process_first():
        shown = progress if processes.is_main_process else None
        features = extract(target, sample, config.feature_layers, context, folder, shown)
    vocab = draft_vocabulary(features, settings.draft_vocab, target.vocab_size)
    # The checkpoints' key names the sample's content too: a corpus file that grew between
    # sessions is another run, not this one resumed over other sequences.
    contents = hashlib.sha256("".join(map(sequence_key, sample)).encode()).hexdigest()[:16]
    # And the --init drafter's content, not its path: training again from a folder that a run
    # has since rewritten (more epochs on the same folder) must not resume the old run.
    start = {"init_contents": folder_digest(settings.init)} if settings.init else {}
    key = fingerprint(
        {**feature_settings, **_settings_record(settings), "sample": contents, **start}
    )
    embed = target.embed.float()
    lm_head = target.head_weight.float()[: target.vocab_size]
    net, metrics = train_net(
        features, config, vocab, embed, lm_head, settings, cache / f"eagle-{key}", progress,
        scaling,
    )  # fmt: skip
    record = {
        "target": target_name,
        "features": {**feature_settings, "sequences": len(sample), "bytes": size},
        "training": _settings_record(settings),
        **metrics,
    }
    if processes.is_main_process:
        save_eagle(out, net, {"target": target_name, "training": _settings_record(settings)})
        (out / "metrics.json").write_text(json.dumps(record, indent=2) + "\n")
    processes.wait_for_everyone()
    return record
