"""``eagle3-raw slurm``, ``eagle3-raw ray`` and ``eagle3-raw status``: argument parsing for
:mod:`eagle3_raw.cluster`. Nothing here imports SLURM or Ray tooling until a command needs it."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from eagle3_raw.cli.common import EXIT_FAILED_ROWS, EXIT_OK, add_recipe_arguments, summary_text
from eagle3_raw.cluster.ray_runner import RayShards, run_on_ray
from eagle3_raw.cluster.slurm import SlurmJob, interpreter_note, submit, write_scripts
from eagle3_raw.cluster.status import render, watchers
from eagle3_raw.journal import journal_root
from eagle3_raw.printable import printable
from eagle3_raw.recipe import find_recipe_file, load_recipe, parse_set_args

if TYPE_CHECKING:
    SubParsers = argparse._SubParsersAction[argparse.ArgumentParser]


def add_cluster(sub: SubParsers) -> None:
    _add_slurm(sub)
    _add_ray(sub)
    _add_status(sub)


def _add_slurm(sub: SubParsers) -> None:
    parser = sub.add_parser(
        "slurm", help="write (and --submit) a SLURM array job of the recipe's shards, and a merge job",
        description="Write JOB_DIR/shards.sbatch (an array: one shard per task, each starting its node's "
        "server; preempted tasks flush, requeue and resume) and JOB_DIR/merge.sbatch (merge, then push "
        "if asked), submitted with --dependency=afterok on the array.",
    )  # fmt: skip
    add_recipe_arguments(parser)
    add = parser.add_argument
    add("--shards", type=int, required=True, metavar="N", help="array tasks (shards)")
    add("--journal-dir", type=Path, required=True, help="journal root on storage every node shares")
    add("--job-dir", type=Path, help="where the scripts and logs go (default: ./eagle3-raw-slurm-<name>)")
    add("--partition", help="the shard tasks' partition")
    add("--merge-partition", help="the merge job's partition (no GPU needed; default: the cluster's default)")
    add("--time", help="time limit of a shard task, e.g. 24:00:00")
    add("--merge-time", default="01:00:00", help="time limit of the merge job (default 01:00:00)")
    add("--gpus", type=int, help="GPUs per shard task (--gpus)")
    add("--cpus-per-task", type=int)
    add("--mem", help="memory per shard task, e.g. 200G")
    add("--parallel", type=int, metavar="K", help="at most K tasks at once (--array=0-N%%K)")
    add("--signal-seconds", type=int, default=300,
        help="SIGUSR1 this many seconds before the time limit: flush and requeue (default 300)")  # fmt: skip
    add("--sbatch-arg", dest="sbatch_args", action="append", default=[], metavar="OPTION",
        help="another #SBATCH option for both jobs, e.g. --sbatch-arg=--account=abc")  # fmt: skip
    add("--setup", action="append", default=[], metavar="LINE",
        help="a shell line run first in both jobs, e.g. 'source /shared/venv/bin/activate'")  # fmt: skip
    add("--command", help="how nodes run eagle3-raw, resolved on the node after --setup "
        "(default: 'python -m eagle3_raw.cli', the python the node's PATH gives)")  # fmt: skip
    add("--cache-dir", type=Path, help="the merge's datasets cache (default: HF_DATASETS_CACHE)")
    add("--output-dir", type=Path, help="the merge also writes the set as Parquet here")
    add("--push", metavar="ORG/NAME", help="after the merge, push the set to this Hub repo")
    add("--tag", help="with --push: tag the pushed revision")
    add("--private", action="store_true", help="with --push: create the repo private")
    add("--submit", action="store_true", help="submit both jobs with sbatch (else print how)")
    parser.set_defaults(handler=_slurm)


def _slurm(args: argparse.Namespace) -> int:
    import shlex

    recipe = load_recipe(args.recipe, args.overrides)  # checked here, not on the nodes
    push = ["--repo", args.push, *(["--tag", args.tag] if args.tag else []),
            *(["--private"] if args.private else [])] if args.push else []  # fmt: skip
    job = SlurmJob(
        recipe=find_recipe_file(args.recipe), shards=args.shards, journal_dir=args.journal_dir.resolve(),
        job_dir=(args.job_dir or Path(f"eagle3-raw-slurm-{recipe.name}")).resolve(), name=recipe.name,
        overrides=tuple(args.overrides), partition=args.partition, merge_partition=args.merge_partition,
        time=args.time, merge_time=args.merge_time,
        gpus=args.gpus, cpus_per_task=args.cpus_per_task, mem=args.mem, parallel=args.parallel,
        signal_seconds=args.signal_seconds, sbatch_args=tuple(args.sbatch_args), setup=tuple(args.setup),
        cache_dir=args.cache_dir.resolve() if args.cache_dir else None,
        output_dir=args.output_dir.resolve() if args.output_dir else None, push=tuple(push),
        **({"command": tuple(shlex.split(args.command))} if args.command else {}),
    )  # fmt: skip
    scripts = write_scripts(job)
    print(f"shards job        {scripts.shards}\nmerge job         {scripts.merge}")
    print(printable(f"nodes run         {shlex.join(job.command)} (as each node resolves it after --setup)"))
    if (note := interpreter_note(job)) is not None:
        print(printable(note), file=sys.stderr)
    if not args.submit:
        print("submit with:\n  " + "\n  ".join(scripts.submit_commands()))
        return 0
    scripts = submit(scripts)
    print(f"submitted         array job {scripts.array_id}, merge job {scripts.merge_id} (afterok)")
    status = ["eagle3-raw", "status", str(job.recipe), "--journal-dir", str(job.journal_dir), "--watch"]
    print("watch with        " + shlex.join(status + [w for o in job.overrides for w in ("--set", o)]))
    return 0


def _add_ray(sub: SubParsers) -> None:
    parser = sub.add_parser(
        "ray", help="run the recipe's shards as tasks on a Ray cluster, then merge",
        description="One Ray task per shard (each starting its own server with server.launch: sglang "
        "or vllm, or sending to server.endpoints), into a journal every node shares; then the merge. "
        "Needs pip install 'eagle3_raw[ray]'.",
    )  # fmt: skip
    add_recipe_arguments(parser)
    add = parser.add_argument
    add("--shards", type=int, required=True, metavar="N")
    add("--journal-dir", type=Path, required=True, help="journal root on storage every node shares")
    add("--address", help="the Ray cluster (default: RAY_ADDRESS, else the local one: ray start --head)")
    add("--gpus-per-shard", type=float, default=0.0)
    add("--cpus-per-shard", type=float, default=1.0)
    add("--no-merge", action="store_true", help="only run the shards")
    add("--cache-dir", type=Path, help="the merge's datasets cache (default: HF_DATASETS_CACHE)")
    parser.set_defaults(handler=_ray)


def _ray(args: argparse.Namespace) -> int:
    recipe = args.recipe if not Path(args.recipe).exists() else str(find_recipe_file(args.recipe))
    spec = RayShards(
        recipe=recipe, shards=args.shards, journal_dir=args.journal_dir.resolve(),
        overrides=parse_set_args(args.overrides), num_cpus=args.cpus_per_shard, num_gpus=args.gpus_per_shard,
    )  # fmt: skip
    result = run_on_ray(spec, address=args.address, merge=not args.no_merge, cache_dir=args.cache_dir)
    for task in result.tasks:
        done = f"{task['new_rows']:,} new rows, {task['reused_rows']:,} reused, {task['failed']:,} failed"
        print(printable(f"shard {task['shard']} on {task['host']}: {done}, {task['wall_time']:.0f} s"))
    built = result.built
    if built is None:
        return EXIT_OK
    print(printable(summary_text(built), newlines=True))
    failed = built.run_result.summary.failed if built.run_result else built.cached_failures
    return EXIT_FAILED_ROWS if sum(failed.values()) else EXIT_OK


def _add_status(sub: SubParsers) -> None:
    parser = sub.add_parser(
        "status", help="per shard and in total: rows done, failed, tokens, rate and ETA, from the journal",
        description="Read the recipe's sets in the (shared) journal while the shards run; sends nothing.",
    )  # fmt: skip
    add_recipe_arguments(parser)
    add = parser.add_argument
    add("--journal-dir", type=Path, help="journal root (default $EAGLE3_RAW_JOURNAL_DIR or ~/.cache/...)")
    add("--watch", action="store_true", help="refresh every --interval seconds until every shard is done")
    add("--interval", type=float, default=10.0, help="seconds between scans with --watch (default 10)")
    add("--sample", type=float, default=5.0,
        help="without --watch: two scans this far apart give the rates (default 5; 0: none)")  # fmt: skip
    parser.set_defaults(handler=_status)


def _status(args: argparse.Namespace) -> int:
    recipe = load_recipe(args.recipe, args.overrides)
    sets = watchers(recipe, args.journal_dir or journal_root())
    try:
        if not args.watch and args.sample > 0:
            for watcher in sets:
                watcher.scan()  # the first of two scans: the rates are over the time between them
            time.sleep(args.sample)
        while True:
            tables = [(w, w.scan()) for w in sets]
            text = "\n\n".join(render(w, shards) for w, shards in tables)
            if len(sets) > 1:
                text += f"\n\n{len(sets)} sets of this recipe: shards resolved different targets (see above)"
            _show(text, redraw=args.watch)
            finished = all(s.state == "done" for _, shards in tables for s in shards)
            if not args.watch or finished:
                return 0
            time.sleep(args.interval)
    finally:
        for watcher in sets:
            watcher.close()


def _show(text: str, *, redraw: bool) -> None:
    if redraw and sys.stdout.isatty():
        print("\x1b[H\x1b[2J", end="")  # clear the terminal: the table replaces the last one
    print(printable(text, newlines=True), flush=True)
    if redraw and not sys.stdout.isatty():
        print(flush=True)
