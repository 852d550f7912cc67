"""Resuming a big journal (issue 10): time from process start to the first request, and the peak
memory of the bookkeeping of done rows.

1. Writes a prompt source of N rows (default 1,000,000) and, with the journal's own API
   (``Journal.open`` / ``add_generation``), that recipe's set with every row done but the last M
   (default 10): rows of ``--tokens`` ids (default 1,024: 30 prompt + 994 generated), synthetic
   digests, and the plan records the run that made them would have left (one per done source row:
   :mod:`eagle3_raw.journal.plans`). At 1M rows that is ~4.3 GB of disk.
2. Resumes it the way a user does, in a fresh process, against a reference server with a ledger:
   ``run()`` (the generation step of ``eagle3-raw build``), then again with ``eagle3-raw build``
   itself (stopped at its first request: it would go on to write the whole Arrow cache). The
   missing rows are the last ones, so the planner walks every done row before the first request
   (the worst case). First request = the server's first ledger line, from the moment the process
   was started. Peak RSS is ``VmHWM``; a second ``run()`` under tracemalloc gives the Python heap's
   peak above what the imports left. Between runs the journal is put back exactly as written
   (files cut to their sizes, new ones removed).
3. The bookkeeping alone, step by step in a fresh process (time, tracemalloc peak, what stays):
   the outcome index, the generation index, the done keys, the planner's exclusion set, a lookup;
   and the old implementation's (before issue 10) set of done ``RowKey``\\ s and its copy
   (``done | failed``), rebuilt from the same keys as the old ``Journal.done()`` built it.

Usage::

    python benchmarks/bench_resume.py                       # 1M rows: ~3 min to write, ~1 min to measure
    python benchmarks/bench_resume.py --quick               # 50k rows of 256 ids
    python benchmarks/bench_resume.py --work DIR            # keep (and reuse) the journal in DIR
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import common

PROMPT_IDS = 30
TURN = 1  # a one-message prompt row generates at message 1


# --- the synthetic journal -------------------------------------------------------------------------


def recipe_for(work: Path, url: str, rows: int, tokens: int) -> Path:
    prompts = work / "prompts.jsonl"
    if not prompts.exists():
        common.write_prompts(prompts, rows)
    recipe = common.bench_recipe(prompts, [url], max_new_tokens=tokens - PROMPT_IDS, name="resume")
    return common.write_recipe(work / "recipe.yaml", recipe)


def write_journal(recipe_path: Path, root: Path, rows: int, missing: int, tokens: int) -> dict[str, Any]:
    """Every row of the recipe's set but the last ``missing``, through the journal's API."""
    from eagle3_raw.journal import Journal
    from eagle3_raw.recipe import load_recipe
    from eagle3_raw.rows import RowKey, id_hash
    from eagle3_raw.run.build import RunOptions, fresh_manifest, resolve

    recipe = load_recipe(recipe_path)
    target = resolve(recipe, RunOptions(journal_dir=root))
    prompt, output = list(range(1, PROMPT_IDS + 1)), [7 + i % 6000 for i in range(tokens - PROMPT_IDS)]
    generation = {"finish_reason": "length", "sampling_params": {"max_new_tokens": len(output)}, "meta": {}}
    started = time.perf_counter()
    with Journal.open(root, fresh_manifest(recipe, target), target) as journal:
        for index in range(rows - missing):
            digest = hashlib.sha256(index.to_bytes(8, "little")).digest()
            journal.add_generation(
                RowKey(index, TURN, 0), digest=digest[:16], input_key=digest[16:], prompt_ids=prompt,
                output_ids=output, generation=generation,
                row={"source_id": f"p{index:07d}", "sampling_seed": index, "attempts": 1},
            )  # fmt: skip
            if journal.sets.plans is not None:  # what the planner of the run that made them recorded
                journal.sets.plans.add(index, id_hash(f"p{index:07d}"), 1)
    seconds = time.perf_counter() - started
    size = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    return {"rows": rows - missing, "seconds": seconds, "bytes": size}


def written_marker(recipe_path: Path, root: Path, args: argparse.Namespace) -> dict[str, Any]:
    """What ``root`` holds once :func:`write_journal` is done: the set as this code names it, its shape."""
    from eagle3_raw.recipe import load_recipe
    from eagle3_raw.run.build import journal_dir_for

    directory = journal_dir_for(load_recipe(recipe_path), root)
    return {"set": directory.name, "rows": args.rows, "tokens": args.tokens, "missing": args.missing,
            "plan_records": True}  # fmt: skip


def journal_is_current(recipe_path: Path, root: Path, args: argparse.Namespace) -> bool:
    marker = root.parent / "journal-written.json"
    return marker.exists() and json.loads(marker.read_text()) == written_marker(recipe_path, root, args)


def snapshot(root: Path) -> dict[str, Any]:
    files = {str(p): p.stat().st_size for p in root.rglob("*") if p.is_file()}
    manifests = {str(p): p.read_bytes() for p in root.rglob("manifest.json")}
    return {"files": files, "manifests": manifests}


def restore(root: Path, saved: dict[str, Any]) -> None:
    """The journal as ``snapshot`` saw it: appended files cut back, new files removed."""
    for path in [p for p in root.rglob("*") if p.is_file()]:
        size = saved["files"].get(str(path))
        if size is None:
            path.unlink()
        elif path.stat().st_size > size:
            os.truncate(path, size)
    for name, data in saved["manifests"].items():
        Path(name).write_bytes(data)


# --- resuming ---------------------------------------------------------------------------------------


def resume_child(recipe_path: Path, root: Path, trace: bool, limit: int | None) -> dict[str, Any]:
    """In a fresh process: ``run()`` the recipe (its first ``limit`` rows) into ``root``; what it did
    and what it cost."""
    from bench_memory import RssSampler

    from eagle3_raw.recipe import load_recipe
    from eagle3_raw.run.build import RunOptions, run

    recipe = load_recipe(recipe_path, {"prompts.limit": limit} if limit else {})
    imported = common.status_mb()["VmRSS"]
    if trace:
        tracemalloc.start()
    with RssSampler() as sampler:
        started = time.perf_counter()
        result = run(recipe, RunOptions(journal_dir=root, progress="none"))
        seconds = time.perf_counter() - started
    traced = tracemalloc.get_traced_memory()[1] / 2**20 if trace else None
    return {
        "seconds": seconds, "run_rows": result.summary.run_rows, "rows": result.summary.rows,
        "rss_after_imports_mb": imported, **common.peak_rss_mb(), "peak_anon_mb": sampler.peak["RssAnon"],
        "traced_peak_mb": traced,
    }  # fmt: skip


def first_request(ledger: Path, since: float, process: subprocess.Popen[Any]) -> float | None:
    """Seconds from ``since`` (when the process was started) to the first ledger line written after
    it (the server keeps its ledger open: it is never removed, only read from where it ended)."""
    start = ledger.stat().st_size if ledger.exists() else 0
    while not (ledger.exists() and ledger.stat().st_size > start):
        if process.poll() is not None:
            return None
        time.sleep(0.005)
    with ledger.open("rb") as f:
        f.seek(start)
        return float(json.loads(f.readline())["time"]) - since


def resume(
    recipe_path: Path, root: Path, ledger: Path, env: dict[str, str], trace: bool, limit: int | None = None
) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", str(recipe_path), str(root)]
    command += [*(["--trace"] if trace else []), *(["--limit", str(limit)] if limit else [])]
    started = time.time()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    first = first_request(ledger, started, process)
    out, err = process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"resume failed ({process.returncode}):\n{err[-3000:]}")
    return {**json.loads(out.strip().splitlines()[-1]), "first_request_s": first}


def cli_first_request(recipe_path: Path, root: Path, ledger: Path, env: dict[str, str]) -> float | None:
    """Seconds from starting ``eagle3-raw build`` to its first request (then it is stopped)."""
    command = [sys.executable, "-m", "eagle3_raw.cli", "build", str(recipe_path), "--quiet",
               "--journal-dir", str(root)]  # fmt: skip
    started = time.time()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    first = first_request(ledger, started, process)
    process.send_signal(signal.SIGINT)
    process.communicate(timeout=120)
    return first


# --- the bookkeeping alone -------------------------------------------------------------------------


def step(name: str, results: list[dict[str, Any]], call: Any) -> Any:
    """``call()``, with its time (a first call, untraced) and tracemalloc's peak and what it kept
    (a second call, traced)."""
    started = time.perf_counter()
    call()
    seconds = time.perf_counter() - started
    tracemalloc.start()
    value = call()
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    results.append({"step": name, "seconds": seconds, "peak_mb": peak / 2**20, "kept_mb": current / 2**20})
    return value


def bookkeeping_child(recipe_path: Path, root: Path) -> dict[str, Any]:
    """Each step of planning a resume, timed and traced; then the old implementation's sets."""

    from eagle3_raw.identity import set_config_id
    from eagle3_raw.journal import Journal
    from eagle3_raw.journal.sets import union_keys
    from eagle3_raw.recipe import load_recipe
    from eagle3_raw.rows import RowKey
    from eagle3_raw.run.build import RunOptions, resolve
    from eagle3_raw.run.plan import KeySet

    recipe = load_recipe(recipe_path)
    config_id = set_config_id(recipe, resolve(recipe, RunOptions(journal_dir=root)))
    steps: list[dict[str, Any]] = []
    journal = Journal.read(root, config_id)
    step("outcome index (SetJournal.entries)", steps, journal.sets.entries)
    index = step("generation index (GenerationIndex)", steps, journal.generation_index)
    done = step("done keys (Journal.done_keys)", steps, lambda: journal.done_keys(index))
    failed = step("failed keys (Journal.failed_keys)", steps, lambda: journal.failed_keys(done))
    exclude = step("exclusion set (KeySet of both)", steps, lambda: KeySet(union_keys(done, failed)))
    keys = [RowKey(i, TURN, 0) for i in range(len(done))]
    found = step(
        "a lookup per row, in key order (key in KeySet)", steps, lambda: sum(k in exclude for k in keys)
    )
    memo = [hashlib.sha256(i.to_bytes(8, "little")).digest()[16:] for i in range(0, len(done), 97)]
    step("a memo lookup (GenerationIndex.memo), x 1/97 rows", steps, lambda: [index.memo(k) for k in memo])
    old = step("old: set of done RowKeys", steps, lambda: {RowKey(k >> 24, TURN, 0) for k in done.tolist()})
    step("old: its copy, done | failed", steps, lambda: old | set())
    return {
        "steps": steps, "done": len(done), "found": found, "memo_lookups": len(memo),
        "index_bytes": index.nbytes, "exclude_bytes": len(exclude) * 8,
    }  # fmt: skip


