"""Live progress of a run, and its summary.

The bar counts completed rows (journaled), never submitted ones. ``mode="log"`` writes one line per
interval instead, for batch jobs; ``mode="none"`` shows nothing.
"""

from __future__ import annotations

import logging
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from rich.progress import Progress as RichProgress

    from eagle3_raw.journal.unmade import UnmadeSummary
    from eagle3_raw.run.endpoints import Endpoint

progress_log = logging.getLogger("eagle3_raw.run.progress")

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
    ended: int = 0
    """Rollout turns not made because their rollout ended before them (recorded)."""
    blocked: int = 0
    """Rollout turns left behind a turn that failed (no outcome: made by ``--retry-failed``)."""
    planned: int | None = None
    """Rows (and skips) this run plans, once the planner has gone through the whole source."""
    queued: int = 0
    """Rows planned so far; with the fields below, an estimate of ``planned`` before it is known."""
    source_rows: int | None = None
    """Rows in the prompt source (after ``limit``), when it can be counted cheaply."""
    disk_full_since: float | None = None
    """Since when (``time.monotonic()``) the journal's disk has had no room; None while it has."""
    disk_full_seconds: float = 0.0
    """How long the journal's disk had no room in the periods that ended."""
    held: int = 0
    """Generated rows held in memory now, the journal's disk having no room for them."""
    held_peak: int = 0
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

    def note_disk(self, full_since: float | None, held: int) -> Literal["full", "back"] | None:
        """Record the journal's disk state; returns ``"full"`` or ``"back"`` when it changed."""
        self.held, self.held_peak = held, max(self.held_peak, held)
        if full_since is not None and self.disk_full_since is None:
            self.disk_full_since = full_since
            return "full"
        if full_since is None and self.disk_full_since is not None:
            self.disk_full_seconds += time.monotonic() - self.disk_full_since
            self.disk_full_since = None
            return "back"
        return None

    def note_planned(self, source_index: int, rows: int = 1) -> None:
        """The planner queued ``rows`` rows of source row ``source_index`` (called in canonical order)."""
        if source_index != self._current_index:
            if self._first_index is None:
                self._first_index = source_index
            self._settled, self._current_index = self.queued, source_index
        self.queued += rows

    def total(self) -> tuple[int | None, bool]:
        """(rows this build will have an outcome for, whether that is exact): exact once planning
        ended; before, extrapolated at the density of planned rows per source row since the first
        planned one (right for a fresh run, a shard, a resume after a kill, or scattered retries).
        Rollout turns left out when their rollout ended early are taken off as they become known, so
        the bar ends at 100% (the status line shows how many)."""
        gone = self.ended + self.blocked  # rollout turns never made: no row, no bar
        if self.planned is not None:
            return self.replayed + self.planned - gone, True
        span = self._current_index - (self._first_index or 0)
        if self.source_rows is None or span <= 0:
            return None, False
        ahead = max(0, self.source_rows - self._current_index)
        return self.replayed + self._settled + round(ahead * self._settled / span) - gone, False

    def eta(self, total: int | None) -> float | None:
        """Seconds to go at this run's pace so far until ``total`` (from :meth:`total`) rows are done."""
        finished = self.rows + self.failed + self.skipped
        if total is None or not finished:
            return None
        return max(0, total - self.done) * self.elapsed / finished


