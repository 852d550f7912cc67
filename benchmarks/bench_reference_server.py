"""Throughput of the reference server with zero simulated latency, and its start-up time.

The server runs in a subprocess (``launch_reference``, default options: no capacity mode, no
faults, no ledger); a lean aiohttp client in this process keeps ``--concurrency`` requests in flight
on keep-alive connections for ``--seconds`` per scenario, with bodies encoded once up front.
Reported per scenario: HTTP requests/s, generations/s, generated tokens/s (``completion_tokens``
from the responses), and the CPU seconds the server and the client used per wall second (both
share this machine's cores, as in the project's client benchmarks).

Usage::

    python benchmarks/bench_reference_server.py                  # 4 s per scenario
    python benchmarks/bench_reference_server.py --seconds 10 --concurrency 64
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from eagle3_raw.launching.reference import ReferenceProcess, launch_reference
from eagle3_raw.reference.model_files import load_raw_tokenizer

_TOPICS = ("rivers", "sorting", "bread", "TCP", "tax law", "volcanoes", "git", "the moon")


@dataclass(frozen=True)
class Scenario:
    name: str
    batch: int
    sampling: dict[str, Any]
    stream: bool = False


_FIXED = {"ignore_eos": True, "temperature": 0.7}
SCENARIOS = (
    Scenario("1 prompt, 256 ids", 1, {"max_new_tokens": 256, **_FIXED}),
    Scenario("1 prompt, natural length", 1, {"max_new_tokens": 2048, "temperature": 0.7}),
    Scenario("1 prompt, 16 ids", 1, {"max_new_tokens": 16, **_FIXED}),
    Scenario("batch of 16, 256 ids", 16, {"max_new_tokens": 256, **_FIXED}),
    Scenario(
        "1 prompt, 256 ids, stream/16", 1, {"max_new_tokens": 256, "stream_interval": 16, **_FIXED}, True
    ),
)


def prompts(count: int) -> list[list[int]]:
    """Distinct ChatML prompts of 30-60 ids, as eagle3_raw renders them."""
    tokenizer = load_raw_tokenizer()
    texts = [
        f"<|im_start|>user\nQuestion {i}: tell me about {_TOPICS[i % len(_TOPICS)]}.<|im_end|>\n"
        "<|im_start|>assistant\n"
        for i in range(count)
    ]
    return [tokenizer.encode(text).ids for text in texts]


def bodies(scenario: Scenario, pool: list[list[int]]) -> list[bytes]:
    out = []
    for i in range(0, len(pool) - scenario.batch + 1, scenario.batch):
        ids: Any = pool[i] if scenario.batch == 1 else pool[i : i + scenario.batch]
        out.append(
            orjson.dumps({"input_ids": ids, "sampling_params": scenario.sampling, "stream": scenario.stream})
        )
    return out


def tokens_in(payload: bytes, stream: bool) -> tuple[int, int]:
    """(generations, generated ids) in one response body."""
    if stream:
        finals = [orjson.loads(line[6:]) for line in payload.split(b"\n\n") if line.startswith(b"data: {")]
        finals = [e for e in finals if e["meta_info"]["finish_reason"] is not None]
        return len(finals), sum(e["meta_info"]["completion_tokens"] for e in finals)
    value = orjson.loads(payload)
    items = value if isinstance(value, list) else [value]
    return len(items), sum(item["meta_info"]["completion_tokens"] for item in items)


async def drive(
    url: str, scenario: Scenario, payloads: list[bytes], concurrency: int, seconds: float
) -> dict[str, float]:
    """Keep ``concurrency`` requests in flight for ``seconds``; count what comes back."""
    counts: dict[str, float] = {"requests": 0, "generations": 0, "tokens": 0, "errors": 0}
    deadline = time.monotonic() + seconds
    connector = aiohttp.TCPConnector(limit=concurrency)
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:

        async def worker(offset: int) -> None:
            i = offset
            while time.monotonic() < deadline:
                async with session.post(f"{url}/generate", data=payloads[i % len(payloads)]) as response:
                    payload = await response.read()
                i += concurrency
                if response.status != 200:
                    counts["errors"] += 1
                    continue
                generations, tokens = tokens_in(payload, scenario.stream)
                counts["requests"] += 1
                counts["generations"] += generations
                counts["tokens"] += tokens

        started = time.monotonic()
        await asyncio.gather(*(worker(k) for k in range(concurrency)))
        counts["wall"] = time.monotonic() - started
    return counts


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_scenario(
    server: ReferenceProcess, scenario: Scenario, concurrency: int, seconds: float
) -> dict[str, float]:
    payloads = bodies(scenario, prompts(4096))
    asyncio.run(drive(server.url, scenario, payloads, concurrency, 0.5))  # warm-up
    server_cpu, client_cpu = cpu_seconds(server.process.pid), time.process_time()
    counts = asyncio.run(drive(server.url, scenario, payloads, concurrency, seconds))
    wall = counts["wall"]
    return {
        "req/s": counts["requests"] / wall,
        "gen/s": counts["generations"] / wall,
        "tokens/s": counts["tokens"] / wall,
        "ids/gen": counts["tokens"] / max(counts["generations"], 1),
        "server cpu": (cpu_seconds(server.process.pid) - server_cpu) / wall,
        "client cpu": (time.process_time() - client_cpu) / wall,
        "errors": counts["errors"],
    }


def startup_seconds(times: int = 5) -> list[float]:
    """Wall seconds from spawning ``python -m eagle3_raw.reference`` to its first 200 on ``/health``."""
    measured = []
    for _ in range(times):
        started = time.monotonic()
        with launch_reference():
            measured.append(time.monotonic() - started)
    return measured


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--seconds", type=float, default=4.0, help="measured seconds per scenario (default 4)"
    )
    parser.add_argument("--concurrency", type=int, default=32, help="requests in flight (default 32)")
    args = parser.parse_args(argv)
    starts = startup_seconds()
    print(f"start-up to first /health 200: median {statistics.median(starts):.2f} s, max {max(starts):.2f} s")
    print(f"{os.cpu_count()} CPUs; concurrency {args.concurrency}; {args.seconds:g} s per scenario\n")
    columns = ("req/s", "gen/s", "tokens/s", "ids/gen", "server cpu", "client cpu", "errors")
    print(f"{'scenario':<30}" + "".join(f"{c:>12}" for c in columns))
    with launch_reference() as server:
        for scenario in SCENARIOS:
            row = run_scenario(server, scenario, args.concurrency, args.seconds)
            print(
                f"{scenario.name:<30}"
                + "".join(f"{row[c]:>12,.1f}" if c != "errors" else f"{row[c]:>12,.0f}" for c in columns)
            )
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
