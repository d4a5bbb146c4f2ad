"""`quickdraft serve` throughput: aggregate tokens/s at 1, 4 and 16 concurrent clients, with
speculation (the automatic method: EAGLE with the batch policy) and without, in one
interleaved run on SmolLM2-135M.

Two servers run side by side (each idle while the other is measured). A round sends 4, 8 and
16 chat requests of the bench's task sets through 1, 4 and 16 clients (each client one
request at a time),
greedy, not streamed; aggregate tokens/s is the round's completion tokens over its wall time.
Rounds alternate which server goes first and use new prompts each; the table gives each
server's median tokens/s and the median over rounds of the ratio within each round (the two
servers of a round serve the same prompts).
Both servers' replies are checked equal token for token.

    python benchmarks/serve_throughput.py --threads 2
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path

import openai
from serve_common import server, task_items, write

from quickdraft.bench.machine import describe_machine

RESULTS = Path(__file__).parent / "results"
CONCURRENCY = (1, 4, 8, 16)
ROUND_REQUESTS = {1: 4, 4: 8, 8: 16, 16: 16}  # requests a round, so each lasts some seconds


async def round_of(url: str, model: str, items, clients: int, max_tokens: int) -> dict:
    api = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=900)
    per_client = [items[c::clients] for c in range(clients)]

    async def one_client(mine) -> list[list[int]]:
        out = []
        for item in mine:
            reply = await api.chat.completions.create(
                model=model,
                messages=[dict(m) for m in item.messages],
                max_tokens=max_tokens,
                temperature=0,
                extra_body={"return_token_ids": True},
            )
            out.append(reply.choices[0].model_extra["token_ids"])
        return out

    start = time.perf_counter()
    replies = await asyncio.gather(*(one_client(mine) for mine in per_client))
    seconds = time.perf_counter() - start
    await api.close()
    tokens = [ids for mine in replies for ids in mine]
    return {"seconds": seconds, "tokens": sum(map(len, tokens)), "replies": tokens}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--clients",
        type=int,
        nargs="+",
        default=[1, 4, 16],
        choices=CONCURRENCY,
        help="concurrency levels to run (default 1 4 16)",
    )
    parser.add_argument(
        "--speculative-config",
        default=None,
        help="the speculative server's --speculative-config (default: the automatic method), "
        'such as \'{"method": "suffix", "adaptive_k": true, "disable_by_batch_size": null}\'',
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "serve_throughput")
    args = parser.parse_args()

    options = ["--max-batch", str(max(CONCURRENCY)), "--threads", str(args.threads)]
    arms = {"plain": '{"method": "ar"}', "speculative": args.speculative_config}
    spec_options = (
        [] if arms["speculative"] is None else ["--speculative-config", arms["speculative"]]
    )
    levels = tuple(args.clients)
    results: dict[int, dict[str, list[float]]] = {c: {a: [] for a in arms} for c in levels}
    with (
        server(
            args.target, *options, "--speculative-config", arms["plain"], log="/tmp/qd_ar.log"
        ) as plain_url,
        server(args.target, *options, *spec_options, log="/tmp/qd_spec.log") as spec_url,
    ):
        urls = {"plain": plain_url, "speculative": spec_url}
        for repeat in range(args.repeats):
            for clients in levels:
                count = ROUND_REQUESTS[clients]
                items = task_items(count + repeat * 7)[repeat * 7 :]  # new prompts each round
                order = list(arms) if (repeat + clients) % 2 == 0 else list(arms)[::-1]
                replies = {}
                for arm in order:
                    out = asyncio.run(
                        round_of(urls[arm], args.target, items, clients, args.max_tokens)
                    )
                    results[clients][arm].append(out["tokens"] / out["seconds"])
                    replies[arm] = out["replies"]
                    print(
                        f"round {repeat} c={clients} {arm}: {out['tokens']} tokens in "
                        f"{out['seconds']:.1f} s = {out['tokens'] / out['seconds']:.1f} tokens/s",
                        flush=True,
                    )
                if replies["plain"] != replies["speculative"]:
                    raise AssertionError(f"c={clients}: the servers' greedy replies differ")

    rows = []
    for clients in levels:
        plain = statistics.median(results[clients]["plain"])
        spec = statistics.median(results[clients]["speculative"])
        # Rounds differ in prompts: the ratio is paired within each round, then the median.
        ratios = [
            s / p
            for s, p in zip(results[clients]["speculative"], results[clients]["plain"], strict=True)
        ]
        rows.append(
            {
                "clients": clients,
                "plain": plain,
                "speculative": spec,
                "ratio": statistics.median(ratios),
                "ratio_by_round": ratios,
            }
        )
    machine = describe_machine()
    speculative = (
        "the automatic method, EAGLE with the batch policy 3"
        if args.speculative_config is None
        else f"`--speculative-config '{args.speculative_config}'`"
    )
    md = [
        "# serve_throughput",
        "",
        f"{machine}, {args.threads} threads per server; {args.target}; two `quickdraft serve "
        f'--max-batch 16` processes (plain: `--speculative-config \'{{"method": "ar"}}\'`; '
        f"speculative: {speculative}), greedy chat "
        f"requests of {args.max_tokens} tokens from the bench's task sets, not streamed; "
        f"{args.repeats} interleaved rounds, new prompts each. Replies equal token for token.",
        "",
        "| concurrent clients | plain tokens/s | speculative tokens/s | speculative / plain "
        "(median of rounds) | by round |",
        "|---|---|---|---|---|",
    ]
    md += [
        f"| {r['clients']} | {r['plain']:.1f} | {r['speculative']:.1f} | {r['ratio']:.2f}x | "
        + ", ".join(f"{x:.2f}" for x in r["ratio_by_round"])
        + " |"
        for r in rows
    ]
    payload = {
        "machine": machine,
        "threads": args.threads,
        "rows": rows,
        "rounds": {str(c): v for c, v in results.items()},
    }
    write(args.out, payload, md)
    print("\n".join(md))


if __name__ == "__main__":
    main()