class ProgressDisplay:
    """A rich progress bar on stderr (or periodic log lines) fed from the run's counters.

    ``mode="bar"`` falls back to log lines by itself when stderr is not a terminal (nohup, CI,
    ``| tee``), where a bar would print nothing until the end. The bar is two lines: the name, the
    bar, the row count (``~`` while the total is an estimate), the percentage and the ETA on the
    first, which fits 80 columns; the status line below it is cut to the terminal's width.
    """

    def __init__(self, mode: ProgressMode, *, log_interval: float = 30.0) -> None:
        self.mode = mode
        self.log_interval = log_interval
        self._last_log = time.monotonic()
        self._bar: RichProgress | None = None
        self._task: Any = None
        self._name = ""
        self._last: tuple[RunStats, Sequence[Endpoint]] | None = None

    def start(self, description: str) -> None:
        self._name = description
        if self.mode == "bar" and not stderr_is_terminal():
            self.mode = "log"
        if self.mode == "log":
            _show_progress_log()
            progress_log.info("%s: started; progress every %g s", description, self.log_interval)
        if self.mode == "bar":
            self._bar = _bar()
            self._task = self._bar.add_task(description, total=None, rows="", eta="", detail="")
            self._bar.start()

    def update(self, stats: RunStats, endpoints: Sequence[Endpoint]) -> None:
        """Show the counters (in log mode: a line once per interval)."""
        self._last = (stats, endpoints)
        total, exact = stats.total()
        if self._bar is not None:
            rows, eta = rows_text(stats.done, total, exact), eta_text(stats.eta(total))
            detail = status_line(stats, endpoints)
            self._bar.update(self._task, completed=stats.done, total=total, rows=rows, eta=eta, detail=detail)
        elif self.mode == "log" and time.monotonic() - self._last_log >= self.log_interval:
            self._log_line(stats, endpoints)

    def stop(self) -> None:
        """End the bar where it is; in log mode, one last line with the final counts."""
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        elif self.mode == "log" and self._last is not None:
            self._log_line(*self._last)
        self._last = None

    def _log_line(self, stats: RunStats, endpoints: Sequence[Endpoint]) -> None:
        self._last_log = time.monotonic()
        total, exact = stats.total()
        line = f"{progress_line(stats, total, exact)} | {status_line(stats, endpoints)}"
        progress_log.info("%s: %s", self._name, line)


def stderr_is_terminal() -> bool:
    """Whether a live display on stderr can be seen: a terminal, or a Jupyter notebook."""
    from rich.console import Console

    console = Console(stderr=True)
    return console.is_terminal or console.is_jupyter


def _bar() -> RichProgress:
    from rich.console import Group, RenderableType
    from rich.progress import BarColumn, Progress, TextColumn
    from rich.table import Column
    from rich.text import Text

    class TwoLines(Progress):
        def get_renderables(self) -> Any:
            status = [Text(f"  {t.fields['detail']}", no_wrap=True, overflow="ellipsis") for t in self.tasks]
            table: RenderableType = self.make_tasks_table(self.tasks)
            yield Group(table, *status)

    name = Column(max_width=24, no_wrap=True, overflow="ellipsis")
    fixed = Column(no_wrap=True)
    return TwoLines(
        TextColumn("{task.description}", table_column=name),
        BarColumn(bar_width=None, table_column=Column(ratio=1, min_width=10)),
        TextColumn("{task.fields[rows]}", table_column=fixed),
        TextColumn("{task.fields[eta]}", table_column=fixed),
        expand=True,
        refresh_per_second=4,
        transient=False,
    )


def rows_text(done: int, total: int | None, exact: bool) -> str:
    """``done/total rows pct``, ``~`` on a total that is still an estimate."""
    if total is None:
        return f"{done:,}/? rows"
    shown = f"{total:,}" if exact else f"~{total:,}"
    return f"{done:,}/{shown} rows {100 * done / max(total, 1):.0f}%"


def eta_text(eta: float | None) -> str:
    return "ETA ?" if eta is None else f"ETA {_duration(eta)}"


def progress_line(stats: RunStats, total: int | None, exact: bool) -> str:
    """``done/total rows (pct), ETA`` with ``~`` on an estimated total."""
    if total is None:
        return f"{stats.done:,}/? rows"
    shown = f"{total:,}" if exact else f"~{total:,}"
    percent = 100 * stats.done / max(total, 1)
    return f"{stats.done:,}/{shown} rows ({percent:.1f}%), {eta_text(stats.eta(total))}"


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def _show_progress_log() -> None:
    """Make the progress lines visible even where nobody configured logging (a Python caller)."""
    progress_log.setLevel(logging.INFO)
    if not progress_log.hasHandlers():
        handler = CurrentStderrHandler()
        handler.setFormatter(TimestampFormatter())
        progress_log.addHandler(handler)


