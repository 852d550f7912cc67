"""What the commands share: exit codes, the recipe and run arguments, the summary line.

Exit codes (README, "Exit codes"): 0 done; 1 an error, printed as one line; 2 a usage error
(argparse's); 3 ``reproduce --strict`` when not every row is identical; 4 a build that finished
but left rows that failed for good (the summary lists them; ``--retry-failed`` tries them again);
130 interrupted.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3_raw.builder import failures_notice
from eagle3_raw.run.earlystop import DEFAULT_EARLY_STOP

if TYPE_CHECKING:
    from eagle3_raw.builder import Built


EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
"""argparse's code for a bad command line."""
EXIT_NOT_IDENTICAL = 3
EXIT_FAILED_ROWS = 4
EXIT_INTERRUPTED = 130


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
    add("--retry-failed", action="store_true", help="try rows that failed for good in an earlier run again")
    add("--quiet", action="store_true", help="no progress bar: one log line per interval")
    add(
        "--log-interval", type=float, default=30.0, help="seconds between log lines with --quiet (default 30)"
    )
    add(
        "--disk-wait", type=float, default=600.0, metavar="SECONDS",
        help="how long a full journal disk is waited for (no new request meanwhile) before the run stops, "
        "keeping the rows it holds in the spill folder it names (default 600)",
    )  # fmt: skip
    add(
        "--early-stop", type=int, default=DEFAULT_EARLY_STOP, metavar="N",
        help="stop when the first N rows all fail (or are all skipped) for one reason and none was "
        "generated, saying it once (default %(default)s; 0: never)",
    )  # fmt: skip


def run_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "journal_dir": args.journal_dir,
        "retry_failed": args.retry_failed,
        "progress": "log" if args.quiet else "bar",
        "log_interval": args.log_interval,
        "disk_wait": args.disk_wait,
        "early_stop": args.early_stop,
    }


def summary_text(built: Built) -> str:
    """The run's summary, or what a set reused from the cache holds."""
    if built.run_result is not None:
        result = built.run_result
        partial = f"\nPARTIAL set ({result.partial}): config {built.config_id}" if result.partial else ""
        return result.summary.render() + partial

    cached = f"loaded from the datasets cache (no request sent): {len(built.dataset):,} rows"
    failed = f"\nfailed            {failures_notice(built.cached_failures)}" if built.cached_failures else ""
    return f"{cached}\ncache             {built.cache_dir}{failed}"
