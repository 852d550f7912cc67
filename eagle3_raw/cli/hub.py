"""``eagle3-raw push`` and ``eagle3-raw reproduce``: argument parsing for :mod:`eagle3_raw.hub`.

:func:`add_push` and :func:`add_reproduce` each register one subcommand whose ``handler`` returns the
exit code; errors are :class:`~eagle3_raw.errors.Eagle3RawError` (``HubError`` for the Hub), which
``eagle3_raw.cli.main.main`` prints. No option takes a token: credentials come from ``HF_TOKEN`` or the
``huggingface_hub`` login, so they never land in shell history or logs.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3_raw.cli.common import (
    EXIT_NOT_IDENTICAL,
    EXIT_OK,
    add_recipe_arguments,
    add_run_arguments,
    run_kwargs,
)
from eagle3_raw.hub import push, reproduce
from eagle3_raw.printable import printable
from eagle3_raw.recipe import parse_set_args

if TYPE_CHECKING:
    SubParsers = argparse._SubParsersAction[argparse.ArgumentParser]


def add_push(sub: SubParsers) -> argparse.ArgumentParser:
    """Register ``push RECIPE --repo org/name [--tag v1] [--private] [--revision BRANCH] [--set k=v]``."""

    parser: argparse.ArgumentParser = sub.add_parser(
        "push",
        help="build (or reuse) a recipe's set and publish it on the Hub with its recipe and card",
        description="Build or reuse the set, push it as config <recipe name>, upload recipes/<name>.yaml "
        "with its prompt files and manifest, update the dataset card, then tag. Credentials: HF_TOKEN "
        "or `hf auth login`.",
    )
    add_recipe_arguments(parser)
    add = parser.add_argument
    add(
        "--repo", required=True, metavar="ORG/NAME",
        help="dataset repo (created if missing); a bare NAME goes to the token's user",
    )  # fmt: skip
    add("--tag", help="tag the pushed revision (must not exist yet)")
    add(
        "--private",
        action="store_true",
        help="create the repo private (an existing repo keeps its visibility)",
    )
    add("--revision", metavar="BRANCH", help="push to this branch (created from main if missing)")
    add("--cache-dir", type=Path, help="datasets cache folder (default: HF_DATASETS_CACHE)")
    add(
        "--allow-partial", action="store_true",
        help="generate nothing: publish what the journal holds, marked partial if a shard has not finished",
    )  # fmt: skip
    add_run_arguments(parser)
    parser.set_defaults(handler=run_push)
    return parser


def add_reproduce(sub: SubParsers) -> argparse.ArgumentParser:
    """Register ``reproduce org/name[@rev] [--config NAME] [--set server.endpoints=...]``."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "reproduce",
        help="rebuild a published set from its recipe and compare it with the published rows",
        description="Fetch recipes/<config>.yaml at the revision, regenerate it in a fresh cache and "
        "journal against the given server, and compare with the published rows by id.",
    )
    add = parser.add_argument
    add("repo", metavar="ORG/NAME[@REVISION]", help="dataset repo, optionally at a tag, branch or commit")
    add("--config", help="which recipe (config) to rebuild; required when the repo has several")
    add(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override a field of the published recipe, e.g. --set server.endpoints=http://host:30000",
    )  # fmt: skip
    add(
        "--work-dir",
        type=Path,
        help="keep the rebuild (cache, journal, recipe) here instead of a temp folder",
    )
    add("--quiet", action="store_true", help="no progress bar")
    add("--strict", action="store_true", help="exit with code 3 unless every row is identical")
    add(
        "--reference-server", action="store_true",
        help="send the requests to the built-in reference server, started for the run (the published "
        "recipe's server settings are never used: give this or --set server.endpoints=URL)",
    )  # fmt: skip
    add(
        "--trust-remote-code", action="store_true",
        help="let the published recipe's trust_remote_code: true run its tokenizer's Python code "
        "(needs a commit: model.revision, or ORG/NAME@COMMIT); the plan printed first names the code",
    )  # fmt: skip
    parser.set_defaults(handler=run_reproduce)
    return parser


def run_push(args: argparse.Namespace) -> int:
    """Handler of ``push``."""
    result = push(
        args.recipe, args.repo, tag=args.tag, private=args.private, revision=args.revision,
        overrides=parse_set_args(args.overrides), cache_dir=args.cache_dir, run_options=run_kwargs(args),
        partial=args.allow_partial,
    )  # fmt: skip
    print(printable(result.render(), newlines=True))
    return 0


def run_reproduce(args: argparse.Namespace) -> int:
    """Handler of ``reproduce``: prints the comparison; with ``--strict``, 3 unless it fully agrees."""
    options: dict[str, Any] = {"progress": "log" if args.quiet else "bar"}
    comparison = reproduce(
        args.repo, config=args.config, overrides=parse_set_args(args.overrides), work_dir=args.work_dir,
        run_options=options, reference_server=args.reference_server, trust_remote_code=args.trust_remote_code,
    )  # fmt: skip
    print(printable(comparison.render(), newlines=True))

    return EXIT_NOT_IDENTICAL if args.strict and not comparison.full_agreement else EXIT_OK
