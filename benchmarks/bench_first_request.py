"""Time to the first request for a large prompt source (issue 6: rendering is pipelined with sending).

Writes a JSONL source of N plain prompts (default 1,000,000), starts a reference server with a
ledger, starts ``eagle3-raw build`` and reports how long after the build process started the server
saw its first ``/generate`` request, then stops the build (it would otherwise generate N rows).

    python benchmarks/bench_first_request.py [--rows N]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
import yaml

from eagle3_raw.launching.reference import launch_reference


def write_source(path: Path, rows: int) -> None:
    with path.open("wb") as out:
        for i in range(rows):
            out.write(
                orjson.dumps({"id": f"r{i}", "prompt": f"Tell me something about the number {i}."}) + b"\n"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        started = time.monotonic()
        write_source(work / "prompts.jsonl", args.rows)
        written = time.monotonic() - started
        ledger = work / "ledger.jsonl"
        with launch_reference(args=["--ledger", str(ledger)]) as server:
            recipe = {
                "name": "first", "prompts": {"source": "prompts.jsonl", "id_column": "id"},
                "server": {"endpoints": [server.url]}, "sampling": {"max_new_tokens": 32},
            }  # fmt: skip
            (work / "r.yaml").write_text(yaml.safe_dump(recipe))
            env = {
                **os.environ,
                "EAGLE3_RAW_JOURNAL_DIR": str(work / "j"),
                "HF_DATASETS_CACHE": str(work / "c"),
            }
            command = [sys.executable, "-m", "eagle3_raw.cli", "build", str(work / "r.yaml"), "--quiet"]
            launched = time.monotonic()
            build = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            while not (ledger.exists() and ledger.stat().st_size > 0):
                time.sleep(0.01)
            first = time.monotonic() - launched
            build.send_signal(signal.SIGINT)
            build.wait(timeout=60)
    print("| source rows | source size written in | first /generate after build start |")
    print("|---|---|---|")
    print(f"| {args.rows:,} | {written:.1f} s | {first:.2f} s |")


if __name__ == "__main__":
    main()
