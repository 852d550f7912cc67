"""The ``eagle3-raw`` command line: build, merge, push, reproduce, export, serve-reference."""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3_raw.errors import Eagle3RawError, Interrupted

if TYPE_CHECKING:
    import datasets

Handler = Callable[[argparse.Namespace], int]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``eagle3-raw``; returns the process exit code."""
    args = build_parser().parse_args(argv)
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")  # "PyTorch was not found": we need none
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("eagle3_raw").setLevel(logging.INFO)  # ours; libraries' HTTP logs stay quiet
    handler: Handler = args.handler
    try:
        return handler(args)
    except Interrupted as exc:
        print(f"\n{exc}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    except Eagle3RawError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(
        prog="eagle3-raw", description="Raw-token EAGLE-3 training sets from SGLang's native /generate."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _add_build(sub)
    _add_merge(sub)
    _add_hub(sub)
    _add_export(sub)
    _add_serve_reference(sub)
    return parser


def add_recipe_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recipe", help="recipe YAML file, or the name of a bundled recipe (e.g. demo)")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override a recipe field, e.g. --set sampling.temperature=0 (repeatable; VALUE is YAML)",
    )  # fmt: skip


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add(
        "--journal-dir",
        type=Path,
        help="journal root (default $EAGLE3_RAW_JOURNAL_DIR or ~/.cache/eagle3_raw/journals)",
    )
    add("--allow-server-change", action="store_true", help="resume against a server whose identity changed")
    add("--retry-failed", action="store_true", help="try rows that failed for good in an earlier run again")
    add("--quiet", action="store_true", help="no progress bar: one log line per interval")
    add(
        "--log-interval", type=float, default=30.0, help="seconds between log lines with --quiet (default 30)"
    )


def _add_build(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("build", help="generate a recipe's set into the datasets cache")
    add_recipe_arguments(parser)
    add_run_arguments(parser)
    _add_output_arguments(parser)
    parser.add_argument(
        "--shard", metavar="I/N",
        help="generate only shard I of N into the journal (N processes, N machines); then eagle3-raw merge",
    )  # fmt: skip
    parser.set_defaults(handler=_build)


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
    parser.add_argument("--force", action="store_true", help="merge even if some shard has not finished")
    parser.set_defaults(handler=_merge)


def run_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "journal_dir": args.journal_dir,
        "allow_server_change": args.allow_server_change,
        "retry_failed": args.retry_failed,
        "progress": "log" if args.quiet else "bar",
        "log_interval": args.log_interval,
    }


def _build(args: argparse.Namespace) -> int:
    from eagle3_raw.recipe import parse_set_args

    overrides = parse_set_args(args.overrides)
    if args.shard is not None:
        return _build_shard(args, overrides)
    return _materialize(args, overrides, run_kwargs(args))


def _build_shard(args: argparse.Namespace, overrides: dict[str, Any]) -> int:
    from eagle3_raw.plan import Shard
    from eagle3_raw.recipe import load_recipe
    from eagle3_raw.run import RunOptions, run

    shard = Shard.parse(args.shard)
    options = RunOptions(shard=shard, **run_kwargs(args))
    result = run(load_recipe(args.recipe, overrides), options)
    print(result.summary.render())
    print(f"shard {shard.index}/{shard.count} is complete; once all {shard.count} are:")
    print("  " + shlex.join(["eagle3-raw", "merge", str(args.recipe), *_merge_flags(args)]))
    return 0


def _merge_flags(args: argparse.Namespace) -> list[str]:
    """The options of this build that ``merge`` needs to find the same journal and cache."""
    flags = [flag for override in args.overrides for flag in ("--set", override)]
    if args.journal_dir is not None:
        flags += ["--journal-dir", str(args.journal_dir)]
    if args.cache_dir is not None:
        flags += ["--cache-dir", str(args.cache_dir)]
    return flags


def _merge(args: argparse.Namespace) -> int:
    from eagle3_raw.recipe import load_recipe, parse_set_args
    from eagle3_raw.run import journal_dir_for
    from eagle3_raw.shards import check_merge_ready

    overrides = parse_set_args(args.overrides)
    recipe = load_recipe(args.recipe, overrides)
    if not args.force:
        check_merge_ready(journal_dir_for(recipe, args.journal_dir))
    assemble_only = {"journal_dir": args.journal_dir, "generate": False, "progress": "none"}
    return _materialize(args, overrides, assemble_only)


def _materialize(args: argparse.Namespace, overrides: dict[str, Any], run_kwargs: dict[str, Any]) -> int:
    dataset, summary = build_dataset(args.recipe, overrides, run_kwargs, cache_dir=args.cache_dir)
    print(summary)
    if args.output_dir is not None:
        path = write_parquet(dataset, args.output_dir, dataset.config_name)
        print(f"parquet           {path}")
    return 0


def build_dataset(
    recipe: str, overrides: dict[str, Any], run_options: dict[str, Any], *, cache_dir: Path | None = None
) -> tuple[datasets.Dataset, str]:
    """Build (or reuse) the set in the ``datasets`` cache; returns it and a printable summary."""
    from eagle3_raw.builder import build

    built = build(recipe, overrides=overrides, cache_dir=cache_dir, run_options=run_options)
    if built.run_result is not None:
        return built.dataset, built.run_result.summary.render()
    cached = f"loaded from the datasets cache (no request sent): {len(built.dataset):,} rows"
    return built.dataset, f"{cached}\ncache             {built.cache_dir}"


def write_parquet(dataset: datasets.Dataset, output_dir: Path, name: str) -> Path:
    """Write the set as ``<output_dir>/<name>.parquet``."""
    output_dir.mkdir(parents=True, exist_ok=True)
    path = output_dir / f"{name}.parquet"
    dataset.to_parquet(str(path))
    return path


def _add_hub(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from eagle3_raw import hub_cli

    hub_cli.add_push(sub)
    hub_cli.add_reproduce(sub)


def _add_export(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from eagle3_raw.export import cli as export_cli

    export_cli.add_export(sub)


def _add_serve_reference(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from eagle3_raw.reference import cli as reference_cli

    parser = sub.add_parser(
        "serve-reference",
        help="run the SGLang-compatible reference server (CPU, tiny model)",
        description="Serve SGLang 0.5.23's native API with the built-in tiny reference model.",
    )
    reference_cli.add_arguments(parser)
    parser.set_defaults(handler=reference_cli.serve)


if __name__ == "__main__":
    sys.exit(main())
