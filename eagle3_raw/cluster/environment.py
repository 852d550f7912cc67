"""Which shard this process is, from the scheduler that started it.

``eagle3-raw build --shard auto`` (and ``build`` without ``--shard`` when one of these is set)
reads, first found wins:

1. ``EAGLE3_RAW_RAY_SHARD=i/N``: set by eagle3_raw's Ray runner (:mod:`.ray_runner`) for each task;
2. a SLURM array task: ``SLURM_ARRAY_TASK_ID`` with ``SLURM_ARRAY_TASK_COUNT`` (or
   ``SLURM_ARRAY_TASK_MIN``/``MAX``, and ``STEP``): the task's position in the array. Inside an
   ``srun`` step of several tasks (``SLURM_STEP_ID`` set, ``SLURM_NTASKS`` > 1), each task of each
   array element is a shard: ``array position x SLURM_NTASKS + SLURM_PROCID``;
3. the tasks of a SLURM job step (``srun``): ``SLURM_PROCID`` of ``SLURM_NTASKS`` (only inside a
   step: the batch script itself has them too, as task 0 of all of them);
4. ``torchrun`` (and other launchers of its convention): ``RANK`` of ``WORLD_SIZE``.

What was used is said in one line (:attr:`ShardSource.description`). An array that is not one
range (``--array=1,5,9``) cannot be numbered 0..N-1 and is refused, naming the variables.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from eagle3_raw.errors import RecipeError
from eagle3_raw.run.plan import Shard

RAY_VARIABLE = "EAGLE3_RAW_RAY_SHARD"


@dataclass(frozen=True)
class ShardSource:
    """A shard and where it came from."""

    shard: Shard
    scheduler: str
    """``ray``, ``slurm-array``, ``slurm-tasks`` or ``torchrun``."""
    variables: Mapping[str, str]
    """The variables it was read from, as they were."""

    @property
    def description(self) -> str:
        shown = ", ".join(f"{k}={v}" for k, v in self.variables.items())
        return f"shard {self.shard.index}/{self.shard.count} from {_NAMES[self.scheduler]} ({shown})"


_NAMES = {
    "ray": "eagle3_raw's Ray runner",
    "slurm-array": "the SLURM array",
    "slurm-tasks": "the SLURM job step's tasks",
    "torchrun": "torchrun's RANK/WORLD_SIZE",
}


def shard_from_environment(env: Mapping[str, str]) -> ShardSource | None:
    """The shard the scheduler variables in ``env`` give (see the module docstring), or None when
    there are none. RecipeError (naming the variables) when they are inconsistent."""
    readers: tuple[Callable[[Mapping[str, str]], ShardSource | None], ...] = (
        _ray, _slurm_array, _slurm_tasks, _torchrun,
    )  # fmt: skip
    for read in readers:
        found = read(env)
        if found is not None:
            return found
    return None


def _ray(env: Mapping[str, str]) -> ShardSource | None:
    if RAY_VARIABLE not in env:
        return None
    shard = Shard.parse(env[RAY_VARIABLE])
    return ShardSource(shard, "ray", {RAY_VARIABLE: env[RAY_VARIABLE]})


def _slurm_array(env: Mapping[str, str]) -> ShardSource | None:
    if "SLURM_ARRAY_TASK_ID" not in env:
        return None
    names = ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN",
             "SLURM_ARRAY_TASK_MAX", "SLURM_ARRAY_TASK_STEP")  # fmt: skip
    seen = {n: env[n] for n in names if n in env}
    index, count = _array_position(seen)
    step = _step_tasks(env)
    if step is not None:
        procid, ntasks = step
        seen |= {"SLURM_PROCID": env["SLURM_PROCID"], "SLURM_NTASKS": env["SLURM_NTASKS"]}
        index, count = index * ntasks + procid, count * ntasks
    return ShardSource(_shard(index, count, seen), "slurm-array", seen)


def _array_position(seen: Mapping[str, str]) -> tuple[int, int]:
    """(position of this task in the array, number of tasks), from the variables SLURM sets."""
    task = _int(seen, "SLURM_ARRAY_TASK_ID")
    if "SLURM_ARRAY_TASK_MIN" not in seen or "SLURM_ARRAY_TASK_MAX" not in seen:
        raise RecipeError(
            "--shard", "auto", f"SLURM_ARRAY_TASK_ID is set without SLURM_ARRAY_TASK_MIN/MAX ({seen})"
        )
    low, high = _int(seen, "SLURM_ARRAY_TASK_MIN"), _int(seen, "SLURM_ARRAY_TASK_MAX")
    step = _int(seen, "SLURM_ARRAY_TASK_STEP") if "SLURM_ARRAY_TASK_STEP" in seen else 1
    span = (high - low) // step + 1
    count = _int(seen, "SLURM_ARRAY_TASK_COUNT") if "SLURM_ARRAY_TASK_COUNT" in seen else span
    if count != span or (task - low) % step:
        raise RecipeError(
            "--shard", "auto",
            f"the SLURM array is not one range ({seen}), so its tasks cannot be numbered 0..N-1: "
            "submit it as --array=0-<N-1>, or give --shard i/N",
        )  # fmt: skip
    return (task - low) // step, count


def _slurm_tasks(env: Mapping[str, str]) -> ShardSource | None:
    step = _step_tasks(env)
    if step is None:
        return None
    seen = {n: env[n] for n in ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_ID")}
    return ShardSource(_shard(*step, seen), "slurm-tasks", seen)


def _step_tasks(env: Mapping[str, str]) -> tuple[int, int] | None:
    """(SLURM_PROCID, SLURM_NTASKS) inside a job step of several tasks, else None."""
    if "SLURM_STEP_ID" not in env or "SLURM_PROCID" not in env or "SLURM_NTASKS" not in env:
        return None
    ntasks = _int(env, "SLURM_NTASKS")
    return (_int(env, "SLURM_PROCID"), ntasks) if ntasks > 1 else None


def _torchrun(env: Mapping[str, str]) -> ShardSource | None:
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return None
    seen = {"RANK": env["RANK"], "WORLD_SIZE": env["WORLD_SIZE"]}
    return ShardSource(_shard(_int(env, "RANK"), _int(env, "WORLD_SIZE"), seen), "torchrun", seen)


def _shard(index: int, count: int, seen: Mapping[str, str]) -> Shard:
    if not 0 <= index < count:
        raise RecipeError(
            "--shard", "auto", f"the scheduler's variables give shard {index} of {count} ({seen})"
        )
    return Shard(index, count)


def _int(env: Mapping[str, str], name: str) -> int:
    try:
        return int(env[name])
    except ValueError:
        raise RecipeError("--shard", "auto", f"{name}={env[name]!r} is not an integer") from None


def shard_option(text: str | None, env: Mapping[str, str]) -> tuple[Shard | None, str | None]:
    """The shard of ``eagle3-raw build --shard TEXT`` and the line saying where it came from.

    ``I/N``: that shard. ``auto``: the scheduler's (RecipeError when no scheduler variable is set).
    None (no ``--shard``): the scheduler's if its variables are set, else no shard (None, None).
    """
    if text is not None and text.strip() != "auto":
        return Shard.parse(text), None
    found = shard_from_environment(env)
    if found is None:
        if text is None:
            return None, None
        raise RecipeError(
            "--shard", "auto",
            "no scheduler variables are set (SLURM_ARRAY_TASK_ID, SLURM_PROCID/SLURM_NTASKS in an srun "
            f"step, RANK/WORLD_SIZE, {RAY_VARIABLE}): give --shard i/N",
        )  # fmt: skip
    return found.shard, found.description
