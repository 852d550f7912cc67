"""Utilization: how much of the server's capacity each client turns into generated tokens.

The reference server runs in capacity mode in a subprocess: ``--slots S --ms-per-token T`` (default
256 slots, 5 ms per token), so it can produce at most ``S / T`` tokens per second (51,200/s by
default); a generation holds one slot for ``completion_tokens x T`` ms, and generations beyond ``S``
wait in the server's FIFO queue. Output lengths are the reference engine's natural long-tailed ones
(``max_new_tokens`` 2048, temperature 0.7, thinking on). The same prompts and sampling go, in turn, to:

- eagle3_raw: ``eagle3_raw.run.build.run`` into a fresh journal, default in-flight limit (from the
  server's ``max_running_requests``: ``S x 1.25 + 8``), least-loaded endpoint choice, once per
  ``--render`` mode: ``server`` (every prompt rendered by the server's chat path, ``/tokenize`` with
  messages, beside the generations: the default) and ``local`` (rendered in the client);
- the baseline (``baseline_client.py``): a thread pool with fixed concurrency per endpoint (64, as
  typical scripts use, and 256), strict round-robin, blocking stdlib HTTP.

Each client runs in its own process; before each, the server's prefix cache and stats are reset. A
thread here polls ``GET /reference/stats`` every 20 ms. Reported per client:

- **window** = from the first request reaching the server until the client has handed the server
  its last request (the drain of the last long outputs afterwards is not the client's doing);
- ``util slots`` = busy-slot seconds / (slots x seconds) over the window, from the server's integral;
- ``util tokens`` = completed tokens per second / capacity over the window minus its first
  ``max_new_tokens x T`` seconds (so the work still in progress is in the same steady state at
  both ends; over the whole window, the ramp-up would bias it low);
- ``whole`` = from the first request until the last response: both ratios again, drain included;
- busy-slot seconds / (completed tokens x T) over the whole run: 1.000 when a busy slot makes
  exactly one token per T ms, so the two ratios measure the same thing; above 1 by the server's
  timer lateness (a slot held past its last token);
- CPU seconds of the client process, the server, and ``others``: every other process on the
  machine meanwhile (the numbers are clean only when that is near zero).

A client still running after ``--time-limit`` seconds is stopped (SIGTERM); its window then ends
at the stop and it has no whole-run numbers.

Both engines in one run (``--engines sglang vllm``, the default): the servers above speak SGLang's
API, then the same number of servers with the same slots speak vLLM's (``--protocol vllm
--enable-scale-out``, dev mode on, ``--max-num-seqs`` = slots), and the same clients run against
them: the baseline through ``/inference/v1/generate`` (``baseline_client.py --protocol vllm``) and
eagle3_raw through its vLLM client (``server.engine: vllm``; :func:`vllm_client_ready` and
:func:`vllm_recipe` are where it plugs in: without a vLLM client those rows are skipped, saying
so). The target holds per engine.

Usage::

    python benchmarks/bench_utilization.py                 # 10,000 prompts, about 5 minutes
    python benchmarks/bench_utilization.py --quick         # 1,000 prompts, under a minute
    python benchmarks/bench_utilization.py --slots 128 128   # two endpoints of 128 slots each
    python benchmarks/bench_utilization.py --slots 192 64    # two unequal endpoints
    python benchmarks/bench_utilization.py --engines vllm    # the vLLM-protocol servers only
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import common

TARGET = 0.97
MIN_STEADY_SECONDS = 5.0
ENGINES = ("sglang", "vllm")
CACHE_ROUTE = {"sglang": "/flush_cache", "vllm": "/reset_prefix_cache"}


# --- eagle3_raw's vLLM client: THE HOOK the vLLM engine's author fills in ------------------------


def vllm_client_ready(raw: dict[str, Any]) -> bool:
    """HOOK: whether eagle3_raw can drive a vLLM server: its ``eagle3_raw.vllm.client`` exists and a
    recipe takes :func:`vllm_recipe`'s fields. False: the vLLM engine's eagle3_raw rows are skipped,
    saying so."""
    from eagle3_raw.errors import RecipeError
    from eagle3_raw.recipe import load_recipe

    if (
        importlib.util.find_spec("eagle3_raw.vllm") is None
        or importlib.util.find_spec("eagle3_raw.vllm.client") is None
    ):
        return False
    try:
        load_recipe(vllm_recipe(raw))
    except RecipeError:
        return False
    return True


def vllm_recipe(raw: dict[str, Any]) -> dict[str, Any]:
    """HOOK: the recipe eagle3_raw runs against the vLLM-protocol servers: the SGLang one's, with
    ``server.engine: vllm`` (adjust once the recipe's vLLM fields are settled)."""
    return {**raw, "server": {**raw["server"], "engine": "vllm"}}


# --- the eagle3_raw client (child process) ------------------------------------------------------


def eagle3_child(recipe_path: Path, journal_dir: Path) -> dict[str, Any]:
    """Run eagle3_raw on the recipe into ``journal_dir``; counters for the parent."""
    from eagle3_raw.recipe import load_recipe
    from eagle3_raw.run.build import RunOptions, run

    start, cpu = time.perf_counter(), time.process_time()
    result = run(load_recipe(recipe_path), RunOptions(journal_dir=journal_dir, progress="none"))
    summary = result.summary
    return {
        "requests": summary.rows, "generated_tokens": summary.run_generated_tokens,
        "errors": sum(summary.failed.values()) + sum(summary.skipped.values()),
        "run_seconds": time.perf_counter() - start, "run_cpu_seconds": time.process_time() - cpu,
    }  # fmt: skip


# --- analysis -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """What the parent saw of one client: the servers' stats, when the client started (and was stopped)."""

    poller: common.Poller
    spawned: float
    stopped: float | None  # set when the client hit --time-limit and was terminated

    def series(self, key: str) -> list[float]:
        return self.poller.series(key)


def analyse(run: Run, requests: int, slots: int, ms_per_token: float, warmup: float) -> dict[str, Any]:
    """The window and whole-run ratios described in the module docstring."""
    t = run.poller.times()
    sent, done, aborted = run.series("generate_requests"), run.series("completed_requests"), \
        run.series("aborted_requests")  # fmt: skip
    first = next(i for i, n in enumerate(sent) if n > 0)
    start = run.poller.start_index()  # the last tick before any request: the window includes the ramp-up
    if run.stopped is None:
        end = next(i for i, n in enumerate(sent) if n >= requests)
        drained: int | None = next((i for i, n in enumerate(done) if n + aborted[i] >= requests), len(t) - 1)
    else:  # cut short: the window ends at the stop, and there is no whole run
        end, drained = max(i for i in range(len(t)) if t[i] <= run.stopped), None
    warm = next((i for i in range(start, end + 1) if t[i] >= t[start] + warmup), end)
    ratios = _ratios(run, t, (start, warm, end, drained), slots, ms_per_token)
    return {"first_request_s": t[first] - run.spawned, "stopped": run.stopped is not None, **ratios}


def _ratios(
    run: Run, t: list[float], marks: tuple[int, int, int, int | None], slots: int, ms_per_token: float
) -> dict[str, Any]:
    start, warm, end, drained = marks
    capacity = slots * 1000.0 / ms_per_token
    busy, tokens = run.series("busy_slot_seconds"), run.series("completed_tokens")
    steady = t[end] - t[warm]
    rate = (tokens[end] - tokens[warm]) / steady if steady >= MIN_STEADY_SECONDS else None
    return {
        "window_s": t[end] - t[start],
        "util_slots_window": (busy[end] - busy[start]) / (slots * (t[end] - t[start])),
        "util_tokens_window": None if rate is None else rate / capacity,
        "tokens_per_s_window": rate,
        "steady_window_s": steady,
        **_whole(t, busy, tokens, start, drained, slots, capacity),
        "max_queue_depth": max(run.series("max_queue_depth")),
        "server_completed_requests": run.series("completed_requests")[-1],
        "server_completed_tokens": tokens[-1],
        "server_aborted": run.series("aborted_requests")[-1],
    }


def _whole(
    t: list[float], busy: list[float], tokens: list[float], start: int, drained: int | None, slots: int,
    capacity: float,
) -> dict[str, Any]:  # fmt: skip
    """The whole run's ratios (None when the client was stopped and there is no whole run)."""
    if drained is None:
        keys = ("whole_s", "util_slots_whole", "util_tokens_whole", "slot_seconds_per_token")
        return dict.fromkeys(keys)
    whole = t[drained] - t[start]
    return {
        "whole_s": whole,
        "util_slots_whole": (busy[drained] - busy[start]) / (slots * whole),
        "util_tokens_whole": (tokens[drained] - tokens[start]) / whole / capacity,
        "slot_seconds_per_token": busy[-1] * (capacity / slots) / tokens[-1],  # capacity / slots = 1 / T
    }


# --- the parent ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Client:
    name: str
    command: list[str]
    engine: str = "sglang"
    eagle3: bool = False


def clients(args: argparse.Namespace, recipe: Path, work: Path, engine: str = "sglang") -> list[Client]:
    """eagle3_raw once per render mode, then the baselines; against ``engine``'s servers."""
    here, py = common.HERE, sys.executable
    prefix = "" if engine == "sglang" else f"{engine}: "
    found = []
    base = common.read_recipe(recipe)
    for mode in args.render if engine == "sglang" or vllm_client_ready(base) else ():
        raw = base if engine == "sglang" else vllm_recipe(base)
        variant = common.write_recipe(
            work / f"recipe-{engine}-{mode}.yaml", {**raw, "model": {**raw["model"], "render": mode}}
        )
        command = [py, str(here / "bench_utilization.py"), "--child", str(variant),
                   "--journal", str(work / f"journal-{engine}-{mode}")]  # fmt: skip
        found.append(Client(f"{prefix}eagle3_raw render={mode}", command, engine, eagle3=True))
    for c in args.baseline_concurrency:
        command = [py, str(here / "baseline_client.py"), "--recipe", str(recipe), "--concurrency", str(c),
                   "--out", str(work / f"baseline-{engine}-{c}.jsonl"), "--protocol", engine]  # fmt: skip
        found.append(Client(f"{prefix}baseline c={c}", command, engine))
    return found


def measure(
    client: Client, servers: Sequence[Any], args: argparse.Namespace, env: dict[str, str]
) -> dict[str, Any]:
    """Reset the servers, run ``client`` under the poller, and analyse what the servers saw."""
    urls = [s.url for s in servers]
    for url in urls:
        common.reset_server(url, CACHE_ROUTE[client.engine])
    with common.CpuAccount([s.process.pid for s in servers]) as cpu, common.Poller(urls) as poller:
        spawned = time.monotonic()
        child, stopped = run_child(client.command, env, args.time_limit)
    warmup = args.max_new_tokens * args.ms_per_token / 1000.0
    run = Run(poller, spawned, stopped)
    result = analyse(run, args.prompts, sum(args.slots), args.ms_per_token, warmup)
    cpus = {"server_cpu_seconds": cpu.servers, "client_process_cpu_seconds": cpu.clients,
            "others_cpu_seconds": cpu.others}  # fmt: skip
    return {
        "client": client.name,
        "engine": client.engine,
        "eagle3": client.eagle3,
        **child,
        **result,
        **cpus,
    }


def run_child(command: list[str], env: dict[str, str], limit: float) -> tuple[dict[str, Any], float | None]:
    """The child's JSON counters; past ``limit`` seconds it is terminated (SIGTERM) and the stop time
    returned instead (eagle3_raw then aborts what it has in flight)."""
    process = subprocess.Popen(command, env={**os.environ, **env}, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        out, err = process.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        stopped = time.monotonic()
        process.terminate()
        process.communicate()
        return {"requests": None, "generated_tokens": None, "run_cpu_seconds": None}, stopped
    if process.returncode != 0:
        raise RuntimeError(f"{command[:4]} failed ({process.returncode}):\n{err[-3000:]}")
    return dict(json.loads(out.strip().splitlines()[-1])), None


COLUMNS = [
    "client", "requests", "gen tokens", "1st req s", "window s", "util slots", "util tokens",
    "tok/s", "whole s", "whole slots", "whole tokens", "queue max", "client CPU s", "server CPU s",
    "others CPU s",
]  # fmt: skip


def row(r: dict[str, Any]) -> list[Any]:
    if r["stopped"]:  # what the server completed before the client was stopped
        name, requests, tokens = f"{r['client']} (stopped)", r["server_completed_requests"], \
            r["server_completed_tokens"]  # fmt: skip
    else:
        name, requests, tokens = r["client"], r["requests"], r["generated_tokens"]
    return [
        name, int(requests), int(tokens), r["first_request_s"], r["window_s"],
        r["util_slots_window"], r["util_tokens_window"], r["tokens_per_s_window"], r["whole_s"],
        r["util_slots_whole"], r["util_tokens_whole"], int(r["max_queue_depth"]),
        r["client_process_cpu_seconds"], r["server_cpu_seconds"], r["others_cpu_seconds"],
    ]  # fmt: skip


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(eagle3_child(Path(args.child), args.journal)))
        return
    with tempfile.TemporaryDirectory(prefix="bench-utilization-") as tmp:
        work = Path(tmp)
        env = common.isolated_env(work)
        prompts = common.write_prompts(work / "prompts.jsonl", args.prompts)
        print_header(args)
        results = []
        for engine in args.engines:
            with contextlib.ExitStack() as stack:  # one engine's servers at a time
                servers = start_servers(stack, args, engine)
                urls = [s.url for s in servers]
                recipe = common.bench_recipe(prompts, urls, max_new_tokens=args.max_new_tokens)
                recipe_path = common.write_recipe(work / f"recipe-{engine}.yaml", recipe)
                print(f"{engine} protocol:", flush=True)
                for client in clients(args, recipe_path, work, engine):
                    results.append(measure(client, servers, args, env))
                    print_progress(results[-1], args)
    print_results(results, args.engines)
    common.write_json(args.json, {"machine": common.machine(), "args": vars(args), "results": results})


def start_servers(stack: contextlib.ExitStack, args: argparse.Namespace, engine: str = "sglang") -> list[Any]:
    """One capacity-mode reference server per ``--slots`` value, speaking ``engine``'s API."""
    from eagle3_raw.launching.reference import launch_reference

    timing = ["--ms-per-token", str(args.ms_per_token)]
    if engine == "sglang":
        return [stack.enter_context(launch_reference(args=["--slots", str(n), *timing])) for n in args.slots]
    flags = ["--protocol", "vllm", "--enable-scale-out", *timing]
    dev = {"VLLM_SERVER_DEV_MODE": "1"}  # /server_info (max_num_seqs) and /reset_prefix_cache
    return [
        stack.enter_context(
            launch_reference(args=[*flags, "--slots", str(n), "--max-num-seqs", str(n)], env=dev)
        )
        for n in args.slots
    ]


def print_header(args: argparse.Namespace) -> None:
    capacity = sum(args.slots) * 1000 / args.ms_per_token
    slots = " + ".join(map(str, args.slots))
    print(f"machine: {common.machine()}")
    print(f"reference server(s) with {slots} slots, {args.ms_per_token:g} ms/token: capacity {capacity:,.0f} "
          f"tokens/s; {args.prompts:,} prompts, max_new_tokens {args.max_new_tokens}, temperature 0.7, "
          "thinking on", flush=True)  # fmt: skip


def print_progress(result: dict[str, Any], args: argparse.Namespace) -> None:
    stopped = f" (stopped at the {args.time_limit:g} s limit)" if result["stopped"] else ""
    window, util = result["window_s"], result["util_slots_window"]
    print(f"  {result['client']}: window {window:.1f} s, util {util:.3f}{stopped}", flush=True)


def print_results(results: list[dict[str, Any]], engines: Sequence[str] = ("sglang",)) -> None:
    print()
    common.print_table(COLUMNS, [row(r) for r in results])
    ratios = (f"{r['client']} {common.cell(r['slot_seconds_per_token'], 4)}" for r in results)
    print("\nbusy-slot seconds / (completed tokens x T), whole run (1.000 = exact): " + ", ".join(ratios))
    for engine in engines:
        mine = [r for r in results if r["engine"] == engine]
        ours, baselines = [r for r in mine if r["eagle3"]], [r for r in mine if not r["eagle3"]]
        verdict = _verdict(ours, engine)
        print(f"target ({engine} protocol): eagle3_raw >= {TARGET} of capacity in the window: {verdict}")
        if baselines:  # the other half of the target, stated for this run, never a failure
            print(f"baseline short of {TARGET} in the window (reported, not judged): "
                  + "; ".join(_shortfall(r) for r in baselines))  # fmt: skip


def _verdict(ours: list[dict[str, Any]], engine: str) -> str:
    """The target's verdict for eagle3_raw's first client of ``engine``."""
    if not ours:
        where = " (eagle3_raw's vLLM client is not here: see vllm_client_ready)" if engine == "vllm" else ""
        return f"not judged (no eagle3_raw client run){where}"
    util = _window_utilization(ours[0])
    if util is None:
        return "not judged (window too short: a smoke run)"
    return "met" if util >= TARGET else "NOT met"


def _window_utilization(result: dict[str, Any]) -> float | None:
    """The lower of the window's two ratios; None when the window was too short to count tokens."""
    if result["util_tokens_window"] is None:
        return None
    return float(min(result["util_slots_window"], result["util_tokens_window"]))


def _shortfall(result: dict[str, Any]) -> str:
    util = _window_utilization(result)
    if util is None:
        return f"{result['client']}: not judged (window too short)"
    return f"{result['client']}: {util:.3f}, {'short' if util < TARGET else 'NOT short'}"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--prompts", type=int, default=10_000)
    parser.add_argument("--slots", type=int, nargs="+", default=[256],
                        help="one reference server (endpoint) per value, with that many slots")  # fmt: skip
    parser.add_argument("--ms-per-token", type=float, default=5.0)
    parser.add_argument("--max-new-tokens", type=int, default=2048)
    parser.add_argument("--baseline-concurrency", type=int, nargs="*", default=[64, 256],
                        help="baseline requests in flight per endpoint (default: 64 256)")  # fmt: skip
    parser.add_argument("--time-limit", type=float, default=240.0,
                        help="seconds per client before it is stopped and cut off (default 240)")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="1,000 prompts, 40 s limit: a smoke run")
    parser.add_argument(
        "--render",
        nargs="+",
        default=["server", "local"],
        choices=("server", "local"),
        help="eagle3_raw's render modes to run, each a client (default: both)",
    )
    parser.add_argument("--engines", nargs="+", default=list(ENGINES), choices=ENGINES,
                        help="the capacity servers' API, in turn (default: sglang vllm)")  # fmt: skip
    parser.add_argument("--json", help="also write the results to this JSON file")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--journal", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.prompts, args.time_limit = 1_000, 40.0
    return args


if __name__ == "__main__":
    main()
