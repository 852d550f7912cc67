"""Which source rows a set's planner went through, and how many row keys each has.

A resume passes over the source rows whose every row key has an outcome without reading them
(:class:`~eagle3_raw.rows.PassOver`): at a million done rows, parsing them cost seconds before the
first request. Knowing that a row is done takes its number of row keys, which depends on its
messages: the planner records it (:class:`PlanLog`) the first time it plans the row, with a hash
of the row's id, so that a later row repeating that id is still refused as a duplicate.

A record is a fact about the source row alone (the set's config id covers the source's content; a
Hub source's commit is pinned in the manifest), so it may be written before the row's outcomes.
Files: ``plan-<shard>-<host>-<n>.bin`` beside the outcome log of the same name (its lock covers
both), fixed-width records with a check word. Nothing here is needed for correctness: a torn,
damaged or missing record only means the row is read and planned as before; a write error stops
the recording, never the run.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from eagle3_raw.journal.files import open_append, read_bytes, write_all
from eagle3_raw.rows import PassOver

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

log = logging.getLogger(__name__)

PREFIX = "plan-"
_MIX_INDEX = 0x9E3779B97F4A7C15
_MIX_KEYS = 0xC2B2AE3D27D4EB4F
_SALT = 0x5A17E3D1
_MASK64 = (1 << 64) - 1
_BUFFER = 1 << 16
_INTERVAL = 1.0  # seconds: like the outcome log's flushes, a kill loses about a second of records
_RECORD = struct.Struct("<qQII")  # index, id hash, keys, check: the layout of _dtype()


def _dtype() -> np.dtype[np.void]:
    import numpy as np

    return np.dtype([("index", "<i8"), ("id", "<u8"), ("keys", "<u4"), ("check", "<u4")])


def _check(index: int, id_hash: int, keys: int) -> int:
    mixed = ((index * _MIX_INDEX) & _MASK64) ^ id_hash ^ ((keys * _MIX_KEYS) & _MASK64)
    return (mixed ^ (mixed >> 32) ^ _SALT) & 0xFFFFFFFF


def plan_path(outcome_log: Path) -> Path:
    """The plan file that goes with the outcome log ``out-<shard>-<host>-<n>.bin``."""
    return outcome_log.with_name(PREFIX + outcome_log.name.removeprefix("out-"))


class PlanLog:
    """Appends plan records (from the planner's thread): written every second or 64 KiB, at
    :meth:`flush` (the plan is exhausted) and at :meth:`close`. Not fsynced: a lost record only
    costs a resume the parsing of its row."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._buffer = bytearray()
        self._fd: int | None = None
        self._failed = False
        self._written_at = time.monotonic()
        self._lock = threading.Lock()

    def add(self, index: int, id_hash: int, keys: int) -> None:
        """Record that source row ``index`` (its id hashed: ``id_hash``, 0 for none) has ``keys`` row keys."""
        record = _RECORD.pack(index, id_hash, keys, _check(index, id_hash, keys))
        with self._lock:
            if self._failed:
                return
            self._buffer += record
            if len(self._buffer) >= _BUFFER or time.monotonic() - self._written_at >= _INTERVAL:
                self._write()

    def flush(self) -> None:
        with self._lock:
            if self._buffer and not self._failed:
                self._write()

    def close(self) -> None:
        self.flush()
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def _write(self) -> None:
        try:
            if self._fd is None:
                self._fd = open_append(self.path)
            write_all(self._fd, bytes(self._buffer))
        except OSError as exc:  # only a resume's shortcut is lost: the rows are read again then
            log.debug("cannot write %s (%s): no more plan records from this process", self.path, exc)
            self._failed = True
        self._buffer.clear()
        self._written_at = time.monotonic()


def read_plans(directory: Path) -> npt.NDArray[np.void]:
    """Every valid plan record of the set in ``directory``, sorted by index, one per index (an index
    whose records disagree is left out)."""
    import numpy as np

    dtype = _dtype()
    parts = []
    for path in sorted(p for p in directory.glob(f"{PREFIX}*.bin") if not p.is_symlink()):
        try:
            data = read_bytes(path)
        except OSError as exc:
            log.debug("cannot read %s (%s): its rows are read from the source", path, exc)
            continue
        records = np.frombuffer(data[: len(data) - len(data) % dtype.itemsize], dtype)
        parts.append(records[_valid(records)])
    if not parts:
        return np.empty(0, dtype)
    records = np.concatenate(parts)
    records = records[np.argsort(records["index"], kind="stable")]
    index = records["index"]
    first = np.ones(len(records), bool)
    first[1:] = index[1:] != index[:-1]
    starts = np.flatnonzero(first)
    group_first = starts[np.cumsum(first) - 1]  # each record's first record of its index
    same = (records["keys"] == records["keys"][group_first]) & (records["id"] == records["id"][group_first])
    agreed = np.logical_and.reduceat(same, starts) if len(starts) else np.empty(0, bool)
    return records[starts][agreed]


def _valid(records: npt.NDArray[np.void]) -> npt.NDArray[np.bool_]:
    import numpy as np

    index = records["index"].astype(np.uint64)
    with np.errstate(over="ignore"):
        mixed = (
            (index * np.uint64(_MIX_INDEX))
            ^ records["id"]
            ^ (records["keys"].astype(np.uint64) * np.uint64(_MIX_KEYS))
        )
    check = (mixed ^ (mixed >> np.uint64(32)) ^ np.uint64(_SALT)) & np.uint64(0xFFFFFFFF)
    return (check == records["check"]) & (records["index"] >= 0)  # type: ignore[no-any-return]


def pass_over(records: npt.NDArray[np.void], exclude: npt.NDArray[np.int64]) -> PassOver:
    """The source rows every row key of which is in ``exclude`` (packed keys, sorted), by their
    plan ``records``: what a resume need not read."""
    import numpy as np

    if not len(records) or not len(exclude):
        return PassOver.nothing()
    limit = int(exclude[-1] >> 24) + 1  # a row past the last one with an outcome is read (and nothing
    records = records[records["index"] < limit]  # is allocated for an index no outcome names)
    counts = np.bincount(exclude >> 24, minlength=limit)
    done = records[counts[records["index"]] == records["keys"]]
    return PassOver.of(done["index"], done["id"])
