"""Client overhead: how fast eagle3_raw can move generated tokens into its journal, and at what CPU cost.

The reference server runs without capacity mode (no simulated latency: each generation is made
inline and answered at once) in its own process; eagle3_raw (``eagle3_raw.run.build.run``, default
in-flight limit, progress off) builds into a fresh journal in another process. Both share this
machine's cores, so the server's CPU is reported too, and by default the server is made as cheap as
it can be: ``--skip-tokenizer-init`` (no output text to decode; eagle3_raw reads only
``output_ids``) and greedy sampling (the engine's fastest path). Neither changes the client's work
beyond a smaller response (no ``text``); ``--server-args "" --temperature 0.7`` measures the heavier
server. Two output-length setups:

- ``1k ignore_eos``: ``ignore_eos: true``, ``max_new_tokens: 1024`` (every row has 1,024 tokens);
- ``natural``: the reference engine's long-tailed lengths (``max_new_tokens`` 2048, thinking on;
  mean about 220 tokens), so the per-request costs weigh more.

Reported per setup: rows and generated tokens in the journal (checked by reading it back), rows/s and
tokens/s over the **generation window** (first request reaching the server until ``run()`` returned,
the journal closed and fsync'd) and over the whole ``run()`` (tokenizer load, server checks and
planning included), client and server CPU seconds (``time.process_time()`` in the client over
``run()``, ``/proc/<pid>/stat`` for the server) and both per million generated tokens, and the CPU
seconds every other process on the machine took meanwhile (clean numbers need that near zero).
``--profile`` runs the client's event loop under cProfile (the producer thread is not profiled)
and prints its top functions; the profiler slows the client, so the rates of that run are lower.

Usage::

    python benchmarks/bench_client_overhead.py              # 20k x 1k-token rows, 40k natural: ~1.5 min
    python benchmarks/bench_client_overhead.py --quick      # a tenth of that: seconds
    python benchmarks/bench_client_overhead.py --profile    # + the client's cProfile top functions
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import json
import pstats
import shlex
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import common

TARGET_TOKENS_PER_S = 1_000_000
TARGET_SETUP = "1k ignore_eos"


@dataclass(frozen=True)
class Setup:
    name: str
    rows: int
    max_new_tokens: int
    ignore_eos: bool


def setups(scale: float) -> list[Setup]:
    return [
        Setup("1k ignore_eos", int(20_000 * scale), 1024, True),
        Setup("natural", int(40_000 * scale), 2048, False),
    ]


# --- the client (child process) -------------------------------------------------------------------


def child(recipe_path: Path, journal_dir: Path, profile: Path | None) -> dict[str, Any]:
    """Run eagle3_raw into ``journal_dir``; read the journal back; counters for the parent."""
    from eagle3_raw.journal import Journal
    from eagle3_raw.recipe import load_recipe
    from eagle3_raw.run.build import RunOptions, run

    recipe = load_recipe(recipe_path)
    profiler = cProfile.Profile() if profile else None
    start, cpu = time.perf_counter(), time.process_time()
    if profiler:
        profiler.enable()
    result = run(recipe, RunOptions(journal_dir=journal_dir, progress="none"))
    if profiler:
        profiler.disable()
        profiler.dump_stats(profile)
    cpu, wall, ended = time.process_time() - cpu, time.perf_counter() - start, time.monotonic()
    with Journal.read_dir(result.journal_dir) as journal:
        stats = journal.stats()
    return {
        "rows": stats["rows"], "generated_tokens": stats["generated_tokens"],
        "failed": result.summary.failed, "skipped": result.summary.skipped,
        "run_seconds": wall, "run_cpu_seconds": cpu, "ended": ended,
    }  # fmt: skip


# --- the parent ------------------------------------------------------------------------------------


def measure(
    setup: Setup, servers: Sequence[Any], work: Path, env: dict[str, str], args: argparse.Namespace
) -> dict[str, Any]:
    prompts = common.write_prompts(work / f"prompts-{setup.rows}.jsonl", setup.rows)
    recipe = common.bench_recipe(
        prompts, [s.url for s in servers], max_new_tokens=setup.max_new_tokens,
        ignore_eos=setup.ignore_eos, temperature=args.temperature, name=setup.name.replace(" ", "-"),
    )  # fmt: skip
    recipe_path = common.write_recipe(work / "recipe.yaml", recipe)
    profile_path = work / f"{recipe['name']}.prof"
    command = [sys.executable, __file__, "--child", str(recipe_path), "--journal", str(work / "journals")]
    command += ["--profile-to", str(profile_path)] if args.profile else []
    for server in servers:
        common.reset_server(server.url)
    pids, urls = [s.process.pid for s in servers], [s.url for s in servers]
    with common.CpuAccount(pids) as cpu, common.Poller(urls, interval=0.05) as poller:
        result = common.run_json_child(command, env)
    first = poller.times()[poller.start_index()]
    window = result.pop("ended") - first
    if args.profile:
        print_profile(setup.name, profile_path)
    return summarize(setup, result, window, cpu)


def summarize(setup: Setup, r: dict[str, Any], window: float, cpu: common.CpuAccount) -> dict[str, Any]:
    millions, server_cpu = r["generated_tokens"] / 1e6, cpu.servers
    return {
        "setup": setup.name, **r, "window_seconds": window, "server_cpu_seconds": server_cpu,
        "client_process_cpu_seconds": cpu.clients, "others_cpu_seconds": cpu.others,
        "rows_per_s_window": r["rows"] / window, "tokens_per_s_window": r["generated_tokens"] / window,
        "tokens_per_s_run": r["generated_tokens"] / r["run_seconds"],
        "client_cpu_s_per_m_tokens": r["run_cpu_seconds"] / millions,
        "server_cpu_s_per_m_tokens": server_cpu / millions,
    }  # fmt: skip


def print_profile(name: str, path: Path, top: int = 25) -> None:
    print(f"\n--- {name}: client cProfile, top {top} by own time (cProfile slows the client) ---")
    pstats.Stats(str(path)).strip_dirs().sort_stats("tottime").print_stats(top)


COLUMNS = [
    "setup", "rows", "gen tokens", "window s", "rows/s", "tokens/s", "run s", "tokens/s run",
    "client CPU s", "CPU s/Mtok", "server CPU s", "srv CPU s/Mtok", "others CPU s",
]  # fmt: skip


def row(r: dict[str, Any]) -> list[Any]:
    return [
        r["setup"], r["rows"], r["generated_tokens"], r["window_seconds"], r["rows_per_s_window"],
        r["tokens_per_s_window"], r["run_seconds"], r["tokens_per_s_run"], r["run_cpu_seconds"],
        r["client_cpu_s_per_m_tokens"], r["server_cpu_seconds"], r["server_cpu_s_per_m_tokens"],
        r["others_cpu_seconds"],
    ]  # fmt: skip


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(child(Path(args.child), args.journal, args.profile_to)))
        return
    from eagle3_raw.launching.reference import launch_reference

    server_args = shlex.split(args.server_args)
    print(f"machine: {common.machine()}; client and {args.servers} reference server(s) share it")
    print(f"server: python -m eagle3_raw.reference {shlex.join(server_args)} (no latency); "
          f"temperature {args.temperature}")  # fmt: skip
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmp, contextlib.ExitStack() as stack:
        servers = [stack.enter_context(launch_reference(args=server_args)) for _ in range(args.servers)]
        work, env = Path(tmp), common.isolated_env(Path(tmp))
        for setup in setups(0.1 if args.quick else args.scale):
            if args.only and setup.name not in args.only:
                continue
            results.append(measure(setup, servers, work, env, args))
            print(f"  {setup.name}: {results[-1]['tokens_per_s_window']:,.0f} tokens/s", flush=True)
    print()
    common.print_table(COLUMNS, [row(r) for r in results])
    for r in results:
        if r["setup"] == TARGET_SETUP:
            if args.quick:  # a tenth of the rows: start-up weighs too much to judge a rate
                verdict = "not judged on --quick"
            else:
                verdict = "met" if r["tokens_per_s_window"] >= TARGET_TOKENS_PER_S else "NOT met"
            print(
                f"\ntarget >= {TARGET_TOKENS_PER_S:,} tokens/s into the journal ({TARGET_SETUP}): {verdict}"
            )
    common.write_json(args.json, {"machine": common.machine(), "args": vars(args), "results": results})


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the row counts (default 1)")
    parser.add_argument("--servers", type=int, default=1, help="reference server processes (endpoints)")
    parser.add_argument(
        "--server-args",
        default="--skip-tokenizer-init",
        help='reference server options, one string (default "--skip-tokenizer-init")',
    )
    parser.add_argument("--temperature", type=float, default=0.0, help="temperature (default 0: greedy)")
    parser.add_argument(
        "--only", nargs="+", metavar="SETUP", help='run only these setups ("1k ignore_eos", natural)'
    )
    parser.add_argument("--quick", action="store_true", help="a tenth of the rows: a smoke run")
    parser.add_argument("--profile", action="store_true", help="run the client under cProfile; print top")
    parser.add_argument("--json", help="also write the results to this JSON file")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--journal", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--profile-to", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


if __name__ == "__main__":
    main()