# --- logging in the command line ---------------------------------------------------------------


class CurrentStderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is now, so a line logged while the bar is live goes through
    rich's redirect and lands above the bar instead of through it."""

    def __init__(self) -> None:
        super().__init__()

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


class TimestampFormatter(logging.Formatter):
    """``2025-01-31 12:00:00 <message>`` for progress lines, ``... WARNING <logger>: <message>`` else."""

    def __init__(self) -> None:
        super().__init__(datefmt="%Y-%m-%d %H:%M:%S")

    def format(self, record: logging.LogRecord) -> str:
        head = "" if record.name == progress_log.name else f"{record.levelname} {record.name}: "
        text = f"{self.formatTime(record, self.datefmt)} {head}{record.getMessage()}"
        return text + (f"\n{self.formatException(record.exc_info)}" if record.exc_info else "")


def configure_logging() -> None:
    """The command line's logging: one handler on stderr with timestamps (added once; handlers
    someone else put on the root logger stay); eagle3_raw's own INFO lines shown, libraries' from
    WARNING up."""
    root = logging.getLogger()
    if not any(isinstance(h, CurrentStderrHandler) for h in root.handlers):
        handler = CurrentStderrHandler()
        handler.setFormatter(TimestampFormatter())
        root.addHandler(handler)
    logging.getLogger("eagle3_raw").setLevel(logging.INFO)


def quiet_libraries() -> None:
    """Library output a command-line user should see once, or not at all.

    ``datasets``, ``huggingface_hub`` and ``transformers`` each install a stderr handler of their
    own; ``datasets`` and ``huggingface_hub`` also pass their records on to the root handler, so every
    warning printed twice. Their handlers are removed and the records go through the root handler
    once (timestamped, above a live bar). ``datasets``' progress bars (``Generating train split``)
    are turned off: they landed between the bar and the summary. transformers' "Token indices
    sequence length is longer than the specified maximum" is dropped: the server's limit is checked
    per prompt, and the tokenizer's ``model_max_length`` means nothing here.
    """
    import datasets
    import huggingface_hub.utils.logging  # noqa: F401  (installs its handler, removed below)
    import transformers.utils.logging  # noqa: F401

    datasets.disable_progress_bars()
    for name in ("datasets", "huggingface_hub", "transformers"):
        library = logging.getLogger(name)
        library.handlers.clear()
        library.propagate = True
    logging.getLogger("transformers.tokenization_utils_base").addFilter(_no_length_warning)


