"""The ``eagle3-raw`` command line: build, validate, merge, push, reproduce, export, inspect, stats,
eval, journals, slurm, ray, status, serve-reference.

Exit codes (README, "Exit codes"): 0 done; 1 an error, printed as one line; 2 a usage error
(argparse's); 3 ``reproduce --strict`` when not every row is identical; 4 a build that finished
but left rows that failed for good (the summary lists them; ``--retry-failed`` tries them again);
130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3_raw.builder import build
from eagle3_raw.cli import cluster as cluster_cli
from eagle3_raw.cli import eval as eval_cli
from eagle3_raw.cli import export as export_cli
from eagle3_raw.cli import hub as hub_cli
from eagle3_raw.cli import inspect as inspect_cli
from eagle3_raw.cli import journals as journals_cli
from eagle3_raw.cli import stats
from eagle3_raw.cli.common import (
    EXIT_ERROR,
    EXIT_FAILED_ROWS,
    EXIT_INTERRUPTED,
    EXIT_OK,
    add_recipe_arguments,
    add_run_arguments,
    run_kwargs,
    summary_text,
)
from eagle3_raw.cli.select import add_select
from eagle3_raw.cli.validate import add_validate
from eagle3_raw.cluster.environment import shard_option
from eagle3_raw.errors import Eagle3RawError, Interrupted, LocalFileError
from eagle3_raw.outputs import cache_errors, check_writable, default_cache_dir, describe, write_parquet
from eagle3_raw.printable import printable
from eagle3_raw.recipe import load_recipe, parse_set_args
from eagle3_raw.reference import cli as reference_cli
from eagle3_raw.run.build import RunOptions, run
from eagle3_raw.run.progress import configure_logging, quiet_libraries
from eagle3_raw.version import __version__

if TYPE_CHECKING:
    from eagle3_raw.builder import Built
    from eagle3_raw.run.plan import Shard
    from eagle3_raw.run.progress import Summary

Handler = Callable[[argparse.Namespace], int]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``eagle3-raw``; returns the process exit code."""
    args = build_parser().parse_args(argv)
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")  # "PyTorch was not found": we need none
    configure_logging()
    handler: Handler = args.handler
    try:
        if args.command != "serve-reference":
            quiet_libraries()
        return handler(args)
    except Interrupted as exc:
        print(f"\n{printable(exc, newlines=True)}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Eagle3RawError as exc:
        return report(exc)
    except OSError as exc:  # a file or folder no check above caught: still one line, not a traceback
        where = f" ({exc.filename})" if exc.filename else ""
        return report(LocalFileError(describe(exc) + where))


def report(exc: Eagle3RawError) -> int:
    """The one place the command line reports an error: one line, escaped (messages may quote a
    server, a Hub repo or a recipe), and the exit code. Only the exception tree reaches it."""
    print(f"error: {printable(exc, newlines=True)}", file=sys.stderr)
    return EXIT_ERROR


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(
        prog="eagle3-raw", description="Raw-token EAGLE-3 training sets from SGLang's native /generate."
    )
    parser.add_argument("--version", action="version", version=f"eagle3-raw {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_build(sub)
    _add_validate(sub)
    _add_merge(sub)
    _add_hub(sub)
    _add_looking(sub)
    _add_export(sub)
    add_select(sub)
    _add_cluster(sub)
    _add_serve_reference(sub)
    return parser


def _add_build(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("build", help="generate a recipe's set into the datasets cache")
    add_recipe_arguments(parser)
    add_run_arguments(parser)
    _add_output_arguments(parser)
    parser.add_argument(
        "--shard", metavar="I/N|auto",
        help="generate only shard I of N into the journal (N processes, N machines); then eagle3-raw merge. "
        "auto: from the scheduler (SLURM array or srun tasks, torchrun's RANK/WORLD_SIZE, eagle3_raw's "
        "Ray runner), which is also the default when its variables are set",
    )  # fmt: skip
    parser.set_defaults(handler=_build)


def _add_validate(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    add_validate(sub)


def _add_output_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output-dir", type=Path, help="also write the set as Parquet into this folder")
    parser.add_argument("--cache-dir", type=Path, help="datasets cache folder (default: HF_DATASETS_CACHE)")


def _add_merge(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "merge", help="assemble the set from a journal filled by shard builds (sends no request)"
    )
    add_recipe_arguments(parser)
    _add_output_arguments(parser)
    parser.add_argument("--journal-dir", type=Path, help="journal root the shards wrote to")
    parser.add_argument(
        "--force", action="store_true",
        help="merge even if some shard has not finished: the set is marked partial (its own config id)",
    )  # fmt: skip
    parser.set_defaults(handler=_merge)


def _build(args: argparse.Namespace) -> int:
    overrides = parse_set_args(args.overrides)
    shard, source = shard_option(args.shard, os.environ)
    if source is not None:
        print(f"eagle3-raw: {printable(source)}", file=sys.stderr)
    if shard is not None and (shard.count > 1 or args.shard is not None):
        return _build_shard(args, overrides, shard)
    return _materialize(args, overrides, run_kwargs(args))


def _build_shard(args: argparse.Namespace, overrides: dict[str, Any], shard: Shard) -> int:
    options = RunOptions(shard=shard, **run_kwargs(args))
    result = run(load_recipe(args.recipe, overrides), options)
    print(printable(result.summary.render(), newlines=True))
    print(f"shard {shard.index}/{shard.count} is complete; once all {shard.count} are:")
    print("  " + shlex.join(["eagle3-raw", "merge", str(args.recipe), *_merge_flags(args)]))
    return exit_code(result.summary)


def exit_code(summary: Summary) -> int:
    """4 when rows failed for good (the set is complete otherwise), else 0."""
    return EXIT_FAILED_ROWS if sum(summary.failed.values()) else EXIT_OK


def _merge_flags(args: argparse.Namespace) -> list[str]:
    """The options of this build that ``merge`` needs to find the same journal and cache."""
    flags = [flag for override in args.overrides for flag in ("--set", override)]
    if args.journal_dir is not None:
        flags += ["--journal-dir", str(args.journal_dir)]
    if args.cache_dir is not None:
        flags += ["--cache-dir", str(args.cache_dir)]
    return flags


def _merge(args: argparse.Namespace) -> int:
    overrides = parse_set_args(args.overrides)
    assemble_only = {
        "journal_dir": args.journal_dir, "generate": False, "partial": args.force, "progress": "none"
    }  # fmt: skip
    return _materialize(args, overrides, assemble_only)


def _materialize(args: argparse.Namespace, overrides: dict[str, Any], run_kwargs: dict[str, Any]) -> int:
    if args.output_dir is not None:
        check_writable(args.output_dir, "output folder")  # before the build, not after it
    built = build_dataset(args.recipe, overrides, run_kwargs, cache_dir=args.cache_dir)
    print(printable(summary_text(built), newlines=True))
    if built.validation is not None:
        print(f"splits            train {len(built.dataset):,} rows, validation {len(built.validation):,} "
              'rows (held out: load_dataset(..., split="validation"))')  # fmt: skip
    if args.output_dir is not None:
        for split, rows in built.splits.items():
            name = built.dataset.config_name + ("" if split == "train" else f"-{split}")
            print(f"parquet           {write_parquet(rows, args.output_dir, name)}")
    if built.run_result is None:
        return EXIT_FAILED_ROWS if built.cached_failures else EXIT_OK
    return exit_code(built.run_result.summary)


def build_dataset(
    recipe: str, overrides: dict[str, Any], run_options: dict[str, Any], *, cache_dir: Path | None = None
) -> Built:
    """Build (or reuse) the set in the ``datasets`` cache, checked writable first (a cache that
    cannot be written, then or later, is one OutputError naming it; the journal keeps the rows)."""
    cache = cache_dir or default_cache_dir()
    check_writable(cache, "datasets cache")
    with cache_errors(cache):
        return build(recipe, overrides=overrides, cache_dir=cache_dir, run_options=run_options)


def _add_hub(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:

    hub_cli.add_push(sub)
    hub_cli.add_reproduce(sub)

    journals_cli.add_journals(sub)


def _add_looking(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:

    inspect_cli.add_inspect(sub)
    stats.add_stats(sub)
    eval_cli.add_eval(sub)


def _add_export(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:

    export_cli.add_export(sub)


def _add_cluster(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:

    cluster_cli.add_cluster(sub)


def _add_serve_reference(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:

    parser = sub.add_parser(
        "serve-reference",
        help="run the SGLang-compatible reference server (CPU, tiny model)",
        description="Serve SGLang 0.5.23's native API with the built-in tiny reference model.",
    )
    reference_cli.add_arguments(parser)
    parser.set_defaults(handler=reference_cli.serve)


if __name__ == "__main__":
    sys.exit(main())