# --- driver ------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        recipe_path, root = Path(args.child[0]), Path(args.child[1])
        if args.bookkeeping:
            data = bookkeeping_child(recipe_path, root)
        else:
            data = resume_child(recipe_path, root, args.trace, args.limit)
        print(json.dumps(data))
        return
    with tempfile.TemporaryDirectory(prefix="bench-resume-", dir=args.dir) as tmp:
        work = Path(args.work) if args.work else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        measure(args, work)


def measure(args: argparse.Namespace, work: Path) -> None:
    from eagle3_raw.launching.reference import launch_reference

    env = {**os.environ, **common.isolated_env(work)}
    root, ledger = work / "journals", work / "ledger.jsonl"
    print(f"machine: {common.machine()}")
    with launch_reference(args=["--ledger", str(ledger)]) as server:
        recipe_path = recipe_for(work, server.url, args.rows, args.tokens)
        if not journal_is_current(recipe_path, root, args):  # none yet, or named by other code
            shutil.rmtree(root, ignore_errors=True)
            written = write_journal(recipe_path, root, args.rows, args.missing, args.tokens)
            marker = written_marker(recipe_path, root, args)
            (work / "journal-written.json").write_text(json.dumps(marker))
            rate, gib = written["rows"] / written["seconds"], written["bytes"] / 2**30
            print(f"journal: {written['rows']:,} rows of {args.tokens} ids written in "
                  f"{written['seconds']:.0f} s ({rate:,.0f} rows/s), {gib:.2f} GiB")  # fmt: skip
        floors = []
        for trace in (False, True):  # the same run() of the missing rows' count into an empty journal
            floors.append(resume(recipe_path, work / "floor", ledger, env, trace, limit=args.missing))
            shutil.rmtree(work / "floor")
        saved = snapshot(root)
        runs = []
        for trace in (False, True):
            runs.append(resume(recipe_path, root, ledger, env, trace))
            restore(root, saved)
            print(
                f"  resume{' (tracemalloc)' if trace else ''}: first request {runs[-1]['first_request_s']}",
                flush=True,
            )
        cli = cli_first_request(recipe_path, root, ledger, env)
        restore(root, saved)
        book = common.run_json_child([sys.executable, __file__, "--child", str(recipe_path), str(root),
                                      "--bookkeeping"], env)  # fmt: skip
    report(args, floors, runs, cli, book)


