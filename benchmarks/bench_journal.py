"""Journal throughput and memory: append, reopen (replay), iter_tables, peak RSS per row count.

Each phase of each size runs in a fresh process, so its peak RSS (``ru_maxrss``) is its own::

    python benchmarks/bench_journal.py                    # 10k, 50k, 100k rows of 512 + 512 tokens
    python benchmarks/bench_journal.py --sizes 2000 --prompt-tokens 100 --output-tokens 900

Rows are appended in random key order (as requests finish out of order), so ``iter_tables`` reads
the file by seeking. The journal goes to a temporary directory on the same disk as ``--dir``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

PHASES = ("append", "open", "iter")


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def count_fsyncs() -> list[int]:
    """Count os.fsync calls from here on (the journal's fsync groups, plus directory syncs)."""
    calls = [0]
    real = os.fsync

    def counting(fd: Any) -> None:
        calls[0] += 1
        real(fd)

    os.fsync = counting
    return calls


def phase_append(directory: Path, rows: int, prompt: int, output: int, interval: float) -> dict[str, Any]:
    from eagle3_raw.journal import Journal
    from eagle3_raw.rows import Row, RowKey

    rng = random.Random(0)
    pool = [[rng.randrange(150_000) for _ in range(prompt + output)] for _ in range(64)]
    keys = list(range(rows))
    rng.shuffle(keys)
    meta = {"prompt_tokens": prompt, "completion_tokens": output, "endpoint": "http://127.0.0.1:30000"}
    fsyncs = count_fsyncs()
    start = time.perf_counter()
    with Journal.open(directory, fingerprint="bench", recipe={"name": "bench"}, flush_interval=interval) as j:
        for index in keys:
            ids = pool[index % 64]
            j.append(Row(RowKey(index, 0, 0), f"s{index}", ids[:prompt], ids[prompt:], "stop", index, meta))
    seconds = time.perf_counter() - start
    size = sum(path.stat().st_size for path in directory.glob("rows-*.bin"))
    return {"seconds": seconds, "fsyncs": fsyncs[0], "bytes": size}


def phase_open(directory: Path, rows: int, prompt: int, output: int, interval: float) -> dict[str, Any]:
    from eagle3_raw.journal import Journal

    start = time.perf_counter()
    with Journal.open(directory, fingerprint="bench", recipe={"name": "bench"}) as journal:
        done = journal.done()
    seconds = time.perf_counter() - start
    assert len(done) == rows, (len(done), rows)
    return {"seconds": seconds}


def phase_iter(directory: Path, rows: int, prompt: int, output: int, interval: float) -> dict[str, Any]:
    from eagle3_raw.journal import Journal

    start = time.perf_counter()
    seen = tokens = 0
    for table in Journal.read_dir(directory).iter_tables():
        seen += table.num_rows
        tokens += len(table.column("input_ids").combine_chunks().values)
    seconds = time.perf_counter() - start
    assert (seen, tokens) == (rows, rows * (prompt + output)), (seen, tokens)
    return {"seconds": seconds}


RUNNERS: dict[str, Callable[[Path, int, int, int, float], dict[str, Any]]] = {
    "append": phase_append,
    "open": phase_open,
    "iter": phase_iter,
}


def run_phase(phase: str, directory: Path, args: argparse.Namespace, rows: int) -> dict[str, Any]:
    command = [sys.executable, __file__, "--phase", phase, "--journal", str(directory), "--rows", str(rows)]
    command += ["--prompt-tokens", str(args.prompt_tokens), "--output-tokens", str(args.output_tokens)]
    command += ["--flush-interval", str(args.flush_interval)]
    result = subprocess.run(command, check=True, capture_output=True, text=True)
    return dict(json.loads(result.stdout.splitlines()[-1]))


def baseline_rss_mb(code: str) -> float:
    """Peak RSS of a process that only runs ``code`` (imports): the floor under every phase."""
    code += "; import resource; print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)"
    return float(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True).stdout)


FLOORS = {
    "journal": "import eagle3_raw.journal",
    "journal+pyarrow kernels": "import eagle3_raw.journal, pyarrow as pa; pa.array([1], pa.int32())",
    "datasets": "import datasets",
}


def bench_size(rows: int, args: argparse.Namespace) -> list[str]:
    directory = Path(tempfile.mkdtemp(prefix="bench-journal-", dir=args.dir)) / "j"
    try:
        results = {phase: run_phase(phase, directory, args, rows) for phase in PHASES}
    finally:
        shutil.rmtree(directory.parent)
    tokens = rows * (args.prompt_tokens + args.output_tokens)
    append, reopen, iterate = results["append"], results["open"], results["iter"]
    return [
        f"{rows:>7}",
        f"{append['bytes'] / 2**20:>7.0f}",
        f"{rows / append['seconds']:>8.0f}",
        f"{rows * args.output_tokens / append['seconds'] / 1e6:>8.2f}",
        f"{append['fsyncs']:>6}",
        f"{append['rss_mb']:>6.0f}",
        f"{reopen['seconds']:>7.2f}",
        f"{reopen['rss_mb']:>6.0f}",
        f"{rows / iterate['seconds']:>8.0f}",
        f"{tokens / iterate['seconds'] / 1e6:>7.1f}",
        f"{iterate['rss_mb']:>6.0f}",
    ]


HEADER = [
    "   rows", "    MiB", "append/s", " gen Mt/s", "fsyncs", "RSS MB",
    " open s", "RSS MB", "  iter/s", " iter Mt/s", "RSS MB",
]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 50_000, 100_000])
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--output-tokens", type=int, default=512)
    parser.add_argument("--flush-interval", type=float, default=1.0)
    parser.add_argument("--dir", default=None, help="where the temporary journals go")
    parser.add_argument("--phase", choices=PHASES, help=argparse.SUPPRESS)
    parser.add_argument("--journal", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--rows", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase:
        runner = RUNNERS[args.phase]
        result = runner(args.journal, args.rows, args.prompt_tokens, args.output_tokens, args.flush_interval)
        print(json.dumps({**result, "rss_mb": peak_rss_mb()}))
        return
    print(
        f"rows of {args.prompt_tokens} prompt + {args.output_tokens} generated tokens, random append order,"
    )
    floors = ", ".join(f"{name} {baseline_rss_mb(code):.0f}" for name, code in FLOORS.items())
    print(f"flush_interval {args.flush_interval}s; RSS MB of imports alone: {floors}")
    print("columns: append | reopen + done() | iter_tables (RSS = peak of that phase's process)")
    print(" ".join(HEADER))
    for rows in args.sizes:
        print(" ".join(bench_size(rows, args)), flush=True)


if __name__ == "__main__":
    main()
