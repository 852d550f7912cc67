"""``eagle3-raw slurm``: a recipe's shards as a SLURM array job, and the merge as a job after it.

Two sbatch scripts are written into the job folder:

- ``shards.sbatch``: an array of N tasks, one node each. Task i runs ``eagle3-raw build RECIPE
  --shard auto`` (shard i/N from ``SLURM_ARRAY_TASK_*``, :mod:`.environment`) into the journal on
  shared storage; with ``server.launch: sglang`` (or ``vllm``) the build starts its node's server
  and stops it when it ends. On SIGTERM (preemption, ``scancel``) or SIGUSR1 (sent ``signal_seconds``
  before the time limit: ``--signal=B:USR1@S``) the script passes SIGTERM to the build, which aborts
  its in-flight requests, flushes the journal and exits 130; the script then requeues its own task
  (``scontrol requeue <array job>_<task>``, allowed by ``--requeue``; a task being cancelled is not
  requeued), and the task's next run resumes exactly where the journal stopped. A build that
  finished with rows failed for good (exit 4) counts as done: its shard is complete, and the merge
  reports them.
- ``merge.sbatch``: ``eagle3-raw merge`` (then ``push`` if asked), submitted with
  ``--dependency=afterok:<array job>``: it runs once every task has succeeded; it sends no request
  and starts no server (the target is the journal's record of the shards' launch). It asks for no
  GPU (``--gpus`` and GPU requests among ``--sbatch-arg`` go to the shards only) and goes to
  ``merge_partition`` (default: none, the cluster's default partition), not the shards' partition.

Both run ``python -m eagle3_raw.cli`` as the node resolves it: the first ``python`` on its ``PATH``
once the ``setup`` lines have run (``source /shared/venv/bin/activate``), never the submitting
machine's own interpreter path; ``command`` names another one.

Why our own generator and not datatrove's ``SlurmPipelineExecutor`` (datatrove 0.10.1, read for
this): its unit of work is a pickled (dill) datatrove pipeline with its own completion files and
logging folder, it would make datatrove, dill and fsspec dependencies, and its requeue handler
(``scontrol requeue $SLURM_JOB_ID`` then ``exit 15`` from inside the Python process) leaves no room
for the flush and the aborts. The conventions are the same: ``--requeue``, a signal before the time
limit, ``%A_%a`` logs, ``--array=0-N%K``, a dependent ``afterok`` job after the array.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from eagle3_raw.errors import FatalError, RecipeError

DEFAULT_COMMAND = ("python", "-m", "eagle3_raw.cli")
"""How the nodes run eagle3-raw unless told otherwise: the ``python`` their ``PATH`` gives."""

BUILD_INTERRUPTED = 130
"""``eagle3-raw build``'s exit code when stopped by a signal (``eagle3_raw.cli.main.EXIT_INTERRUPTED``)."""


@dataclass(frozen=True)
class SlurmJob:
    """What ``eagle3-raw slurm`` generates: every path absolute (the jobs run elsewhere)."""

    recipe: Path
    shards: int
    journal_dir: Path
    job_dir: Path
    name: str
    overrides: tuple[str, ...] = ()
    """``--set KEY=VALUE`` items, passed to every command as given."""
    partition: str | None = None
    time: str | None = None
    merge_time: str | None = "01:00:00"
    gpus: int | None = None
    """GPUs per shard task (``--gpus``)."""
    cpus_per_task: int | None = None
    mem: str | None = None
    parallel: int | None = None
    """At most this many tasks at once (``--array=0-N%K``)."""
    signal_seconds: int = 300
    sbatch_args: tuple[str, ...] = ()
    """More ``#SBATCH`` options for both jobs, e.g. ``--account=abc``."""
    setup: tuple[str, ...] = ()
    """Shell lines run before the commands (``module load ...``, ``source venv/bin/activate``)."""
    command: tuple[str, ...] = DEFAULT_COMMAND
    """How the nodes run eagle3-raw, resolved on the node after the ``setup`` lines."""
    merge_partition: str | None = None
    """The merge job's partition (it needs no GPU); None: the cluster's default."""
    cache_dir: Path | None = None
    output_dir: Path | None = None
    push: tuple[str, ...] = ()
    """``eagle3-raw push`` options after the recipe (``--repo org/name --tag v1``), or none."""

    def __post_init__(self) -> None:
        if self.shards < 1:
            raise RecipeError("--shards", self.shards, "expected an integer >= 1")
        if self.parallel is not None and self.parallel < 1:
            raise RecipeError("--parallel", self.parallel, "expected an integer >= 1")
        if self.signal_seconds < 1:
            raise RecipeError("--signal-seconds", self.signal_seconds, "expected an integer >= 1")
        for name in ("recipe", "journal_dir", "job_dir"):
            if not getattr(self, name).is_absolute():
                raise RecipeError(name, str(getattr(self, name)), "expected an absolute path")
        values: dict[str, Sequence[str | None]] = {
            "--partition": [self.partition], "--time": [self.time], "--merge-time": [self.merge_time],
            "--mem": [self.mem], "--sbatch-arg": self.sbatch_args, "--set": self.overrides,
            "--push": self.push, "--merge-partition": [self.merge_partition],
        }  # fmt: skip
        for option, items in values.items():
            for value in items:
                check_one_line(option, value)
        if not self.command:
            raise RecipeError("--command", "", "expected a command, e.g. 'python -m eagle3_raw.cli'")