def _no_length_warning(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("Token indices sequence length is longer than")


def status_line(stats: RunStats, endpoints: Sequence[Endpoint]) -> str:
    """Generated tokens/s, in flight, endpoint health, retries and failures, on one line."""
    down = [e.url for e in endpoints if not e.healthy]
    in_flight = sum(e.in_flight for e in endpoints)
    health = f"{len(endpoints) - len(down)}/{len(endpoints)} endpoints up" + (
        f" (down: {', '.join(down)})" if down else ""
    )
    full = ""
    if stats.disk_full_since is not None:  # first: the line is cut to the terminal's width
        waited = _duration(time.monotonic() - stats.disk_full_since)
        full = f"JOURNAL DISK FULL for {waited}: {stats.held:,} rows held, no new request; "
    return (
        f"{full}{stats.tokens_per_second:,.0f} tok/s, {in_flight} in flight, {health}, "
        f"{stats.retries} retries, {stats.failed} failed, {stats.skipped} skipped"
        + (f", {stats.ended} turns not made (rollouts ended early)" if stats.ended else "")
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
    run_replayed: int = 0
    """Rows this set's journal held when this run started (resumed: neither asked nor made again)."""
    samples_per_prompt: int = 1
    ended_turns: int = 0
    """Rollout turns never made because their rollout ended before them (every run)."""
    rollouts: Mapping[str, Any] | None = None
    """For ``turns: rollout``: :func:`~eagle3_raw.journal.assembly.rollout_stats`."""
    mixture: Mapping[str, int] | None = None
    """With a sampling mixture: turns drawn each component, by its index."""
    disk_full_seconds: float = 0.0
    """How long the journal's disk had no room during this run (its rows were held meanwhile)."""
    held_peak: int = 0
    """The most generated rows held in memory at once while it had none."""
    unmade: UnmadeSummary | None = None
    """The rows not made, by reason with their first row ids, and the command listing every one."""

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
            "run_replayed": self.run_replayed,
            "journal": self.journal,
            **({"unmade_rows_command": self.unmade.command} if self.unmade and self.unmade.line() else {}),
            **(self._disk_dict() if self.disk_full_seconds else {}),
            **({"rollouts": dict(self.rollouts)} if self.rollouts is not None else {}),
            **({"mixture": dict(self.mixture)} if self.mixture is not None else {}),
        }

    def _disk_dict(self) -> dict[str, Any]:
        return {"disk_full_s": round(self.disk_full_seconds, 1), "held_peak": self.held_peak}

    def render(self) -> str:
        """A plain-text summary for the terminal."""
        lines = [
            f"rows              {self.rows:,}",
            f"prompt tokens     {self.prompt_tokens:,}",
            f"generated tokens  {self.generated_tokens:,}",
            f"finish reasons    {_counts(self.finish_reasons)}",
            f"dropped (length)  {self.dropped:,}",
            f"skipped           {sum(self.skipped.values()):,}{self._reasons('skipped', self.skipped)}",
            f"failed            {sum(self.failed.values()):,}{self._reasons('failed', self.failed)}",
            f"wall time         {self.wall_time:,.1f} s",
            f"journaled rows    {self.run_replayed:,} (in the journal when this run started: resumed)",
            f"new rows          {self.run_rows:,} (generated this run)",
            f"reused rows       {self.run_reused:,} (this run, generations the journal held: no request)",
            f"generated tok/s   {self.tokens_per_second:,.0f} (this run)",
            *self._rollout_lines(),
            f"journal           {self.journal}",
        ]
        if self.disk_full_seconds:
            lines.append(
                f"journal disk      full for {self.disk_full_seconds:,.0f} s this run: up to "
                f"{self.held_peak:,} generated rows held in memory, all written when space came back"
            )
        if self.unmade is not None and self.unmade.line():
            lines += [f"not made          {self.unmade.line()}", f"                  {self.unmade.command}"]
        failed = sum(self.failed.values())
        if failed:
            lines.append(
                f"not complete      {failed:,} rows failed for good and are not in the set; run the same "
                "command with --retry-failed to try them again"
            )
        return "\n".join(lines)

    def _reasons(self, kind: str, reasons: Mapping[str, int]) -> str:
        """The reason lines of ``kind``: by reason, with row ids, when the rows are known."""
        return self.unmade.reason_lines(kind) if self.unmade is not None else reason_lines(reasons)

    def _rollout_lines(self) -> list[str]:
        lines = []
        if self.rollouts is not None:
            r = self.rollouts
            ended = r.get("ended") or {}
            lines += [
                f"rollouts          {r['rollouts']:,} ({self._rollout_shape(r)}); rows: {_counts(r['rows'])}",
                f"turns per rollout {_counts({str(k): v for k, v in r['turns'].items()})}",
                f"ended early       {sum(ended.values()):,} rollouts, {self.ended_turns:,} turns not made"
                f"{reason_lines(ended)}",
            ]
        if self.mixture is not None:
            lines.append(
                f"mixture           {_counts({f'component {k}': v for k, v in self.mixture.items()})} turns"
            )
        return lines

    def _rollout_shape(self, r: Mapping[str, Any]) -> str:
        """``2 samples x 120 conversations`` (``of ...`` when some sample made no turn)."""
        samples = f"{self.samples_per_prompt} sample{'s' if self.samples_per_prompt != 1 else ''}"
        shape = f"{samples} x {r['source_rows']:,} conversations"
        return shape if r["rollouts"] == self.samples_per_prompt * r["source_rows"] else f"of {shape}"


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
