"""``eagle3-raw status RECIPE --journal-dir DIR [--watch]``: a recipe's shards as the shared journal
shows them while they run: per shard and in total, rows done, failed, skipped, generated tokens,
rate and ETA.

It reads only index files and the records they point to (what readers of a journal always read,
:mod:`eagle3_raw.journal`), sends nothing, starts nothing, and takes no lock a writer needs. The
sets shown are those of the recipe (its name and fingerprint) under the journal root: normally
one; more when shards resolved different targets (another model, or other limits), which is worth
knowing before a merge. Rates are measured here, over the last minute of scans (this process's
own clock: nothing compares clocks across hosts); the ETA is the rows still expected at that rate.
A shard's expected rows are exact once it has finished (its marker), else estimated from the
prompt source's row count at the density of rows per source row seen so far (``~``).

Per shard: ``done`` (its marker is there), ``running`` (a process holds its lock), ``stopped``
(outcomes, but no writer and no marker: preempted, killed or failed: run it again), ``waiting``
(nothing yet). A scan reads only what is new since the last one.
"""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3_raw.errors import FatalError
from eagle3_raw.identity import Target
from eagle3_raw.journal import Journal
from eagle3_raw.journal.files import try_lock
from eagle3_raw.journal.log import entry_offsets, log_files, read_entries
from eagle3_raw.journal.records import FAILURE, ROW, decode_outcome
from eagle3_raw.journal.roots import sets_of
from eagle3_raw.journal.sets import pack_keys
from eagle3_raw.printable import printable
from eagle3_raw.run.progress import _duration
from eagle3_raw.run.shards import completed, is_shard
from eagle3_raw.source.prompts import count_source_rows

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from eagle3_raw.journal import Journal
    from eagle3_raw.recipe import Recipe

_OUT_FILE = re.compile(r"^out-(\d{1,9})-of-(\d{1,9})-")
_WINDOW = 60.0


@dataclass
class ShardStatus:
    """One shard's counts as of the last scan."""

    index: int
    count: int
    state: str = "waiting"
    rows: int = 0
    failed: int = 0
    skipped: int = 0
    generated_tokens: int = 0
    expected: int | None = None
    exact: bool = False
    rows_per_s: float | None = None
    tokens_per_s: float | None = None

    @property
    def outcomes(self) -> int:
        return self.rows + self.failed + self.skipped

    @property
    def eta(self) -> float | None:
        """Seconds until every expected row has an outcome, at the measured rate."""
        if self.state == "done":
            return 0.0
        if self.expected is None or not self.rows_per_s:
            return None
        return max(0, self.expected - self.outcomes) / self.rows_per_s


@dataclass
class _ShardScan:
    """What one shard's files held at the last scan (keys as packed int64s)."""

    rows: list[npt.NDArray[np.int64]] = field(default_factory=list)
    failures: dict[int, str] = field(default_factory=dict)
    tokens: int = 0
    history: deque[tuple[float, int, int]] = field(default_factory=deque)