def report(
    args: argparse.Namespace, floors: list[dict[str, Any]], runs: list[dict[str, Any]], cli: float | None,
    book: dict[str, Any],
) -> None:  # fmt: skip
    (plain, traced), (floor, floor_traced) = runs, floors
    assert plain["run_rows"] == args.missing and plain["rows"] == args.rows, plain
    per_row = 2**20 / args.rows
    heap = traced["traced_peak_mb"] - floor_traced["traced_peak_mb"]
    print(f"\nresume of {args.rows:,} rows, the last {args.missing} missing (every done row is walked first)")
    common.print_table(
        ["measure", "resume", f"floor: {args.missing} rows, empty journal"],
        [
            ["first request after start, run() s", plain["first_request_s"], floor["first_request_s"]],
            ["first request after start, eagle3-raw build s", cli, None],
            ["run() wall s (plan, generate the missing, flush, summary)", plain["seconds"], floor["seconds"]],
            ["peak RSS (VmHWM) MB", plain["vmhwm_mb"], floor["vmhwm_mb"]],
            ["tracemalloc peak during run() MB", traced["traced_peak_mb"], floor_traced["traced_peak_mb"]],
            ["peak RSS above the floor, B per row", (plain["vmhwm_mb"] - floor["vmhwm_mb"]) * per_row, None],
            ["tracemalloc peak above the floor, B per row", heap * per_row, None],
        ],
    )  # fmt: skip
    print(f"\nbookkeeping, step by step ({book['done']:,} done keys)")
    rows = [
        [s["step"], s["seconds"], s["peak_mb"], s["kept_mb"], s["kept_mb"] * per_row] for s in book["steps"]
    ]
    common.print_table(["step", "s", "peak MB", "kept MB", "kept B/row"], rows)
    common.write_json(args.json, {"machine": common.machine(), "rows": args.rows, "tokens": args.tokens,
                                  "missing": args.missing, "floors": floors, "runs": runs,
                                  "cli_first_request_s": cli, "bookkeeping": book})  # fmt: skip


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument(
        "--tokens", type=int, default=1024, help="ids per row (30 prompt, the rest generated)"
    )
    parser.add_argument("--missing", type=int, default=10, help="rows left out, at the end of the source")
    parser.add_argument("--quick", action="store_true", help="50k rows of 256 ids: a smoke run")
    parser.add_argument("--work", help="keep the prompts and the journal here (reused when present)")
    parser.add_argument("--dir", help="where the temporary directory goes (default: the system's)")
    parser.add_argument("--json", help="also write the results to this JSON file")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--trace", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--limit", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--bookkeeping", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.tokens = 50_000, 256
    return args


if __name__ == "__main__":
    main()
