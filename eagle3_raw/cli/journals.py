"""``eagle3-raw journals``: list a journal root's sets, the rows a set does not hold (and why),
remove sets, prune what nothing needs."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from eagle3_raw.errors import JournalError
from eagle3_raw.journal import Journal, journal_root, set_dir
from eagle3_raw.journal.roots import list_sets, prune, remove_sets
from eagle3_raw.journal.unmade import KINDS, render_json_lines, render_text, unmade_rows
from eagle3_raw.printable import printable

if TYPE_CHECKING:
    from eagle3_raw.journal.roots import SetInfo

    SubParsers = argparse._SubParsersAction[argparse.ArgumentParser]


_HELP = {
    "list": "every set: rows, failed, skipped, tokens, size, recipe, target, last used, cached/pushed",
    "remove": "remove sets by config id, then the generations no other set names (shows them; --yes)",
    "prune": "remove the sets not cached, pushed, being written or resumable (shows them; --yes)",
}
_DESCRIPTIONS = {
    "remove": "Without --yes, only shows what would be removed. A set being written is never removed; "
    "one that was pushed, is cached (in --cache-dir or any cache it was built into) or that a rerun "
    "would resume (a build that did not finish) only with --force.",
    "prune": "Without --yes, only shows what would be removed. Kept: sets being written, cached (in "
    "--cache-dir or any cache they were built into), pushed, or resumable (a build that did not "
    "finish: a rerun goes on from its rows) unless --resumable.",
}


def add_journals(sub: SubParsers) -> argparse.ArgumentParser:
    """Register ``journals list|rows|remove|prune``."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "journals",
        help="list the journal's sets and the rows they lack, remove sets, prune what no cached or published "
        "set needs",
    )
    actions = parser.add_subparsers(dest="action", required=True)
    for name, help_text in _HELP.items():
        action = actions.add_parser(name, help=help_text, description=_DESCRIPTIONS.get(name))
        action.add_argument(
            "--journal-dir", type=Path, help="journal root (default: $EAGLE3_RAW_JOURNAL_DIR or ~/.cache)"
        )
        action.add_argument(
            "--cache-dir", type=Path, help="datasets cache folder (default: HF_DATASETS_CACHE)"
        )
        action.set_defaults(handler=_run)
    removing, pruning = actions.choices["remove"], actions.choices["prune"]
    removing.add_argument("config_ids", nargs="+", metavar="CONFIG_ID")
    removing.add_argument("--force", action="store_true", help="also sets pushed, cached or resumable")
    pruning.add_argument("--resumable", action="store_true", help="also sets of builds that did not finish")
    for action in (removing, pruning):
        action.add_argument("--yes", action="store_true", help="remove them (else: only show what would go)")
        action.add_argument("--dry-run", action="store_true", help="only show what would go (the default)")
    _add_rows(actions)
    return parser


_ROW_KINDS = {
    "failed": "rows that failed (HTTP 400, retries spent)",
    "skipped": "rows skipped (malformed, too long, refused by the chat path)",
    "ended": "rollout turns not made because the rollout ended before them",
}


def _add_rows(actions: SubParsers) -> None:
    """``journals rows CONFIG_ID [--failed] [--skipped] [--ended] [--json]``
    (:mod:`eagle3_raw.journal.unmade`)."""
    rows = actions.add_parser(
        "rows", help="the rows a set does not hold: each failed, skipped or ended-early row id, with why",
        description="Every row of set CONFIG_ID (as `journals list` names it) that has no row in the "
        "journal but a failure: failed (a rerun with --retry-failed asks again), skipped (its prompt is "
        "unusable) or ended (a rollout turn after its rollout ended). Without a kind flag, all three; "
        "flags add up. Plain text by default (80 columns), JSON lines with --json.",
    )  # fmt: skip
    rows.add_argument("config_id", metavar="CONFIG_ID")
    rows.add_argument(
        "--journal-dir", type=Path, help="journal root (default: $EAGLE3_RAW_JOURNAL_DIR or ~/.cache)"
    )
    for kind, text in _ROW_KINDS.items():
        rows.add_argument(f"--{kind}", action="store_true", help=f"only {text} (with other flags: those too)")
    rows.add_argument(
        "--json", action="store_true", help="one JSON object a line: id, kind, reason, index, turn, sample"
    )
    rows.set_defaults(handler=_rows)


