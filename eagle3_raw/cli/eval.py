"""``eagle3-raw eval RECIPE --server URL [--against URL2]``: a set's prompts replayed through
speculating servers, and how well each server's drafter did (:mod:`eagle3_raw.evaluate`).

Tables on stdout (servers side by side), ``--json`` for scripts instead, ``--plot FILE.png`` as
well. The plot's folder and matplotlib are checked before anything is sent.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from eagle3_raw.cli.common import EXIT_OK, add_recipe_arguments
from eagle3_raw.errors import FatalError
from eagle3_raw.evaluate.evaluation import EvalOptions, evaluate
from eagle3_raw.evaluate.plot import require_matplotlib, write_plot
from eagle3_raw.evaluate.report import Report, tables
from eagle3_raw.outputs import check_writable
from eagle3_raw.recipe import parse_set_args

if TYPE_CHECKING:
    SubParsers = argparse._SubParsersAction[argparse.ArgumentParser]


def add_eval(sub: SubParsers) -> argparse.ArgumentParser:
    """Register ``eval RECIPE --server URL [--server URL2 | --against URL2] [...]``."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "eval",
        help="replay a set's prompts through speculating servers and report their drafters' acceptance",
        description="Replay a split of a recipe's set (as built; validation by default when it has one) "
        "through one or more speculating SGLang servers, one after the other, and report each drafter's "
        "acceptance length, accept rate, accepted drafts per verify step and tokens/s, overall and by "
        "turn, prompt length, output length, category and finish reason.",
    )  # fmt: skip
    add_recipe_arguments(parser)
    add = parser.add_argument
    add(
        "--server", dest="servers", action="append", default=[], metavar="URL", required=True,
        help="a speculating SGLang server (repeatable: each is reported beside the others)",
    )  # fmt: skip
    add(
        "--against",
        dest="against",
        action="append",
        default=[],
        metavar="URL",
        help="another server to compare",
    )
    add("--split", help="the split to replay (default: validation when the set has one, else train)")
    add("--greedy", action="store_true", help="send temperature 0 instead of the recipe's sampling")
    add("--limit", type=int, metavar="N", help="replay only the first N prompts")
    add(
        "--max-in-flight",
        type=int,
        default=16,
        metavar="N",
        help="requests in flight per server (default 16)",
    )
    add("--api-key-env", metavar="NAME", help="variable holding the servers' API key (default: the recipe's)")
    add("--request-timeout", type=float, metavar="SECONDS", help="per attempt (default: the recipe's)")
    add("--json", action="store_true", help="print the report as JSON instead of tables")
    add("--plot", type=Path, metavar="FILE.png", help="also draw the report into this PNG file")
    add("--cache-dir", type=Path, help="datasets cache folder (default: HF_DATASETS_CACHE)")
    add("--journal-dir", type=Path, help="journal root the recipe was built with")
    parser.set_defaults(handler=run_eval)
    return parser


def run_eval(args: argparse.Namespace) -> int:
    """Handler of ``eval``."""
    if args.limit is not None and args.limit < 1:
        raise FatalError(f"--limit {args.limit}: expected at least 1")
    if args.max_in_flight < 1:
        raise FatalError(f"--max-in-flight {args.max_in_flight}: expected at least 1")
    for url in [*args.servers, *args.against]:
        if not url.startswith(("http://", "https://")):
            raise FatalError(
                f"server {url!r}: expected an http:// or https:// URL, e.g. http://127.0.0.1:30000"
            )
    if args.plot is not None:
        _check_plot(args.plot)
    options = EvalOptions(
        split=args.split, greedy=args.greedy, limit=args.limit, max_in_flight=args.max_in_flight,
        api_key_env=args.api_key_env, request_timeout=args.request_timeout,
    )  # fmt: skip
    report = evaluate(
        args.recipe, [*args.servers, *args.against], options, overrides=parse_set_args(args.overrides),
        cache_dir=args.cache_dir, journal_dir=args.journal_dir,
    )  # fmt: skip
    if args.json:
        print(orjson.dumps(report.to_dict(), option=orjson.OPT_INDENT_2).decode())
    else:
        show(report)
    if args.plot is not None:
        path = write_plot(report, args.plot)
        if not args.json:
            print(f"plot              {path}")
    return EXIT_OK


def _check_plot(path: Path) -> None:
    """Before anything is sent: matplotlib is there, and the plot's folder can be written."""
    require_matplotlib()
    check_writable(path.parent if str(path.parent) else Path("."), "plot folder")


def show(report: Report) -> None:
    """The report's tables on stdout: servers side by side where they fit the terminal, else one
    table per server (a pipe or a file is as wide as the side-by-side tables)."""
    from rich.console import Console
    from rich.measure import Measurement

    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=200)
    found = tables(report)
    unbounded = console.options.update_width(10_000)  # each table's natural width
    if any(Measurement.get(console, unbounded, table).maximum > console.width for table in found):
        found = tables(report, stacked=True)
    for table in found:
        console.print(table)
