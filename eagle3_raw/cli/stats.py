"""``eagle3-raw stats``: how long the prompts and generations of a set are, and how they ended.

For the prompt, generated and total lengths: min, median, p90, p99, max and mean, then a
histogram; and the count of each ``finish_reason``. In a terminal the histograms are drawn with
block characters (one column per bin, as many bins as fit); otherwise (a pipe, a file,
``--plain``) each bin is one line of plain numbers: ``low-high count``.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from eagle3_raw.card import histogram, length_stats
from eagle3_raw.cli.inspect import add_target_arguments
from eagle3_raw.hub.sets import scan_set
from eagle3_raw.opening import open_set
from eagle3_raw.printable import printable
from eagle3_raw.recipe import parse_set_args

if TYPE_CHECKING:
    import numpy as np

    SubParsers = argparse._SubParsersAction[argparse.ArgumentParser]

BLOCKS = " ▁▂▃▄▅▆▇█"
"""Heights of a drawn bin, from empty to the tallest bin."""

PLAIN_BINS = 10


def add_stats(sub: SubParsers) -> argparse.ArgumentParser:
    """Register ``stats TARGET [--config NAME] [--set k=v] [--plain]``."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "stats",
        help="prompt and generated length distributions and finish reasons of a set",
        description="Length distributions (drawn in a terminal) and finish reasons of a set.",
    )
    add_target_arguments(parser)
    parser.add_argument("--plain", action="store_true", help="plain numbers, even in a terminal")
    parser.set_defaults(handler=run_stats)
    return parser


def run_stats(args: argparse.Namespace) -> int:
    """Handler of ``stats``."""
    from rich.console import Console

    opened = open_set(
        args.target, config=args.config, overrides=parse_set_args(args.overrides), cache_dir=args.cache_dir,
        journal_dir=args.journal_dir, split=args.split,
    )  # fmt: skip
    scan = scan_set(opened.dataset)
    console = Console(highlight=False)
    width = console.width if console.is_terminal and not args.plain else None
    lengths = {
        "prompt": scan.prompt_lengths,
        "generated": scan.generated_lengths,
        "total": scan.total_lengths,
    }
    console.print(render(opened.label, scan.rows, lengths, scan.finish_reasons, width=width), markup=False)
    return 0


def render(
    label: str, rows: int, lengths: Mapping[str, np.ndarray], reasons: Mapping[str, int], *, width: int | None
) -> str:
    """The whole report; ``width`` (a terminal's columns) draws the histograms, None gives numbers."""
    lines = [f"{printable(label)}: {rows:,} rows", ""]
    lines += _stats_table(lengths)
    for name, values in lengths.items():
        lines += ["", f"{name} tokens per row"]
        lines += drawn(values, width) if width is not None else binned(values)
    lines += ["", "finish reasons", *finish_reasons(reasons, rows, width)]
    return "\n".join(lines)


def _stats_table(lengths: Mapping[str, Any]) -> list[str]:
    header = f"{'tokens per row':<16}{'min':>9}{'median':>9}{'p90':>9}{'p99':>9}{'max':>9}{'mean':>10}"
    lines = [header]
    for name, values in lengths.items():
        s = length_stats(values)
        cells = "".join(f"{s[k]:>9,}" for k in ("min", "p50", "p90", "p99", "max"))
        lines.append(f"{name:<16}{cells}{s['mean']:>10,.1f}")
    return lines


def drawn(values: Sequence[int] | Any, width: int) -> list[str]:
    """A histogram of ``values`` in one line of block characters (as many bins as ``width`` allows,
    at most 60), with the range under it."""
    counts, low, _ = histogram(values, bins=max(8, min(60, width - 4)))
    if not counts:
        return ["  (no rows)"]
    peak = max(counts)
    bar = "".join(BLOCKS[-(-8 * c // peak)] if c else BLOCKS[0] for c in counts)
    if len(counts) == 1:
        return [f"  {bar}", f"  every row: {low:,} tokens"]
    axis = f"{low:,}"
    right = f"{int(max(values)):,} tokens (tallest bin: {peak:,} rows)"
    return [f"  {bar}", f"  {axis}{right:>{max(len(bar) - len(axis), len(right) + 1)}}"]


def binned(values: Sequence[int] | Any, bins: int = PLAIN_BINS) -> list[str]:
    """The histogram as plain numbers: one ``low-high  count`` line per bin."""
    counts, low, high = histogram(values, bins=bins)
    if not counts:
        return ["  (no rows)"]
    step = (high - low) // len(counts)
    return [f"  {low + i * step:>8,}-{low + (i + 1) * step - 1:<8,} {c:>10,}" for i, c in enumerate(counts)]


def finish_reasons(reasons: Mapping[str, int], rows: int, width: int | None) -> list[str]:
    """One line per reason, most common first: count, share, and a bar when drawing."""
    lines = []
    for reason, count in sorted(reasons.items(), key=lambda item: (-item[1], item[0])):
        share = count / max(rows, 1)
        bar = "█" * max(1, round(share * 30)) if width is not None else ""
        shown = printable(reason, limit=60)  # a published set's: a stranger's text
        lines.append(f"  {shown:<10}{count:>10,} {100 * share:>6.1f}%  {bar}".rstrip())
    return lines or ["  (no rows)"]
