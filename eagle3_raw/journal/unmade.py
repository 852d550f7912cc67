"""The rows a set does not hold, and why: each failed, skipped or ended-early row by its row id.

A set's journal keeps, for every row key without a row, its current failure (:meth:`Journal.failures
<eagle3_raw.journal.store.Journal.failures>`: the latest ``failed`` of the current retry epoch,
else the latest ``skipped`` or ``ended``). This module reads them back for people:

- :func:`unmade_rows` lists them (``eagle3-raw journals rows CONFIG_ID``, as text or JSON lines);
- :func:`summarize_unmade` counts them by reason for a build's end summary, with a few row ids per
  reason and the command (:func:`rows_command`) that lists every one.

A reason names its row (``row 'src' turn 1: ...``, ``row src:1:0 (...): ...``); :func:`reason_group`
takes that naming off, so that rows skipped or failed for the same cause count as one reason.
"""

from __future__ import annotations

import re
import shlex
import textwrap
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3_raw.printable import printable
from eagle3_raw.run.progress import reason_lines

if TYPE_CHECKING:
    from eagle3_raw.journal import Journal

KINDS = ("failed", "skipped", "ended")
"""What became of a row that is not in the set (see :data:`eagle3_raw.journal.FAILURE_KINDS`)."""

EXAMPLES = 3
"""Row ids a summary shows per reason."""

_TURN = re.compile(r" turn \d+")
_DETAIL = re.compile(r" \([^()]*\)")


@dataclass(frozen=True)
class UnmadeRow:
    """One row key of a set with no row: its row id, where it stands, what became of it and why."""

    id: str
    """The row id (``<source id>:<turn>:<sample>``; a source row refused whole: its id or ``#<n>``)."""
    index: int
    """The source row's position in the prompt source (from 0)."""
    turn: int | None
    """The message position the row starts at; None for a source row refused whole."""
    sample: int | None
    kind: str
    """``failed`` (``--retry-failed`` asks again), ``skipped`` (unusable prompt) or ``ended``."""
    reason: str

    @classmethod
    def from_failure(cls, failure: Mapping[str, Any]) -> UnmadeRow:
        """The row of a failure as :meth:`Journal.failures` gives it (key, id, kind, reason)."""
        key = failure["key"]
        whole = key.turn < 0  # plan.WHOLE_ROW: the source row itself was refused
        return cls(
            id=str(failure["id"]), index=int(key.index), turn=None if whole else int(key.turn),
            sample=None if whole else int(key.sample), kind=str(failure["kind"]),
            reason=str(failure["reason"]),
        )  # fmt: skip

    @property
    def group(self) -> str:
        """The reason without the naming of its row: what rows that failed alike share."""
        return reason_group(self.reason, self.id)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "reason": self.reason, "index": self.index,
                "turn": self.turn, "sample": self.sample}  # fmt: skip


def unmade_rows(journal: Journal, *, kinds: Iterable[str] = KINDS) -> list[UnmadeRow]:
    """Every row key of ``journal``'s set with no row and a current failure of one of ``kinds``,
    in canonical (key) order. Reads only the failure records."""
    wanted = set(kinds)
    return [UnmadeRow.from_failure(f) for f in journal.failures() if f["kind"] in wanted]


def reason_group(reason: str, row_id: str) -> str:
    """``reason`` without the words that name its row: a leading ``row <id>`` (the row id, its
    source id, either quoted), then `` turn <n>`` and one parenthesized detail (``(5,000 prompt
    tokens)``) if there, then ``: ``. A reason that does not start so is returned whole."""
    source = row_id.rsplit(":", 2)[0] if row_id.count(":") >= 2 else row_id
    for name in dict.fromkeys((repr(row_id), row_id, repr(source), source)):
        prefix = f"row {name}"
        if not reason.startswith(prefix):
            continue
        rest = reason[len(prefix) :]
        if rest[:1] not in ("", " ", ":"):
            continue  # the id goes on: "row ab" is no prefix of "row abc"
        for pattern in (_TURN, _DETAIL):
            if match := pattern.match(rest):
                rest = rest[match.end() :]
        rest = rest.removeprefix(":").lstrip()
        return rest or reason
    return reason


def rows_command(journal_dir: Path, *, kind: str | None = None) -> str:
    """The shell command that lists the set at ``journal_dir`` (``<root>/sets/<config id>``)'s
    unmade rows (``kind``: only those), with its journal root spelled out as an absolute path: it
    works as printed, from any folder."""
    root, config_id = journal_dir.absolute().parent.parent, journal_dir.name
    words = ["eagle3-raw", "journals", "rows", config_id, "--journal-dir", str(root)]
    return shlex.join(words + ([f"--{kind}"] if kind else []))


