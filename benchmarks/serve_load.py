"""A bounded loopback load test of `quickdraft serve`: concurrent streaming clients, chat and
completions, temperature 0 and 0.8, some disconnecting mid-stream.

The server runs SmolLM2-135M with its automatic method (EAGLE with the batch policy), as a
subprocess. Each of ``--clients`` clients sends ``--requests`` streaming requests one after
the other: chat and completion in turn, temperature 0 for even clients and 0.8 (seeded) for
odd ones, prompts from the bench's task sets. The first request of every eighth client (4 of
32, 12.5%) asks for 4x the tokens past EOS and closes its stream after three chunks.

Checked afterwards: no 5xx; every completed stream's text is the decoding of the token ids
its last chunk reports, and those equal offline `generate` (plain decoding, greedy or with the
same seed: a seeded request's tokens do not depend on the batch); /metrics shows no running
request and no cache row or slot in use; /health answers. Reported: time to first token
(p50/p95), per-request tokens/s (decode: after the first token; end to end), aggregate.

    python benchmarks/serve_load.py --threads 2
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path

import openai
from serve_common import gauges, healthy, server, task_items, write

from quickdraft.bench.machine import describe_machine

RESULTS = Path(__file__).parent / "results"


async def one_request(api: openai.AsyncOpenAI, plan: dict) -> dict:
    """Stream one request; what arrived and when."""
    common = {
        "model": plan["model"],
        "max_tokens": plan["max_tokens"],
        "temperature": plan["temperature"],
        "seed": plan["seed"],
        "stream": True,
        # A stream that will be closed ignores EOS, so that it is still running when it is.
        "extra_body": {"return_token_ids": True, "ignore_eos": plan["disconnect"]},
    }
    start = time.perf_counter()
    first = None
    pieces: list[str] = []
    token_ids = None
    chunks = 0
    record = {**plan, "status": 200}
    try:
        if plan["kind"] == "chat":
            stream = await api.chat.completions.create(messages=plan["messages"], **common)
        else:
            stream = await api.completions.create(prompt=plan["prompt"], **common)
        async for chunk in stream:
            chunks += 1
            if not chunk.choices:
                continue
            choice = chunk.choices[0]
            piece = choice.delta.content if plan["kind"] == "chat" else choice.text
            if piece and first is None:
                first = time.perf_counter()
            pieces.append(piece or "")
            if choice.finish_reason is not None:
                token_ids = choice.model_extra.get("token_ids")
                record["finish_reason"] = choice.finish_reason
            if plan["disconnect"] and chunks >= 3:
                await stream.close()
                record["disconnected"] = True
                break
    except openai.APIStatusError as error:
        record["status"] = error.status_code
    end = time.perf_counter()
    record.update(
        text="".join(pieces),
        token_ids=token_ids,
        ttft=None if first is None else first - start,
        seconds=end - start,
        decode_seconds=None if first is None else end - first,
    )
    return record


async def client(url: str, plans: list[dict]) -> list[dict]:
    api = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)
    out = [await one_request(api, plan) for plan in plans]
    await api.close()
    return out


def plans_for(args, model: str) -> list[list[dict]]:
    items = task_items(args.clients * args.requests)
    plans = []
    for c in range(args.clients):
        mine = []
        for r in range(args.requests):
            item = items[c * args.requests + r]
            sampled = c % 2 == 1
            mine.append(
                {
                    "client": c,
                    "model": model,
                    "kind": "chat" if (c + r) % 2 == 0 else "completion",
                    "task": item.task,
                    "messages": [dict(m) for m in item.messages],
                    "prompt": item.prompt,
                    "temperature": 0.8 if sampled else 0.0,
                    "seed": 1000 + 10 * c + r if sampled else None,
                    "max_tokens": args.max_tokens * (4 if r == 0 and c % 8 == 5 else 1),
                    "disconnect": r == 0 and c % 8 == 5,
                }
            )
        plans.append(mine)
    return plans


def check_offline(records: list[dict], target: str) -> int:
    """Completed streams against offline plain decoding; returns how many were checked."""
    from quickdraft import SamplingParams, generate
    from quickdraft.models.loading import load_model

    model, tokenizer = load_model(target)
    checked = 0
    for record in records:
        if record.get("disconnected") or record["status"] != 200:
            continue
        if record["kind"] == "chat":
            ids = tokenizer.apply_chat(record["messages"])
        else:
            ids = tokenizer.encode(record["prompt"])
        sampling = SamplingParams(
            temperature=record["temperature"],
            max_new_tokens=record["max_tokens"],
            seed=record["seed"],
        )
        expected = generate(model, ids, sampling=sampling, tokenizer=tokenizer)
        where = f"client {record['client']} ({record['kind']}, T={record['temperature']})"
        if record["token_ids"] != expected.token_ids:
            raise AssertionError(f"{where}: tokens differ from offline generate")
        if record["text"] != expected.text:
            raise AssertionError(f"{where}: streamed text differs from offline generate's")
        checked += 1
    return checked


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--requests", type=int, default=2, help="per client, one at a time")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS / "serve_load")
    args = parser.parse_args()

    options = ["--max-batch", str(args.max_batch), "--threads", str(args.threads)]
    log = "/tmp/quickdraft_serve_load.log"
    with server(args.target, *options, log=log) as url:
        plans = plans_for(args, args.target)
        start = time.perf_counter()

        async def run_all():
            return await asyncio.gather(*(client(url, mine) for mine in plans))

        records = [r for mine in asyncio.run(run_all()) for r in mine]
        wall = time.perf_counter() - start
        time.sleep(0.5)  # the engine thread sets its gauges after its last step
        after = gauges(url)
        health = healthy(url)

    errors_5xx = [r for r in records if r["status"] >= 500]
    others = [r for r in records if r["status"] != 200]
    completed = [r for r in records if r["status"] == 200 and not r.get("disconnected")]
    checked = check_offline(records, args.target)
    ttft = [r["ttft"] for r in completed if r["ttft"] is not None]
    decode = [
        (len(r["token_ids"]) - 1) / r["decode_seconds"]
        for r in completed
        if r["decode_seconds"] and len(r["token_ids"]) > 1
    ]
    e2e = [len(r["token_ids"]) / r["seconds"] for r in completed]
    tokens = sum(len(r["token_ids"]) for r in completed)
    left = {
        k: after[k]
        for k in (
            "quickdraft_running_requests",
            "quickdraft_queue_depth",
            "quickdraft_cache_rows_in_use",
            "quickdraft_cache_tokens_in_use",
        )
    }
    summary = {
        "machine": describe_machine(),
        "threads": args.threads,
        "target": args.target,
        "clients": args.clients,
        "requests": len(records),
        "disconnected": sum(1 for r in records if r.get("disconnected")),
        "completed": len(completed),
        "checked_against_offline": checked,
        "responses_5xx": len(errors_5xx),
        "responses_not_200": len(others),
        "ttft_p50_s": statistics.median(ttft),
        "ttft_p95_s": percentile(ttft, 0.95),
        "decode_tokens_per_s_p50": statistics.median(decode),
        "decode_tokens_per_s_p5": percentile(decode, 0.05),
        "e2e_tokens_per_s_p50": statistics.median(e2e),
        "aggregate_tokens_per_s": tokens / wall,
        "wall_s": wall,
        "after": left,
        "health_after": health,
        "requests_by_outcome": {
            k: v for k, v in after.items() if k.startswith("quickdraft_requests_total")
        },
    }
    ok = not errors_5xx and not others and health and not any(left.values())
    summary["passed"] = ok
    md = [
        "# serve_load",
        "",
        f"{summary['machine']}, {args.threads} threads; `quickdraft serve --target "
        f"{args.target} --max-batch {args.max_batch}` (automatic method: EAGLE, batch policy "
        f"3); {args.clients} concurrent streaming clients x {args.requests} requests of "
        f"{args.max_tokens} tokens, chat and completion in turn, T=0 and T=0.8 (seeded) by "
        f"client; {summary['disconnected']} streams closed after 3 chunks.",
        "",
        "| check | result |",
        "|---|---|",
        f"| 5xx responses | {len(errors_5xx)} |",
        f"| non-200 responses | {len(others)} |",
        f"| completed streams equal to offline generate (tokens and text) | "
        f"{checked} of {len(completed)} |",
        f"| after the run: running, queued, cache rows, cache slots in use | "
        f"{', '.join(f'{v:g}' for v in left.values())} |",
        f"| /health after the run | {'200' if health else 'failed'} |",
        "",
        "| figure | value |",
        "|---|---|",
        f"| time to first token p50 / p95 | {summary['ttft_p50_s']:.2f} s / "
        f"{summary['ttft_p95_s']:.2f} s |",
        f"| per-request decode tokens/s p50 (p5) | {summary['decode_tokens_per_s_p50']:.1f} "
        f"({summary['decode_tokens_per_s_p5']:.1f}) |",
        f"| per-request end-to-end tokens/s p50 | {summary['e2e_tokens_per_s_p50']:.1f} |",
        f"| aggregate tokens/s | {summary['aggregate_tokens_per_s']:.1f} |",
        f"| wall | {wall:.1f} s |",
    ]
    write(args.out, {"summary": summary, "records": records}, md)
    print("\n".join(md))
    if not ok:
        raise SystemExit("serve_load: a check failed (see the table)")


if __name__ == "__main__":
    main()