def check_one_line(option: str, value: object) -> None:
    """RecipeError for a value with a control character: a newline in an ``#SBATCH`` line would
    make the rest of it a shell line of the script."""
    if isinstance(value, str) and any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise RecipeError(option, value, "expected one line without control characters (a newline, \\r, ...)")


@dataclass(frozen=True)
class SlurmScripts:
    """The scripts written, and the job ids once submitted."""

    shards: Path
    merge: Path
    array_id: str | None = None
    merge_id: str | None = None

    def submit_commands(self) -> list[str]:
        """The two commands that submit them by hand."""
        return [
            f"id=$(sbatch --parsable {shlex.quote(str(self.shards))})",
            f"sbatch --dependency=afterok:${{id%%;*}} {shlex.quote(str(self.merge))}",
        ]


def interpreter_note(job: SlurmJob) -> str | None:
    """A note when, with neither ``setup`` nor ``command``, this machine's ``PATH`` gives a
    ``python`` other than the one running now (the nodes, given the same ``PATH`` by sbatch, would
    run that one); else None."""
    if job.setup or job.command != DEFAULT_COMMAND:
        return None
    found = shutil.which("python")
    if found is not None and Path(found).parent == Path(sys.executable).parent:
        return None
    return (
        f"note: the jobs run `python -m eagle3_raw.cli` as the nodes' PATH gives it (here: {found or 'none'},"
        f" not this eagle3-raw's {sys.executable}); choose it with --setup 'source /shared/venv/bin/activate'"
        " or --command"
    )


def write_scripts(job: SlurmJob) -> SlurmScripts:
    """Write ``shards.sbatch`` and ``merge.sbatch`` (and the ``logs`` folder) into ``job.job_dir``."""
    job.job_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    (job.job_dir / "logs").mkdir(mode=0o700, exist_ok=True)  # the jobs' output: rows' text, errors
    shards, merge = job.job_dir / "shards.sbatch", job.job_dir / "merge.sbatch"
    for path, text in ((shards, shards_script(job)), (merge, merge_script(job))):
        path.unlink(missing_ok=True)
        with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o700), "w") as handle:
            handle.write(text)  # the user's commands and settings: readable and runnable by them only
    return SlurmScripts(shards, merge)


def submit(scripts: SlurmScripts, *, sbatch: Sequence[str] = ("sbatch",)) -> SlurmScripts:
    """Submit the array, then the merge after it (``afterok``); the job ids."""
    array_id = _sbatch([*sbatch, "--parsable", str(scripts.shards)])
    merge_id = _sbatch([*sbatch, "--parsable", f"--dependency=afterok:{array_id}", str(scripts.merge)])
    return SlurmScripts(scripts.shards, scripts.merge, array_id, merge_id)


