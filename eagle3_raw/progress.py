"""Live progress of a run, and its summary.

The bar counts completed rows (journaled), never submitted ones. ``mode="log"`` writes one line per
interval instead, for batch jobs; ``mode="none"`` shows nothing.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from rich.progress import Progress as RichProgress

    from eagle3_raw.endpoints import Endpoint

log = logging.getLogger("eagle3_raw")

ProgressMode = Literal["bar", "log", "none"]


@dataclass
class RunStats:
    """Counters of the current process's run (the journal holds the totals over every run)."""

    started: float = field(default_factory=time.monotonic)
    replayed: int = 0
    rows: int = 0
    generated_tokens: int = 0
    retries: int = 0
    failed: int = 0
    skipped: int = 0
    planned: int | None = None

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / max(self.elapsed, 1e-9)


class ProgressDisplay:
    """A rich progress bar (or periodic log lines) fed from the run's counters."""

    def __init__(self, mode: ProgressMode, *, log_interval: float = 30.0) -> None:
        self.mode = mode
        self.log_interval = log_interval
        self._last_log = time.monotonic()
        self._bar: RichProgress | None = None
        self._task: Any = None

    def start(self, description: str) -> None:
        if self.mode != "bar":
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        columns = (TextColumn("{task.description}"), BarColumn(bar_width=24), MofNCompleteColumn())
        self._bar = Progress(
            *columns, TimeRemainingColumn(), TextColumn("{task.fields[detail]}"), refresh_per_second=4
        )
        self._task = self._bar.add_task(description, total=None, detail="")
        self._bar.start()

    def update(self, stats: RunStats, endpoints: Sequence[Endpoint]) -> None:
        done = stats.replayed + stats.rows + stats.failed + stats.skipped
        total = None if stats.planned is None else stats.replayed + stats.planned
        detail = status_line(stats, endpoints)
        if self._bar is not None:
            self._bar.update(self._task, completed=done, total=total, detail=detail)
        elif self.mode == "log" and time.monotonic() - self._last_log >= self.log_interval:
            self._last_log = time.monotonic()
            log.info("%d/%s rows | %s", done, "?" if total is None else total, detail)

    def stop(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


def status_line(stats: RunStats, endpoints: Sequence[Endpoint]) -> str:
    """Generated tokens/s, in flight, endpoint health, retries and failures, on one line."""
    down = [e.url for e in endpoints if not e.healthy]
    in_flight = sum(e.in_flight for e in endpoints)
    health = f"{len(endpoints) - len(down)}/{len(endpoints)} endpoints up" + (
        f" (down: {', '.join(down)})" if down else ""
    )
    return (
        f"{stats.tokens_per_second:,.0f} tok/s, {in_flight} in flight, {health}, "
        f"{stats.retries} retries, {stats.failed} failed, {stats.skipped} skipped"
    )


@dataclass(frozen=True)
class Summary:
    """What a finished build holds (over every run of the recipe) and how this run went."""

    rows: int
    prompt_tokens: int
    generated_tokens: int
    finish_reasons: Mapping[str, int]
    dropped: int
    skipped: Mapping[str, int]
    failed: Mapping[str, int]
    wall_time: float
    run_generated_tokens: int
    journal: str

    @property
    def tokens_per_second(self) -> float:
        return self.run_generated_tokens / max(self.wall_time, 1e-9)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "prompt_tokens": self.prompt_tokens,
            "generated_tokens": self.generated_tokens,
            "finish_reasons": dict(self.finish_reasons),
            "dropped_truncated": self.dropped,
            "skipped": dict(self.skipped),
            "failed": dict(self.failed),
            "wall_time_s": round(self.wall_time, 3),
            "generated_tokens_per_s": round(self.tokens_per_second, 1),
            "journal": self.journal,
        }

    def render(self) -> str:
        """A plain-text summary for the terminal."""
        lines = [
            f"rows              {self.rows:,}",
            f"prompt tokens     {self.prompt_tokens:,}",
            f"generated tokens  {self.generated_tokens:,}",
            f"finish reasons    {_counts(self.finish_reasons)}",
            f"dropped (length)  {self.dropped:,}",
            f"skipped           {sum(self.skipped.values()):,}{_reasons(self.skipped)}",
            f"failed            {sum(self.failed.values()):,}{_reasons(self.failed)}",
            f"wall time         {self.wall_time:,.1f} s",
            f"generated tok/s   {self.tokens_per_second:,.0f} (this run)",
            f"journal           {self.journal}",
        ]
        return "\n".join(lines)


def _counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k}: {v:,}" for k, v in sorted(counts.items())) or "-"


def _reasons(reasons: Mapping[str, int], most: int = 5) -> str:
    top = Counter(reasons).most_common(most)
    shown = "".join(f"\n    {count:>6,} x {reason}" for reason, count in top)
    more = len(reasons) - len(top)
    return shown + (f"\n    ... and {more} other reasons" if more > 0 else "")