@dataclass(frozen=True)
class UnmadeSummary:
    """The unmade rows of a set counted for a summary: by kind, by reason (:func:`reason_group`),
    with the first row ids of each reason and the command that lists every row."""

    counts: Mapping[str, Mapping[str, int]]
    """kind -> reason -> rows."""
    examples: Mapping[str, Mapping[str, Sequence[str]]]
    """kind -> reason -> the first row ids, one more than :data:`EXAMPLES` where there are more."""
    command: str

    def total(self, kind: str) -> int:
        return sum(self.counts.get(kind, {}).values())

    def reason_lines(self, kind: str) -> str:
        """The summary's lines under ``kind``: ``N x <reason> (rows a, b, c, ...)``, most common first."""
        return reason_lines(self.counts.get(kind, {}), examples=self.examples.get(kind, {}))

    def line(self) -> str:
        """``3 rows (2 skipped, 1 failed) ...`` and the command listing them, or "" when none."""
        parts = [f"{self.total(k):,} {k}" for k in ("skipped", "failed", "ended") if self.total(k)]
        if not parts:
            return ""
        rows = sum(self.total(kind) for kind in KINDS)
        return f"{rows:,} row{'s' if rows != 1 else ''} ({', '.join(parts)}); each with its id and reason:"


def summarize_unmade(journal: Journal) -> UnmadeSummary:
    """:class:`UnmadeSummary` of ``journal``'s set."""
    counts, examples = group_reasons(unmade_rows(journal))
    return UnmadeSummary(counts=counts, examples=examples, command=rows_command(journal.directory))


def group_reasons(
    rows: Iterable[UnmadeRow],
) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, tuple[str, ...]]]]:
    """(kind -> reason -> rows, kind -> reason -> first row ids) of ``rows``: rows that share a
    :func:`reason_group` count as one reason, shown with their first ids (one more than
    :data:`EXAMPLES` where there are more); a reason only one row has stays as it was written
    (it names its row), with no ids after it. Row ids are escaped (:func:`printable`)."""
    counts: dict[str, Counter[str]] = {}
    firsts: dict[tuple[str, str], UnmadeRow] = {}
    ids: dict[tuple[str, str], list[str]] = {}
    for row in rows:
        group = row.group
        counts.setdefault(row.kind, Counter())[group] += 1
        firsts.setdefault((row.kind, group), row)
        shown = ids.setdefault((row.kind, group), [])
        if len(shown) <= EXAMPLES:  # one more than shown: the summary then says "..."
            shown.append(printable(row.id, limit=80))
    by_kind: dict[str, dict[str, int]] = {}
    examples: dict[str, dict[str, tuple[str, ...]]] = {}
    for kind, groups in counts.items():
        for group, count in groups.items():
            if count == 1:
                by_kind.setdefault(kind, {})[firsts[kind, group].reason] = 1
            else:
                by_kind.setdefault(kind, {})[group] = count
                examples.setdefault(kind, {})[group] = tuple(ids[kind, group])
    return by_kind, examples


def render_text(rows: Sequence[UnmadeRow], *, width: int = 80) -> str:
    """The rows for a terminal, ``width`` columns: ``<kind> <row id>`` on one line, its reason
    wrapped under it, then a count by kind. What a server or source wrote is escaped."""
    lines = []
    for row in rows:
        lines.append(f"{row.kind:<8} {printable(row.id, limit=200)}")
        reason = printable(row.reason, limit=2000)
        lines += textwrap.wrap(reason, width, initial_indent="    ", subsequent_indent="    ") or ["    -"]
    counts = Counter(row.kind for row in rows)
    total = ", ".join(f"{counts[k]:,} {k}" for k in KINDS if counts[k]) or "none"
    lines.append(f"{len(rows):,} row{'s' if len(rows) != 1 else ''} not in the set: {total}")
    return "\n".join(lines)


def render_json_lines(rows: Sequence[UnmadeRow]) -> str:
    """The rows as JSON lines, one object each: ``id``, ``kind``, ``reason``, ``index``, ``turn``,
    ``sample`` (``turn`` and ``sample`` null for a source row refused whole); "" for no rows."""
    import json

    # ASCII escapes: a reason's terminal controls or bidirectional marks never reach a terminal raw
    return "".join(json.dumps(row.to_dict(), ensure_ascii=True) + "\n" for row in rows)
