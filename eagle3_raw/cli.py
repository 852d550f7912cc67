"""The ``eagle3-raw`` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _add_serve_reference(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from eagle3_raw.reference import cli as reference_cli

    parser = sub.add_parser(
        "serve-reference",
        help="run the SGLang-compatible reference server (CPU, tiny model)",
        description="Serve SGLang 0.5.23's native API with the built-in tiny reference model.",
    )
    reference_cli.add_arguments(parser)
    parser.set_defaults(handler=reference_cli.serve)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(prog="eagle3-raw", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_serve_reference(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``eagle3-raw``; returns the process exit code."""
    args = build_parser().parse_args(argv)
    code: int = args.handler(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
