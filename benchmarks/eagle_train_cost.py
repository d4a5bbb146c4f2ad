"""What training an EAGLE-3 drafter costs on this machine, before starting one that takes
hours: the target's feature pass per token and one optimizer step of the draft layer, on
random weights shaped like a real target (``gpu_check.SHAPES``).

- features: ``train eagle``'s pass, the target's body with its three feature layers tapped,
  over one sequence of ``--length`` tokens (every token of a kept sequence, prompt included);
- a step: ``step_losses`` and the backward pass over a batch of ``--batch`` sequences of
  ``--length`` tokens whose replies start at ``--prompt`` (the unrolled steps skip the
  prompt's earlier anchors), the draft vocabulary ``--draft-vocab`` rows of the target's
  head, then AdamW.

Medians of ``--repeats`` timings, and the run's total for a given budget:

    python benchmarks/eagle_train_cost.py --shape qwen2.5-0.5b --threads 2
"""

from __future__ import annotations

import argparse

import torch
from gpu_check import SHAPES, median_ms, random_runner

from quickdraft.bench.machine import describe_machine
from quickdraft.drafters.eagle.net import EagleConfig, EagleNet
from quickdraft.train.eagle import EagleFeatures, EagleTraining
from quickdraft.train.eagle_objective import collate, step_losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--length", type=int, default=384)
    parser.add_argument("--prompt", type=int, default=128, help="prompt tokens a sequence has")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--draft-vocab", type=int, default=16384)
    parser.add_argument("--intermediate", type=int, default=None, help="MLP width (the target's)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bf16", action="store_true", help="the step under CPU bf16 autocast")
    parser.add_argument("--budget-tokens", type=int, default=200_000, help="reply tokens")
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = args.device
    with torch.no_grad():  # not inference mode: its embedding and head feed a backward pass
        target = random_runner(SHAPES[args.shape], device, torch.float32)
    config = EagleConfig.for_target(
        target.config, "eagle3", args.draft_vocab, intermediate_size=args.intermediate
    )
    tapped = target.with_taps(tuple(n - 1 for n in config.feature_layers))
    tokens = torch.randint(0, target.vocab_size, (1, args.length), device=device)
    positions = torch.arange(args.length, device=device).unsqueeze(0)

    @torch.inference_mode()
    def features() -> None:
        tapped.body(tokens, positions, tapped.new_cache(1, args.length))

    feature_s = median_ms(features, args.repeats, device) / 1000

    d, generator = target.config.hidden_size, torch.Generator().manual_seed(0)
    data = EagleFeatures([], [], [], [])
    for _ in range(args.batch):
        data.tokens.append(torch.randint(0, target.vocab_size, (args.length,), generator=generator))
        data.hidden.append(torch.randn(args.length, d, generator=generator).half())
        data.taps.append(torch.randn(args.length, 3, d, generator=generator).half())
        data.start.append(args.prompt)
    settings = EagleTraining(draft_vocab=args.draft_vocab, intermediate_size=args.intermediate)
    net = EagleNet(config).to(device)
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-4)
    embed = target.embed.float()
    head = target.head_weight.float()[: args.draft_vocab].contiguous()
    batch = collate(data, list(range(args.batch)), settings.steps, torch.device(device))

    def step() -> None:
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=args.bf16):
            losses, _ = step_losses(net, embed, head, batch, settings, noise=True)
        sum(losses.values()).backward()
        optimizer.step()
        optimizer.zero_grad()

    step_s = median_ms(step, args.repeats, device) / 1000
    reply = args.length - args.prompt
    sequences = args.budget_tokens / reply
    steps = args.epochs * sequences / args.batch
    print(f"{describe_machine()}, {args.threads} threads, {device}, shape {args.shape}")
    print(f"features: {feature_s * 1e3:.0f} ms for {args.length} tokens "
          f"({args.length / feature_s:.0f} tokens/s)")  # fmt: skip
    print(f"a step of {args.batch} x {args.length} tokens ({args.prompt} of prompt), draft "
          f"vocabulary {args.draft_vocab:,}, MLP {config.intermediate_size:,}: {step_s:.2f} s; "
          f"{sum(p.numel() for p in net.parameters()) / 1e6:.1f}M parameters")  # fmt: skip
    print(f"{args.budget_tokens:,} reply tokens in {sequences:.0f} such sequences, "
          f"{args.epochs} epochs: features {sequences * feature_s / 60:.0f} min, "
          f"training {steps * step_s / 60:.0f} min ({steps:.0f} steps)")  # fmt: skip


if __name__ == "__main__":
    main()