def _rows(args: argparse.Namespace) -> int:
    root = args.journal_dir or journal_root()
    plain = args.config_id not in ("", ".", "..") and "/" not in args.config_id
    if not plain or not (set_dir(root, args.config_id) / "manifest.json").is_file():
        raise JournalError(
            f"the journal {root} has no set {printable(args.config_id)!r} (eagle3-raw journals list "
            "names its sets; --journal-dir picks another journal)"
        )
    kinds = [kind for kind in KINDS if getattr(args, kind)] or list(KINDS)
    with Journal.read(root, args.config_id) as journal:
        rows = unmade_rows(journal, kinds=kinds)
    print(render_json_lines(rows) if args.json else render_text(rows), end="" if args.json else "\n")
    return 0


def _run(args: argparse.Namespace) -> int:
    root = args.journal_dir or journal_root()
    if args.action == "list":
        sets = list_sets(root, cache_dir=args.cache_dir)
        print("\n".join(map(_line, sets)) if sets else f"no sets in {root}")
        return 0
    dry_run = args.dry_run or not args.yes
    verb = "would remove" if dry_run else "removed"
    resumable = getattr(args, "resumable", False)  # prune's
    if args.action == "remove":
        ids, force = args.config_ids, args.force
        removed = remove_sets(root, ids, force=force, dry_run=dry_run, cache_dir=args.cache_dir)
        kept: list[SetInfo] = []
    else:
        report = prune(root, cache_dir=args.cache_dir, dry_run=dry_run, resumable=resumable)
        removed, kept = report.removed, report.kept
    for info in removed:
        print(f"{verb:<17} {info.config_id} ({info.rows:,} rows, {_size(info.bytes)})")
    for info in kept:
        print(f"{'kept':<17} {info.config_id} ({info.kept_because(resumable=resumable)})")
    if not dry_run and args.action == "prune":
        print(f"freed             {_size(report.freed_bytes)} of generations no set names")
    if dry_run:
        print(_dry_run_note(len(removed)))
    return 0


def _dry_run_note(count: int) -> str:
    if not count:
        return "nothing to remove"
    return f"nothing removed: {count} set{'s' if count != 1 else ''} would go; run again with --yes to remove"


def _line(info: SetInfo) -> str:
    """One set's lines; what a server reported, a recipe named or a manifest holds is escaped."""
    state = "whole" if info.whole else ("resumable" if info.resumable else "partial")
    ended = f", {info.ended:,} ended" if info.ended else ""
    unmade = info.failed + info.skipped + info.ended
    listed = f"\n  eagle3-raw journals rows {printable(info.config_id)} lists the {unmade:,} rows not made"
    used = f"{_why(info) or 'not cached, not pushed'}{listed if unmade else ''}"
    return (
        f"{printable(info.config_id)}\n  recipe {printable(info.name)}; {state}; {info.rows:,} rows "
        f"({info.failed:,} failed, {info.skipped:,} skipped{ended}), {info.prompt_tokens:,} prompt + "
        f"{info.generated_tokens:,} generated tokens, {_size(info.bytes)}\n"
        f"  target {printable(info.target, limit=500)}\n"
        f"  last used {printable(info.updated)}; {used}"
    )


def _why(info: SetInfo) -> str:
    reasons = ["being written"] if info.writing else []
    reasons += [f"cached in {printable(c, limit=200)}" for c in info.caches]
    reasons += [f"pushed to {printable(p, limit=200)}" for p in info.pushed]
    return ", ".join(reasons)


def _size(count: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if count < 1024 or unit == "GB":
            return f"{count:,.0f} {unit}" if unit == "B" else f"{count:,.1f} {unit}"
        count /= 1024  # type: ignore[assignment]
    return f"{count} B"
