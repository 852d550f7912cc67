"""``eagle3-raw ray``: a recipe's shards as Ray tasks on an existing Ray cluster, then the merge.

Each shard is one task (``num_cpus``/``num_gpus`` as asked, so Ray places one per GPU node when
``num_gpus`` is the node's count); the task knows its shard from ``EAGLE3_RAW_RAY_SHARD``, set in
its runtime environment (:mod:`.environment`), and runs the build in the worker process: with
``server.launch: sglang`` (or ``vllm``) it starts its own server on its node (on the GPUs Ray gave
it) and stops it when it ends; with ``server.endpoints`` every task sends to those. Every task writes the
journal on storage all nodes share (``journal_dir``); a task Ray retries (a node lost) resumes
from it. Once every task has finished, the driver merges the set from the journal (no request).

Needs ``pip install 'eagle3_raw[ray]'`` on the driver and on every node, and the recipe, its
prompt files and the journal folder at the same paths everywhere. Ctrl-C on the driver cancels
the tasks (each aborts its in-flight requests and flushes its journal: run again to resume).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3_raw.builder import build
from eagle3_raw.cluster.environment import RAY_VARIABLE, shard_from_environment
from eagle3_raw.errors import FatalError, Interrupted, RecipeError
from eagle3_raw.recipe import load_recipe
from eagle3_raw.run.build import RunOptions, run

if TYPE_CHECKING:
    from eagle3_raw.builder import Built


@dataclass(frozen=True)
class RayShards:
    """The shards to run: the recipe (a path every node can read, or a bundled name), how many,
    where the journal is, and what each task needs."""

    recipe: str
    shards: int
    journal_dir: Path
    overrides: Mapping[str, Any] = field(default_factory=dict)
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    max_retries: int = 3
    """How often Ray runs a task again whose worker or node died (it resumes from the journal)."""

    def __post_init__(self) -> None:
        if self.shards < 1:
            raise RecipeError("--shards", self.shards, "expected an integer >= 1")
        if not self.journal_dir.is_absolute():
            raise RecipeError("--journal-dir", str(self.journal_dir), "expected an absolute path (shared)")


@dataclass(frozen=True)
class RayResult:
    """What each task did, and the merged set (None with ``merge=False``)."""

    tasks: list[dict[str, Any]]
    built: Built | None


def run_on_ray(
    spec: RayShards, *, address: str | None = None, merge: bool = True, cache_dir: Path | None = None
) -> RayResult:
    """Run ``spec``'s shards as Ray tasks (connecting to the cluster at ``address`` unless Ray is
    initialized already), wait for all, then merge (see the module docstring)."""
    ray = _import_ray()

    load_recipe(spec.recipe, dict(spec.overrides))  # a bad recipe fails here, not on every node
    if not ray.is_initialized():
        _connect(ray, address)
    task = ray.remote(_shard_task)
    refs = [
        task.options(
            num_cpus=spec.num_cpus, num_gpus=spec.num_gpus, max_retries=spec.max_retries,
            runtime_env={"env_vars": {RAY_VARIABLE: f"{i}/{spec.shards}"}}, name=f"eagle3-raw-shard-{i}",
        ).remote(spec.recipe, dict(spec.overrides), str(spec.journal_dir))
        for i in range(spec.shards)
    ]  # fmt: skip
    tasks = _wait(ray, refs)
    return RayResult(tasks, _merge(spec, cache_dir) if merge else None)


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise FatalError("eagle3-raw ray needs Ray: pip install 'eagle3_raw[ray]'") from exc
    return ray


def _connect(ray: Any, address: str | None) -> None:
    """Join the Ray cluster at ``address`` (default: ``RAY_ADDRESS``, else the local ``ray start``)."""
    try:
        ray.init(address=address or "auto")
    except ConnectionError as exc:
        raise FatalError(
            f"no Ray cluster answers at {address or 'auto'} ({exc}): start one (ray start --head), "
            "or pass --address (or set RAY_ADDRESS) to yours"
        ) from exc


def _wait(ray: Any, refs: list[Any]) -> list[dict[str, Any]]:
    """Every task's result, once all have ended (a failed shard does not stop the others: their
    rows are kept); FatalError naming each failed shard. Ctrl-C cancels them all (each flushes)."""
    results: list[dict[str, Any]] = []
    failures: list[str] = []
    try:
        for index, ref in enumerate(refs):
            try:
                results.append(ray.get(ref))
            except ray.exceptions.RayTaskError as exc:
                cause = exc.cause if isinstance(getattr(exc, "cause", None), BaseException) else exc
                failures.append(f"shard {index} failed on Ray: {cause}")
    except KeyboardInterrupt:
        for ref in refs:
            ray.cancel(ref)
        raise Interrupted(
            "interrupted: the shard tasks were cancelled; every finished row is in the journal. "
            "Run the same command again to resume"
        ) from None
    if failures:
        raise FatalError("; ".join(failures) + " (the other shards' rows are in the journal: run again)")
    return results


def _merge(spec: RayShards, cache_dir: Path | None) -> Built:
    options = {"journal_dir": spec.journal_dir, "generate": False, "progress": "none"}
    return build(spec.recipe, overrides=dict(spec.overrides), cache_dir=cache_dir, run_options=options)


def _shard_task(recipe: str, overrides: dict[str, Any], journal_dir: str) -> dict[str, Any]:
    """One shard, in a Ray worker: the shard from the environment, the build, its summary."""
    found = shard_from_environment(os.environ)
    if found is None or found.scheduler != "ray":
        raise FatalError(f"{RAY_VARIABLE} is not set in this Ray task's environment")
    options = RunOptions(journal_dir=Path(journal_dir), shard=found.shard, progress="log", log_interval=30)
    summary = run(load_recipe(recipe, overrides), options).summary
    return {
        "shard": found.shard.name, "source": found.description, "host": os.uname().nodename,
        "pid": os.getpid(), "new_rows": summary.run_rows, "reused_rows": summary.run_reused,
        "generated_tokens": summary.run_generated_tokens, "failed": sum(summary.failed.values()),
        "wall_time": summary.wall_time,
    }  # fmt: skip