class SetWatcher:
    """Scans one set's journal folder again and again, reading only what is new each time."""

    def __init__(self, directory: Path, recipe: Recipe) -> None:
        self.directory = directory
        self.recipe = recipe
        self.journal: Journal = Journal.read_dir(directory)
        self._consumed: dict[str, int] = {}
        self._shards: dict[tuple[int, int], _ShardScan] = {}
        self._source_rows = _source_rows(recipe)
        self._markers: dict[int, dict[int, dict[str, Any]]] = {}

    def scan(self) -> list[ShardStatus]:
        """Read what is new, and the counts of every shard (those not started included)."""
        epoch = int((self.journal.manifest or {}).get("retry_epoch", 0))
        rows = []
        for path, shard in self._outcome_files():
            scan = self._shards.setdefault(shard, _ShardScan())
            rows.append((scan, self._read_new(path, scan, epoch)))
        # Ordering: the generation index is read after the outcomes. A writer makes a row's
        # generation durable before the row, so every generation a row read here names is in it;
        # an index read first missed the newest rows' generations, whose tokens then never counted.
        index = self.journal.generation_index()
        for scan, digests in rows:
            scan.tokens += self._tokens(digests, index)
        now, self._markers = time.monotonic(), completed(self.directory)
        return [self._status(shard, now) for shard in self._all_shards()]

    def close(self) -> None:
        self.journal.close()

    def _outcome_files(self) -> Iterator[tuple[Path, tuple[int, int]]]:
        for path in log_files(self.directory, "out"):
            match = _OUT_FILE.match(path.name)
            if match and is_shard(int(match[1]), int(match[2])):  # bounded: no state per claimed shard
                yield path, (int(match[1]), int(match[2]))

    def _read_new(self, path: Path, scan: _ShardScan, epoch: int) -> npt.NDArray[Any]:
        """Take in ``path``'s new entries; returns the generation digests of its new rows."""
        import numpy as np

        entries = read_entries(path.with_suffix(".idx"))[self._consumed.get(path.name, 0) :]
        self._consumed[path.name] = self._consumed.get(path.name, 0) + len(entries)
        if not len(entries):
            return entries["key2"]
        offsets, kinds = entry_offsets(entries)
        keys = _packed(entries["key1"])
        rows = kinds == ROW
        scan.rows.append(keys[rows])
        for position in np.flatnonzero(kinds == FAILURE):
            info = self._outcome_info(path, int(offsets[position]), int(entries["length"][position]))
            if info.get("kind") == "skipped" or int(info.get("epoch", 0)) >= epoch:
                scan.failures[int(keys[position])] = str(info.get("kind"))
        digests: npt.NDArray[Any] = entries["key2"][rows]
        return digests

    def _tokens(self, digests: npt.NDArray[Any], index: Any) -> int:
        total = 0
        for digest in digests.view("S16").tolist():
            location = index.locate(bytes(digest).ljust(16, b"\0"))
            if location is not None:  # a generation not copied here counts no tokens
                total += self.journal.generation_facts(location)[1]
        return total

    def _outcome_info(self, path: Path, offset: int, length: int) -> dict[str, Any]:
        reader = self.journal.sets._reader
        return dict(decode_outcome(reader.read(path, offset, length)).info)

    def _all_shards(self) -> list[tuple[int, int]]:
        counts = {count for _, count in self._shards} | set(self._markers)
        return sorted(
            {(i, n) for n in counts for i in range(n)} | set(self._shards), key=lambda s: (s[1], s[0])
        )

    def _status(self, shard: tuple[int, int], now: float) -> ShardStatus:
        import numpy as np

        scan = self._shards.get(shard, _ShardScan())
        done = np.unique(np.concatenate(scan.rows)) if scan.rows else np.zeros(0, np.int64)
        if len(scan.rows) > 1:
            scan.rows = [done]
        failures = {k: v for k, v in scan.failures.items() if not _contains(done, k)}
        status = ShardStatus(shard[0], shard[1], rows=len(done), generated_tokens=scan.tokens,
                             failed=sum(v == "failed" for v in failures.values()),
                             skipped=sum(v == "skipped" for v in failures.values()))  # fmt: skip
        status.state = self._state(shard, status)
        status.expected, status.exact = self._expected(shard, status, done, failures)
        _rates(scan, status, now)
        return status

    def _state(self, shard: tuple[int, int], status: ShardStatus) -> str:
        if shard[0] in self._markers.get(shard[1], {}):
            return "done"
        if _locked(self.directory / f"shard-{shard[0]}-of-{shard[1]}.lock"):
            return "running"
        return "stopped" if status.outcomes else "waiting"

    def _expected(
        self,
        shard: tuple[int, int],
        status: ShardStatus,
        done: npt.NDArray[np.int64],
        failures: dict[int, str],
    ) -> tuple[int | None, bool]:
        import numpy as np

        marker = self._markers.get(shard[1], {}).get(shard[0])
        if marker is not None:
            return int(marker.get("keys", status.outcomes)), True
        if self._source_rows is None:
            return None, False
        mine = len(range(shard[0], self._source_rows, shard[1]))
        keys = np.union1d(done, np.fromiter(failures, np.int64, len(failures)))
        sources = len(np.unique(keys >> 24))
        per_source = len(keys) / sources if sources else float(self.recipe.sampling.samples_per_prompt)
        return max(status.outcomes, round(mine * per_source)), False


def _packed(key1: Any) -> npt.NDArray[np.int64]:
    import numpy as np

    keys = key1.view("V16").view([("index", "<i8"), ("turn", "<i4"), ("sample", "<i4")])
    packed: npt.NDArray[np.int64] = pack_keys(
        keys["index"], keys["turn"].astype(np.int64), keys["sample"].astype(np.int64)
    )
    return packed


