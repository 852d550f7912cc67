"""``eagle3-raw journals``: list a journal root's sets, remove sets, prune what nothing needs."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from eagle3_raw.printable import printable

if TYPE_CHECKING:
    from eagle3_raw.journal.roots import SetInfo

    SubParsers = argparse._SubParsersAction[argparse.ArgumentParser]


def add_journals(sub: SubParsers) -> argparse.ArgumentParser:
    """Register ``journals list|remove|prune``."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "journals", help="list the journal's sets, remove sets, prune what no cached or published set needs"
    )
    actions = parser.add_subparsers(dest="action", required=True)
    for name, help_text in (
        ("list", "every set: rows, failed, tokens, size, recipe, target, last used, cached/pushed"),
        ("remove", "remove sets by config id, then the generations no other set names"),
        ("prune", "remove every set that is not in the datasets cache, not pushed and not being written"),
    ):
        action = actions.add_parser(name, help=help_text)
        action.add_argument(
            "--journal-dir", type=Path, help="journal root (default: $EAGLE3_RAW_JOURNAL_DIR or ~/.cache)"
        )
        action.add_argument(
            "--cache-dir", type=Path, help="datasets cache folder (default: HF_DATASETS_CACHE)"
        )
        action.set_defaults(handler=_run)
    removing = actions.choices["remove"]
    removing.add_argument("config_ids", nargs="+", metavar="CONFIG_ID")
    removing.add_argument("--force", action="store_true", help="also remove sets that were pushed")
    actions.choices["prune"].add_argument("--dry-run", action="store_true", help="say what would go")
    return parser


def _run(args: argparse.Namespace) -> int:
    from eagle3_raw.journal import journal_root
    from eagle3_raw.journal.roots import list_sets, prune, remove_sets

    root = args.journal_dir or journal_root()
    if args.action == "list":
        sets = list_sets(root, cache_dir=args.cache_dir)
        print("\n".join(map(_line, sets)) if sets else f"no sets in {root}")
    elif args.action == "remove":
        for info in remove_sets(root, args.config_ids, force=args.force):
            print(f"removed           {info.config_id} ({info.rows:,} rows)")
    else:
        report = prune(root, cache_dir=args.cache_dir, dry_run=args.dry_run)
        verb = "would remove" if args.dry_run else "removed"
        for info in report.removed:
            print(f"{verb:<17} {info.config_id} ({info.rows:,} rows, {_size(info.bytes)})")
        for info in report.kept:
            print(f"{'kept':<17} {info.config_id} ({_why(info)})")
        if not args.dry_run:
            print(f"freed             {_size(report.freed_bytes)} of generations no set names")
    return 0


def _line(info: SetInfo) -> str:
    """One set's lines; what a server reported, a recipe named or a manifest holds is escaped."""
    state = "whole" if info.whole else "partial"
    return (
        f"{printable(info.config_id)}\n  recipe {printable(info.name)}; {state}; {info.rows:,} rows "
        f"({info.failed:,} failed), {info.prompt_tokens:,} prompt + {info.generated_tokens:,} generated "
        f"tokens, {_size(info.bytes)}\n  target {printable(info.target, limit=500)}\n"
        f"  last used {printable(info.updated)}; {_why(info) or 'not cached, not pushed'}"
    )


def _why(info: SetInfo) -> str:
    reasons = [r for r, on in (("being written", info.writing), ("cached", info.cached)) if on]
    reasons += [f"pushed to {printable(p, limit=200)}" for p in info.pushed]
    return ", ".join(reasons)


def _size(count: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if count < 1024 or unit == "GB":
            return f"{count:,.0f} {unit}" if unit == "B" else f"{count:,.1f} {unit}"
        count /= 1024  # type: ignore[assignment]
    return f"{count} B"
