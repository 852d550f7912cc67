"""Memory: peak RSS of a whole build (generation into the journal, then the ``datasets`` Arrow cache).

For each size (default 10k, 50k and 100k rows of about 1k tokens: a ~30-token prompt and
``max_new_tokens`` 994 with ``ignore_eos``), a fresh process runs ``eagle3_raw.load(recipe)``
against a reference server (its own process, not counted; no latency, ``--skip-tokenizer-init``,
greedy) and reports its peak RSS (``VmHWM`` from ``/proc/self/status`` and ``ru_maxrss``), its RSS
at the end, and how long it took. The floor is the peak RSS of a process that only runs
``import eagle3_raw, datasets``. Prompts, journals and every cache live in a temporary directory
(``HF_HOME``, ``HF_DATASETS_CACHE``, ``EAGLE3_RAW_JOURNAL_DIR``; ``HF_HUB_OFFLINE=1``); at 100k rows
that is about 1 GB of disk.

Usage::

    python benchmarks/bench_memory.py                   # 10k, 50k, 100k rows: about 3 minutes
    python benchmarks/bench_memory.py --quick           # 2k and 10k rows: under 30 s
    python benchmarks/bench_memory.py --sizes 200000    # any sizes
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import common

TARGET_MB = 400
FLAT_GROWTH = 0.25
"""Flat: peak RSS at the largest row count at most 25 % above the peak at the smallest."""
FLAT_MIN_SPAN = 5
"""Flatness is judged only when the largest row count is at least 5x the smallest."""
FLOOR_CODE = "import eagle3_raw, datasets"
SERVER_ARGS = ["--skip-tokenizer-init"]


def child(recipe_path: Path) -> dict[str, Any]:
    """Build the recipe's dataset with ``eagle3_raw.load``; the peak RSS and what was built."""
    import eagle3_raw

    with RssSampler() as sampler:
        start = time.perf_counter()
        dataset = eagle3_raw.load(str(recipe_path), progress="none")
        seconds = time.perf_counter() - start
    cache_bytes = sum(Path(f["filename"]).stat().st_size for f in dataset.cache_files)
    return {
        "rows": dataset.num_rows, "seconds": seconds, "cache_mb": cache_bytes / 2**20,
        **common.peak_rss_mb(), "end_rss_mb": common.status_mb()["VmRSS"],
        "peak_anon_mb": sampler.peak["RssAnon"], "peak_file_mb": sampler.peak["RssFile"],
    }  # fmt: skip


class RssSampler:
    """Peaks of ``RssAnon`` (heap: Python objects, buffers) and ``RssFile`` (mapped files such as the
    Arrow cache and shared libraries) sampled every 50 ms; ``VmHWM`` is the exact peak of their sum."""

    def __init__(self) -> None:
        self.peak = {"RssAnon": 0.0, "RssFile": 0.0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while True:
            now = common.status_mb()
            for key in self.peak:
                self.peak[key] = max(self.peak[key], now[key])
            if self._stop.wait(0.05):
                return


def floor_mb(env: dict[str, str]) -> dict[str, Any]:
    """Peak RSS of a process that only imports eagle3_raw and datasets."""
    code = f"{FLOOR_CODE}; import json, sys; sys.path.insert(0, {str(common.HERE)!r}); import common; "
    code += "print(json.dumps(common.peak_rss_mb()))"
    return common.run_json_child([sys.executable, "-c", code], env)


def measure(rows: int, server: Any, work: Path, env: dict[str, str]) -> dict[str, Any]:
    prompts = common.write_prompts(work / f"prompts-{rows}.jsonl", rows)
    recipe = common.bench_recipe(
        prompts, [server.url], max_new_tokens=994, ignore_eos=True, temperature=0.0, name=f"memory-{rows}"
    )
    recipe_path = common.write_recipe(work / f"recipe-{rows}.yaml", recipe)
    with common.CpuAccount([server.process.pid]) as cpu:
        result = common.run_json_child([sys.executable, __file__, "--child", str(recipe_path)], env)
    assert result["rows"] == rows, result
    return {"size": rows, **result, "others_cpu_seconds": cpu.others}


COLUMNS = [
    "rows", "build s", "rows/s", "Arrow MiB", "VmHWM MB", "ru_maxrss MB", "peak anon MB", "peak file MB",
    "end RSS MB", "others CPU s",
]  # fmt: skip


def row(r: dict[str, Any]) -> list[Any]:
    return [
        r["rows"], r["seconds"], r["rows"] / r["seconds"], r["cache_mb"], r["vmhwm_mb"], r["ru_maxrss_mb"],
        r["peak_anon_mb"], r["peak_file_mb"], r["end_rss_mb"], r["others_cpu_seconds"],
    ]  # fmt: skip


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(child(Path(args.child))))
        return
    from eagle3_raw.launching.reference import launch_reference

    print(f"machine: {common.machine()}")
    print("rows of ~1k tokens (~30 prompt + 994 generated); eagle3_raw.load() in a fresh process per size")
    with tempfile.TemporaryDirectory(prefix="bench-memory-", dir=args.dir) as tmp:
        work, env = Path(tmp), common.isolated_env(Path(tmp))
        floor = floor_mb(env)
        print(f"floor ({FLOOR_CODE}): VmHWM {floor['vmhwm_mb']:.0f} MB", flush=True)
        results = []
        with launch_reference(args=SERVER_ARGS) as server:
            for rows in args.sizes:
                results.append(measure(rows, server, work, env))
                print(f"  {rows:,} rows: VmHWM {results[-1]['vmhwm_mb']:.0f} MB", flush=True)
    print()
    common.print_table(COLUMNS, [row(r) for r in results])
    print_verdict(results, floor, quick=args.quick)
    common.write_json(args.json, {"machine": common.machine(), "floor": floor, "results": results})


def print_verdict(results: list[dict[str, Any]], floor: dict[str, Any], *, quick: bool) -> None:
    """Peak RSS under the target and flat in the row count: judged on full runs only."""
    by_rows = sorted(results, key=lambda r: r["rows"])
    small, large = by_rows[0], by_rows[-1]
    growth = large["vmhwm_mb"] / small["vmhwm_mb"] - 1
    peak = max(r["vmhwm_mb"] for r in results)
    print(f"\npeak RSS {small['vmhwm_mb']:.0f} MB at {small['rows']:,} rows, {large['vmhwm_mb']:.0f} MB "
          f"at {large['rows']:,} rows ({growth:+.0%}), highest {peak:.0f} MB; "
          f"floor {floor['vmhwm_mb']:.0f} MB")  # fmt: skip
    if quick:
        verdict = "not judged on --quick"
    elif large["rows"] < FLAT_MIN_SPAN * small["rows"]:
        verdict = f"not judged (flatness needs row counts at least {FLAT_MIN_SPAN}x apart)"
    else:
        verdict = "met" if peak < TARGET_MB and growth <= FLAT_GROWTH else "NOT met"
    print(f"target: peak RSS < {TARGET_MB} MB and flat (at most +{FLAT_GROWTH:.0%} from the smallest to "
          f"the largest row count): {verdict}")  # fmt: skip


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 50_000, 100_000])
    parser.add_argument("--quick", action="store_true", help="2k and 10k rows: a smoke run")
    parser.add_argument("--dir", help="where the temporary directory goes (default: the system's)")
    parser.add_argument("--json", help="also write the results to this JSON file")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes = [2_000, 10_000]
    return args


if __name__ == "__main__":
    main()
