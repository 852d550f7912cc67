"""``eagle3-raw validate RECIPE``: the command line of :func:`eagle3_raw.run.preflight.validate`, one
line per check."""

from __future__ import annotations

import argparse
from pathlib import Path

from eagle3_raw.cli.common import EXIT_ERROR, EXIT_OK, add_recipe_arguments
from eagle3_raw.run.preflight import validate


def add_validate(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``validate`` subcommand."""
    parser = sub.add_parser(
        "validate",
        help="check a recipe without generating anything (exit 0: every check passed, 1: one failed)",
        description="Check a recipe, its prompt source, tokenizer, template, journal and cache, and "
        "(unless --local) the server: its identity, its chat path on one prompt and its validation "
        "of the sampling keys on one request with max_new_tokens 1. One line per check.",
    )
    add_recipe_arguments(parser)
    parser.add_argument("--local", action="store_true", help="contact no server: the local checks only")
    parser.add_argument("--journal-dir", type=Path, help="journal root the build would use")
    parser.add_argument("--cache-dir", type=Path, help="datasets cache the build would use")
    parser.set_defaults(handler=_validate_command)


def _validate_command(args: argparse.Namespace) -> int:

    failed = False
    for check in validate(
        args.recipe, args.overrides, local=args.local, journal_dir=args.journal_dir, cache_dir=args.cache_dir
    ):
        print(check.line(), flush=True)
        failed |= check.status == "FAIL"
    return EXIT_ERROR if failed else EXIT_OK
