"""What recording acceptance costs the client: the same build against a reference server without a
drafter and one with a simulated drafter, side by side, in one run, two ways.

The speculating server adds SGLang's six ``spec_*`` figures to every finished ``meta_info``; the
client checks them (types, the histogram adding up), journals them and puts them in the rows'
``meta``. Everything else is equal: the same prompts, the same greedy outputs (speculative
decoding leaves them unchanged), the same client (``bench_client_overhead.py``'s child: a real
``eagle3_raw.run.build.run`` into a fresh journal, read back). The two servers run at once and the
builds alternate (plain, speculating, plain, ...), ``--repeats`` times each, so drift of the shared
machine hits both alike.

1. **Utilization** (``bench_utilization.py``'s harness): capacity-mode servers (``--slots 256
   --ms-per-token 5``: the server sets the pace, as a GPU server does), natural lengths; the share
   of the server's token capacity the client achieves, against each server.
2. **CPU cost** (``bench_client_overhead.py``'s harness): servers without latency, 1,024-id rows;
   tokens/s over the generation window and the client's CPU seconds per million generated tokens
   (what eagle3_raw itself adds), and the server's (the reference's drafter simulation is a Python
   loop per output id: its server is slower, which is the reference's cost, not the client's).

Usage::

    python benchmarks/bench_acceptance.py            # ~8 min
    python benchmarks/bench_acceptance.py --quick    # a smoke run: ~2 min
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import bench_client_overhead as overhead
import bench_utilization as utilization
import common

SPECULATE = (
    "--speculative-algorithm EAGLE3 --speculative-num-steps 3 --speculative-eagle-topk 1 "
    "--speculative-num-draft-tokens 4 --draft-acceptance 0.7"
)
COLUMNS = [
    "server",
    "build",
    "rows",
    "gen tokens",
    "tokens/s",
    "client CPU s/Mtok",
    "srv CPU s/Mtok",
    "others CPU s",
]


UTIL_COLUMNS = [
    "server", "build", "requests", "gen tokens", "util slots", "util tokens", "tok/s", "client CPU s",
    "others CPU s",
]  # fmt: skip


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    utilization_part(args)
    cpu_part(args)


def utilization_part(args: argparse.Namespace) -> None:
    """Part 1: the share of each capacity-mode server's token rate the client achieves."""
    from eagle3_raw.launching.reference import launch_reference

    prompts, repeats = (1_000, 1) if args.quick else (args.util_prompts, args.repeats)
    options = argparse.Namespace(
        time_limit=240.0, max_new_tokens=2048, ms_per_token=5.0, prompts=prompts, slots=[256]
    )
    capacity = ["--slots", "256", "--ms-per-token", "5"]
    print(f"1. utilization: {prompts:,} prompts, natural lengths, servers {' '.join(capacity)}")
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-acceptance-util-") as tmp, contextlib.ExitStack() as stack:
        work, env = Path(tmp), common.isolated_env(Path(tmp))
        servers = {
            name: stack.enter_context(launch_reference(args=[*capacity, *flags]))
            for name, flags in (("plain", []), ("speculating", SPECULATE.split()))
        }
        source = common.write_prompts(work / "prompts.jsonl", prompts)
        for k in range(repeats):
            for name, server in servers.items():
                recipe = common.bench_recipe(source, [server.url], max_new_tokens=2048)
                path = common.write_recipe(work / f"recipe-{name}-{k}.yaml", recipe)
                command = [sys.executable, str(common.HERE / "bench_utilization.py"), "--child", str(path),
                           "--journal", str(work / f"journal-{name}-{k}")]  # fmt: skip
                client = utilization.Client(f"eagle3_raw vs {name}", command)
                result = utilization.measure(client, [server], options, env)
                results.append({"server": name, "build": k + 1, **result})
                shares = {key: result[key] for key in ("util_slots_window", "util_tokens_window")}
                print(
                    f"  {name} #{k + 1}: " + ", ".join(f"{key} {_share(v)}" for key, v in shares.items()),
                    flush=True,
                )
    print()
    common.print_table(UTIL_COLUMNS, [_util_row(r) for r in results])
    print()
    args.results["utilization"] = results


def _share(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _util_row(r: dict[str, Any]) -> list[Any]:
    return [
        r["server"], r["build"], r["requests"], r["generated_tokens"], r["util_slots_window"],
        r["util_tokens_window"], r["tokens_per_s_window"], r["client_process_cpu_seconds"],
        r["others_cpu_seconds"],
    ]  # fmt: skip


def cpu_part(args: argparse.Namespace) -> None:
    """Part 2: tokens/s and CPU per million tokens against servers without latency."""
    from eagle3_raw.launching.reference import launch_reference

    setup = overhead.Setup("1k ignore_eos", int(args.rows * (0.1 if args.quick else 1)), 1024, True)
    repeats = 2 if args.quick else args.repeats
    plain_args = ["--skip-tokenizer-init"]
    kinds = {"plain": plain_args, "speculating": [*plain_args, *SPECULATE.split()]}
    print(
        f"2. CPU cost: {setup.rows:,} rows x {setup.max_new_tokens} ids (ignore_eos, greedy), "
        f"{repeats} builds per server, servers without latency"
    )
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-acceptance-") as tmp, contextlib.ExitStack() as stack:
        servers = {name: stack.enter_context(launch_reference(args=flags)) for name, flags in kinds.items()}
        env = common.isolated_env(Path(tmp))
        options = argparse.Namespace(profile=False, temperature=0.0)
        for k in range(repeats):
            for name, server in servers.items():
                work = Path(tmp) / f"{name}-{k}"
                work.mkdir()
                result = overhead.measure(setup, [server], work, env, options)
                results.append({"server": name, "build": k + 1, **result})
                print(f"  {name} #{k + 1}: {result['tokens_per_s_window']:,.0f} tokens/s", flush=True)
    print()
    common.print_table(COLUMNS, [_row(r) for r in results])
    print()
    for name in kinds:
        mine = [r for r in results if r["server"] == name]
        rate = statistics.median(r["tokens_per_s_window"] for r in mine)
        cpu = statistics.median(r["client_cpu_s_per_m_tokens"] for r in mine)
        print(f"median {name:<12} {rate:>12,.0f} tokens/s  {cpu:>8.2f} client CPU s/Mtok")
    args.results["cpu"] = results
    common.write_json(args.json, {"machine": common.machine(), "results": args.results})


def _row(r: dict[str, Any]) -> list[Any]:
    return [
        r["server"], r["build"], r["rows"], r["generated_tokens"], r["tokens_per_s_window"],
        r["client_cpu_s_per_m_tokens"], r["server_cpu_s_per_m_tokens"], r["others_cpu_seconds"],
    ]  # fmt: skip


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=20_000, help="rows per build (default 20,000)")
    parser.add_argument("--repeats", type=int, default=3, help="builds per server (default 3)")
    parser.add_argument("--quick", action="store_true", help="a tenth of the rows, 2 builds each")
    parser.add_argument(
        "--util-prompts", type=int, default=5_000, help="prompts per utilization build (5,000)"
    )
    parser.add_argument("--json", help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    args.results = {}
    print(f"machine: {common.machine()}; the client and 2 reference servers share it")
    return args


if __name__ == "__main__":
    main()
