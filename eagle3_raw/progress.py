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

progress_log = logging.getLogger("eagle3_raw.progress")

ProgressMode = Literal["bar", "log", "none"]


@dataclass
class RunStats:
    """Counters of the current process's run (the journal holds the totals over every run)."""

    started: float = field(default_factory=time.monotonic)
    replayed: int = 0
    """Rows this set already had when the run started."""
    reused: int = 0
    """Rows made of generations the journal holds (for another row or set): no request sent."""
    rows: int = 0
    generated_tokens: int = 0
    retries: int = 0
    failed: int = 0
    skipped: int = 0
    planned: int | None = None
    """Rows (and skips) this run plans, once the planner has gone through the whole source."""
    queued: int = 0
    """Rows planned so far; with the fields below, an estimate of ``planned`` before it is known."""
    source_rows: int | None = None
    """Rows in the prompt source (after ``limit``), when it can be counted cheaply."""
    _first_index: int | None = None  # source row of the first planned row
    _current_index: int = -1  # source row being planned
    _settled: int = 0  # rows planned before the current source row

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / max(self.elapsed, 1e-9)

    @property
    def done(self) -> int:
        """Rows with an outcome (journaled, reused, failed or skipped), replayed ones included."""
        return self.replayed + self.reused + self.rows + self.failed + self.skipped

    def note_planned(self, source_index: int) -> None:
        """The planner queued a row of source row ``source_index`` (called in canonical order)."""
        if source_index != self._current_index:
            if self._first_index is None:
                self._first_index = source_index
            self._settled, self._current_index = self.queued, source_index
        self.queued += 1

    def total(self) -> tuple[int | None, bool]:
        """(rows this build will have an outcome for, whether that is exact): exact once planning
        ended; before, extrapolated at the density of planned rows per source row since the first
        planned one (right for a fresh run, a shard, a resume after a kill, or scattered retries)."""
        if self.planned is not None:
            return self.replayed + self.planned, True
        span = self._current_index - (self._first_index or 0)
        if self.source_rows is None or span <= 0:
            return None, False
        ahead = max(0, self.source_rows - self._current_index)
        return self.replayed + self._settled + round(ahead * self._settled / span), False

    def eta(self, total: int | None) -> float | None:
        """Seconds to go at this run's pace so far until ``total`` (from :meth:`total`) rows are done."""
        finished = self.rows + self.failed + self.skipped
        if total is None or not finished:
            return None
        return max(0, total - self.done) * self.elapsed / finished


class ProgressDisplay:
    """A rich progress bar (or periodic log lines) fed from the run's counters."""

    def __init__(self, mode: ProgressMode, *, log_interval: float = 30.0) -> None:
        self.mode = mode
        self.log_interval = log_interval
        self._last_log = time.monotonic()
        self._bar: RichProgress | None = None
        self._task: Any = None

    def start(self, description: str) -> None:
        if self.mode == "log":
            _show_progress_log()
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
        total, exact = stats.total()
        detail = status_line(stats, endpoints)
        if self._bar is not None:
            self._bar.update(self._task, completed=stats.done, total=total, detail=detail)
        elif self.mode == "log" and time.monotonic() - self._last_log >= self.log_interval:
            self._last_log = time.monotonic()
            progress_log.info("%s | %s", progress_line(stats, total, exact), detail)

    def stop(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


def progress_line(stats: RunStats, total: int | None, exact: bool) -> str:
    """``done/total rows (pct), ETA`` with ``~`` on an estimated total."""
    if total is None:
        return f"{stats.done:,}/? rows"
    shown = f"{total:,}" if exact else f"~{total:,}"
    eta = stats.eta(total)
    pace = "ETA ?" if eta is None else f"ETA {_duration(eta)}"
    return f"{stats.done:,}/{shown} rows ({100 * stats.done / max(total, 1):.1f}%), {pace}"


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def _show_progress_log() -> None:
    """Make the progress lines visible even where nobody configured logging (a Python caller)."""
    progress_log.setLevel(logging.INFO)
    if not progress_log.hasHandlers():
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
        progress_log.addHandler(handler)


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
    run_rows: int = 0
    """Rows generated by this run (the others were already in the journal)."""
    run_reused: int = 0
    """Rows this run made of generations the journal held (no request sent)."""

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
            "run_rows": self.run_rows,
            "run_reused": self.run_reused,
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
            f"skipped           {sum(self.skipped.values()):,}{reason_lines(self.skipped)}",
            f"failed            {sum(self.failed.values()):,}{reason_lines(self.failed)}",
            f"wall time         {self.wall_time:,.1f} s",
            f"new rows          {self.run_rows:,} (generated this run)",
            f"reused rows       {self.run_reused:,} (this run, generations the journal held: no request)",
            f"generated tok/s   {self.tokens_per_second:,.0f} (this run)",
            f"journal           {self.journal}",
        ]
        return "\n".join(lines)


def _counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k}: {v:,}" for k, v in sorted(counts.items())) or "-"


def reason_lines(
    reasons: Mapping[str, int], most: int = 5, examples: Mapping[str, Sequence[str]] | None = None
) -> str:
    """Up to ``most`` lines ``N x <reason>``, most common first (each with up to three of its
    ``examples``, e.g. row ids, when given), and how many reasons are not shown."""
    top = Counter(reasons).most_common(most)
    shown = "".join(
        f"\n    {count:>6,} x {reason}{_examples((examples or {}).get(reason))}" for reason, count in top
    )
    more = len(reasons) - len(top)
    return shown + (f"\n    ... and {more} other reasons" if more > 0 else "")


def _examples(names: Sequence[str] | None, most: int = 3) -> str:
    if not names:
        return ""
    plural = "s" if len(names) > 1 else ""
    return f" (row{plural} {', '.join(names[:most])}{', ...' if len(names) > most else ''})"