def _contains(ordered: npt.NDArray[np.int64], key: int) -> bool:
    import numpy as np

    position = int(np.searchsorted(ordered, key))
    return position < len(ordered) and int(ordered[position]) == key


def _rates(scan: _ShardScan, status: ShardStatus, now: float) -> None:
    """Rows and tokens per second over the last minute of scans."""
    scan.history.append((now, status.outcomes, status.generated_tokens))
    while len(scan.history) > 2 and now - scan.history[0][0] > _WINDOW:
        scan.history.popleft()
    first = scan.history[0]
    span = now - first[0]
    if span > 0 and status.state != "done":
        status.rows_per_s = (status.outcomes - first[1]) / span
        status.tokens_per_s = (status.generated_tokens - first[2]) / span


def _locked(path: Path) -> bool:
    """True when a process holds the lock file ``path`` (one that does not exist is not held)."""
    import os

    if not path.exists():
        return False
    fd = try_lock(path)
    if fd is None:
        return True
    os.close(fd)
    return False


def _source_rows(recipe: Recipe) -> int | None:
    try:
        return count_source_rows(recipe)
    except Exception:  # only the estimate depends on it
        return None


def watchers(recipe: Recipe, root: Path) -> list[SetWatcher]:
    """A watcher for each set of ``recipe`` (name and fingerprint) under the journal root ``root``;
    FatalError naming the root when there is none yet."""
    found = sets_of(root, recipe.name, recipe.fingerprint)
    if not found:
        raise FatalError(
            f"the journal {root} holds no set of recipe {recipe.name!r} (with these --set options) yet: "
            "no shard has started, or it writes to another --journal-dir"
        )
    return [SetWatcher(folder, recipe) for folder, _ in found]


def render(watcher: SetWatcher, shards: list[ShardStatus]) -> str:
    """The table of one set: a line per shard, then the total."""
    target = Target.from_dict(watcher.journal.manifest["target"]).describe()
    lines = [f"set {watcher.directory.name}: {printable(target)}", _HEADER]
    lines += [_line(f"{s.index}/{s.count}", s.state, s, s.eta) for s in shards]
    lines.append(_line("total", _states(shards), _total(shards), _total_eta(shards)))
    return "\n".join(lines)


_HEADER = (
    f"{'shard':<6}{'state':<9}{'rows':>15}{'failed':>7}{'skipped':>8}{'gen tokens':>12}{'rows/s':>7}"
    f"{'tok/s':>8}{'ETA':>7}"
)
"""79 columns."""


def _line(name: str, state: str, s: ShardStatus, eta: float | None) -> str:
    expected = "?" if s.expected is None else f"{'' if s.exact else '~'}{s.expected:,}"
    rate = "-" if s.rows_per_s is None else f"{s.rows_per_s:,.1f}"
    tokens = "-" if s.tokens_per_s is None else f"{s.tokens_per_s:,.0f}"
    shown_eta = "-" if eta is None else _duration(eta)
    return (
        f"{name:<6}{state:<9}{f'{s.outcomes:,}/{expected}':>15}{s.failed:>7,}{s.skipped:>8,}"
        f"{s.generated_tokens:>12,}{rate:>7}{tokens:>8}{shown_eta:>7}"
    )


def _states(shards: list[ShardStatus]) -> str:
    done = sum(s.state == "done" for s in shards)
    return f"{done}/{len(shards)} done"


def _total(shards: list[ShardStatus]) -> ShardStatus:
    rates = [s.rows_per_s for s in shards if s.rows_per_s is not None]
    tokens = [s.tokens_per_s for s in shards if s.tokens_per_s is not None]
    expected = [s.expected for s in shards]
    return ShardStatus(
        -1, len(shards), rows=sum(s.rows for s in shards), failed=sum(s.failed for s in shards),
        skipped=sum(s.skipped for s in shards), generated_tokens=sum(s.generated_tokens for s in shards),
        expected=None if None in expected else sum(e or 0 for e in expected),
        exact=all(s.exact for s in shards), rows_per_s=sum(rates) if rates else None,
        tokens_per_s=sum(tokens) if tokens else None,
    )  # fmt: skip


def _total_eta(shards: list[ShardStatus]) -> float | None:
    """The whole set's ETA: the rows still expected, at the shards' summed rate."""
    if all(s.state == "done" for s in shards):
        return 0.0
    total = _total(shards)
    if total.expected is None or not total.rows_per_s:
        return None
    return max(0, total.expected - total.outcomes) / total.rows_per_s
