"""``--shard auto`` (issue 16): the shard from the scheduler's variables, as SLURM 22.05 sets them
(checked against a real ``sbatch --array=3-7:2 --ntasks=2`` with ``srun`` inside), torchrun, and
eagle3_raw's Ray runner; the CLI says which it used."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from eagle3_raw.cluster.environment import shard_from_environment, shard_option
from eagle3_raw.errors import RecipeError
from eagle3_raw.run.plan import Shard
from tests.helpers import write_prompts, write_recipe
from tests.support.pace import scaled

_ARRAY = {"SLURM_ARRAY_JOB_ID": "5", "SLURM_ARRAY_TASK_ID": "5", "SLURM_ARRAY_TASK_COUNT": "3",
          "SLURM_ARRAY_TASK_MIN": "3", "SLURM_ARRAY_TASK_MAX": "7", "SLURM_ARRAY_TASK_STEP": "2",
          "SLURM_JOB_ID": "7", "SLURM_PROCID": "0", "SLURM_NTASKS": "2"}  # fmt: skip
"""Task 5 of ``--array=3-7:2 --ntasks=2``, in its batch script (no job step)."""


@pytest.mark.parametrize(
    ("env", "shard", "scheduler"),
    [
        (_ARRAY, Shard(1, 3), "slurm-array"),  # the batch step's SLURM_PROCID/NTASKS do not count
        ({**_ARRAY, "SLURM_STEP_ID": "0", "SLURM_PROCID": "1"}, Shard(3, 6), "slurm-array"),  # srun -n 2
        ({"SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_MAX": "7"}, Shard(2, 8),
         "slurm-array"),
        ({"SLURM_STEP_ID": "0", "SLURM_PROCID": "3", "SLURM_NTASKS": "4"}, Shard(3, 4), "slurm-tasks"),
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "4"}, None, None),  # a batch script: not a shard
        ({"SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}, None, None),
        ({"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1"}, Shard(5, 8), "torchrun"),
        ({"EAGLE3_RAW_RAY_SHARD": "2/4", "RANK": "0", "WORLD_SIZE": "1"}, Shard(2, 4), "ray"),
        ({}, None, None),
    ],
)  # fmt: skip
def test_the_shard_comes_from_the_scheduler(
    env: dict[str, str], shard: Shard | None, scheduler: str | None
) -> None:
    found = shard_from_environment(env)
    assert (found.shard if found else None) == shard
    assert (found.scheduler if found else None) == scheduler


def test_what_cannot_be_numbered_is_refused_naming_the_variables() -> None:
    sparse = {"SLURM_ARRAY_TASK_ID": "5", "SLURM_ARRAY_TASK_COUNT": "3", "SLURM_ARRAY_TASK_MIN": "1",
              "SLURM_ARRAY_TASK_MAX": "9"}  # --array=1,5,9  # fmt: skip
    with pytest.raises(RecipeError, match=r"not one range .*SLURM_ARRAY_TASK_MAX.*--array=0-<N-1>"):
        shard_from_environment(sparse)
    with pytest.raises(RecipeError, match=r"RANK=.x. is not an integer"):
        shard_from_environment({"RANK": "x", "WORLD_SIZE": "2"})
    with pytest.raises(RecipeError, match="shard 4 of 4"):
        shard_from_environment({"RANK": "4", "WORLD_SIZE": "4"})
    with pytest.raises(RecipeError, match="no scheduler variables are set"):
        shard_option("auto", {})
    assert shard_option(None, {}) == (None, None)
    assert shard_option("1/3", {"RANK": "0", "WORLD_SIZE": "2"}) == (Shard(1, 3), None)  # given wins


@pytest.mark.slow
def test_the_cli_says_which_shard_it_took_and_from_where(tmp_path: Path) -> None:
    write_prompts(tmp_path, 4)
    recipe = write_recipe(tmp_path, endpoints=[], server={"endpoints": None, "launch": "reference"})
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "RANK": "1", "WORLD_SIZE": "2",
           "EAGLE3_RAW_JOURNAL_DIR": str(tmp_path / "j")}  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "eagle3_raw.cli", "build", str(recipe), "--quiet"],
                          capture_output=True, text=True, timeout=scaled(120), env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "shard 1/2 from torchrun's RANK/WORLD_SIZE (RANK=1, WORLD_SIZE=2)" in done.stderr
    assert "shard 1/2 is complete" in done.stdout
    assert list((tmp_path / "j").glob("sets/*/complete-1-of-2.json"))