def _sbatch(command: list[str]) -> str:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    except OSError as exc:
        raise FatalError(f"cannot run {command[0]} ({exc}): is SLURM installed here?") from exc
    if done.returncode != 0:
        raise FatalError(f"{shlex.join(command)} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return done.stdout.strip().split(";")[0]  # --parsable: "<id>[;<cluster>]"


def shards_script(job: SlurmJob) -> str:
    """The array job's script (see the module docstring)."""
    array = f"0-{job.shards - 1}" + (f"%{job.parallel}" if job.parallel else "")
    options = [
        f"--job-name={_job_name(job.name)}", f"--array={array}", "--nodes=1", "--ntasks=1", "--requeue",
        "--open-mode=append", f"--signal=B:USR1@{job.signal_seconds}",
        f"--output={job.job_dir / 'logs' / '%x-%A_%a.out'}",
        *_resources(job.partition, job.time, job.sbatch_args),
        *([f"--gpus={job.gpus}"] if job.gpus else []),
        *([f"--cpus-per-task={job.cpus_per_task}"] if job.cpus_per_task else []),
        *([f"--mem={job.mem}"] if job.mem else []),
    ]  # fmt: skip
    build = _eagle3_raw(job, "build", "--shard", "auto", "--journal-dir", str(job.journal_dir), "--quiet")
    return _script(options, job, _SHARD_BODY.format(build=build, interrupted=BUILD_INTERRUPTED))


def merge_script(job: SlurmJob) -> str:
    """The merge job's script: merge (and push), no GPU, no server, its own partition."""
    no_gpus = [option for option in job.sbatch_args if not asks_for_gpus(option)]
    options = [
        f"--job-name={_job_name(job.name)}-merge", "--nodes=1", "--ntasks=1",
        f"--output={job.job_dir / 'logs' / '%x-%j.out'}",
        *_resources(job.merge_partition, job.merge_time, no_gpus),
    ]  # fmt: skip
    outputs = [*(["--cache-dir", str(job.cache_dir)] if job.cache_dir else [])]
    merge = _eagle3_raw(job, "merge", "--journal-dir", str(job.journal_dir), *outputs,
                        *(["--output-dir", str(job.output_dir)] if job.output_dir else []))  # fmt: skip
    lines = [merge]
    if job.push:
        lines.append(_eagle3_raw(job, "push", *job.push, "--journal-dir", str(job.journal_dir), *outputs))
    return _script(options, job, "set -e\n" + "\n".join(lines) + "\n")


def _resources(partition: str | None, time: str | None, sbatch_args: Sequence[str]) -> list[str]:
    return [*([f"--partition={partition}"] if partition else []), *([f"--time={time}"] if time else []),
            *sbatch_args]  # fmt: skip


_GPU_OPTION = re.compile(r"(--gres|--gpus|--gpu-|--gpu=|-G|--\w+-per-gpu)")


def asks_for_gpus(option: str) -> bool:
    """True for an ``#SBATCH`` option that requests GPUs or other generic resources (``--gres``,
    ``--gpus*``, ``-G``, ``--mem-per-gpu``, ...): the merge job gets none of them."""
    return _GPU_OPTION.match(option) is not None


def _eagle3_raw(job: SlurmJob, subcommand: str, *args: str) -> str:
    sets = [word for item in job.overrides for word in ("--set", item)]
    return shlex.join([*job.command, subcommand, str(job.recipe), *sets, *args])


def _job_name(name: str) -> str:
    return f"e3-{name}"[:64]


def _script(options: Sequence[str], job: SlurmJob, body: str) -> str:
    for option in options:  # every #SBATCH line is one line, whatever made it (paths too)
        check_one_line("#SBATCH", option)
    header = "\n".join(f"#SBATCH {shlex.quote(option)}" for option in options)
    return (
        f"#!/bin/bash\n{header}\n# generated by eagle3-raw slurm (see eagle3_raw/cluster/slurm.py)\n"
        "set -uo pipefail\nexport PYTHONUNBUFFERED=1\n"
        + "".join(f"{line}\n" for line in job.setup)
        + _FIND_COMMAND.format(program=shlex.quote(job.command[0]))
        + body
    )


_FIND_COMMAND = """\
# the program as this node resolves it, after the setup lines above
if ! command -v {program} >/dev/null 2>&1; then
  echo "eagle3-raw: "{program}" is not found on $(hostname) (PATH=$PATH); choose the interpreter with \\
--setup 'source /shared/venv/bin/activate' or name the command with --command" >&2
  exit 2
fi
echo "eagle3-raw: running $(command -v {program})"
"""


_SHARD_BODY = """\
echo "eagle3-raw: array task ${{SLURM_ARRAY_TASK_ID}} (job ${{SLURM_JOB_ID}}, \\
run ${{SLURM_RESTART_COUNT:-0}}) on $(hostname)"
{build} &
build=$!
# preemption or scancel (TERM), or the time limit coming (USR1): the build aborts its in-flight
# requests, flushes its journal and exits {interrupted}
trap 'kill -TERM "$build" 2>/dev/null' TERM USR1 INT
while kill -0 "$build" 2>/dev/null; do wait "$build"; done  # a trapped signal ends a wait early
wait "$build"
code=$?
case "$code" in
  0) exit 0 ;;
  4) echo "eagle3-raw: the shard is complete; rows that failed for good are listed by the merge"; exit 0 ;;
  {interrupted})
    task="${{SLURM_ARRAY_JOB_ID}}_${{SLURM_ARRAY_TASK_ID}}"
    echo "eagle3-raw: stopped; requeueing $task to resume"
    scontrol requeue "$task" || echo "eagle3-raw: $task was not requeued (cancelled?)"
    exit {interrupted} ;;
  *) exit "$code" ;;
esac
"""
