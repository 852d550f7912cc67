"""A set's journal: the outcome of each of its rows, by row key, pointing at generations by digest.

``<root>/sets/<config id>/`` holds the manifest (:mod:`.manifest`), the outcome logs of every
process that worked on the set (``out-<shard>-<host>-<n>``, :mod:`.log`) with their plan records
(``plan-<shard>-<host>-<n>.bin``, :mod:`.plans`), the shard locks, and the shards' completion
markers (:mod:`eagle3_raw.run.shards`). An outcome is a row (its key, the digest of
its generation, the row's seed and attempts) or a failure (the reason, the kind, the retry epoch).

Exactly once: outcomes are never rewritten. Readers take, per key, its first row outcome (lowest
log file name, then offset); a key without one has the latest failure of the current retry epoch,
if any. Rows come out in key order, whatever order they were journaled in.

Memory: ~8 bytes per outcome for the set of done keys, ~60 while iterating; no row data.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3_raw.errors import JournalError
from eagle3_raw.journal.files import check_journal_dirs, lock_holder, make_private_dir, try_lock
from eagle3_raw.journal.log import LogKind, LogWriter, RecordReader, entry_columns, log_files
from eagle3_raw.journal.manifest import open_manifest, read_manifest, update_manifest
from eagle3_raw.journal.plans import PlanLog, plan_path, read_plans
from eagle3_raw.journal.records import (
    FAILURE,
    MAGIC_OUTCOME,
    OUT_FIXED,
    ROW,
    ROW_KEY,
    Outcome,
    decode_outcome,
    encode_outcome,
    outcome_keys,
)
from eagle3_raw.rows import RowKey

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

OUTCOME_LOG = LogKind(MAGIC_OUTCOME, OUT_FIXED.size, outcome_keys)
FAILURE_KINDS = ("failed", "skipped", "ended")
"""``failed``: may succeed if tried again (``--retry-failed``); ``skipped``: the prompt is unusable;
``ended``: a rollout turn not made because the rollout ended before it (the reason says why)."""
_NO_DIGEST = bytes(16)
_LOCK_TRIES = 20


def pack_keys(index: Any, turn: Any, sample: Any) -> Any:
    """Row keys as sortable int64s (index << 24 | turn + 1 << 12 | sample + 1); works on numpy arrays."""
    return (index << 24) | ((turn + 1) << 12) | (sample + 1)


def pack_key(key: RowKey) -> int:
    return int(pack_keys(key.index, key.turn, key.sample))


def union_keys(*arrays: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """The distinct packed keys of ``arrays``, sorted: ``np.union1d`` without its cost (numpy 2.4's
    ``unique`` takes ~0.6 s for a million int64s, a sort and a compare ~20 ms)."""
    import numpy as np

    merged = np.sort(np.concatenate([np.asarray(a, np.int64) for a in arrays]), kind="stable")
    keep = np.ones(len(merged), bool)
    np.not_equal(merged[1:], merged[:-1], out=keep[1:])
    return merged[keep]


@dataclass(frozen=True)
class Entries:
    """A snapshot of a set's outcome index files: one row per outcome, sorted by key."""

    packed: npt.NDArray[np.int64]
    digest: npt.NDArray[Any]
    kind: npt.NDArray[np.uint8]
    file: npt.NDArray[np.uint16]
    offset: npt.NDArray[np.uint64]
    length: npt.NDArray[np.uint32]
    files: list[Path]

    def first_rows(self) -> npt.NDArray[np.intp]:
        """Positions of each key's first row outcome, in key order."""
        import numpy as np

        rows = np.flatnonzero(self.kind == ROW)
        keys = self.packed[rows]
        first = np.ones(len(rows), bool)
        first[1:] = keys[1:] != keys[:-1]
        return rows[first]


class SetJournal:
    """One set's outcomes (see the module docstring): :meth:`open` writes one shard and reads all;
    :meth:`read` only reads."""

    def __init__(self, directory: Path, manifest: dict[str, Any]) -> None:
        self.directory = directory
        self.manifest = manifest
        self._writer: LogWriter | None = None
        self.plans: PlanLog | None = None
        """Where this process records the source rows it plans (None: opened read-only)."""
        self._shard_lock: int | None = None
        self._reader = RecordReader(MAGIC_OUTCOME)

    @classmethod
    def open(
        cls, directory: Path, fresh: Mapping[str, Any], *, shard: str, flush_interval: float = 1.0
    ) -> SetJournal:
        """Create or reopen ``directory`` and become the one writer of ``shard`` (``"i-of-N"``).

        Refuses (JournalError) a directory whose manifest is of another set, a shard another process
        is writing, and a directory that cannot be written or that another user could write.
        """
        make_private_dir(directory, directory.parent.parent)
        journal = cls(directory, open_manifest(directory, fresh))
        try:
            journal._shard_lock = _lock_shard(directory, shard)
            journal._writer = LogWriter(directory, f"out-{shard}", OUTCOME_LOG, flush_interval=flush_interval)
            journal.plans = PlanLog(plan_path(journal._writer.path))
        except BaseException:
            journal.close()
            raise
        return journal

    @classmethod
    def read(cls, directory: Path) -> SetJournal:
        """Open ``directory`` to read every shard, without locks and without writing anything.
        Refuses (JournalError) a folder, or a journal root, that another user owns or may write."""
        check_journal_dirs(directory, directory.parent.parent)
        manifest = read_manifest(directory)
        if manifest is None:
            raise JournalError(f"no set journal at {directory}: manifest.json is missing")
        return cls(directory, manifest)

    @property
    def writer(self) -> LogWriter:
        if self._writer is None:
            raise ValueError(f"the set journal {self.directory} was opened with read(): read-only")
        return self._writer

    @property
    def writer_or_none(self) -> LogWriter | None:
        return self._writer

    # --- writing ---------------------------------------------------------------------------------

    def add_row(self, key: RowKey, digest: bytes, info: Mapping[str, Any]) -> None:
        """Journal that ``key`` is the generation ``digest`` (``info``: source_id, sampling_seed, ...)."""
        triple = (key.index, key.turn, key.sample)
        self.writer.append(encode_outcome(triple, digest, ROW, info), ROW_KEY.pack(*triple), digest, ROW)

    def add_failure(self, key: RowKey, row_id: str, kind: str, reason: str) -> None:
        """Journal why ``key`` (row ``row_id``) did not become a row, in the current retry epoch."""
        if kind not in FAILURE_KINDS:
            raise ValueError(f"failure kind {kind!r}: expected one of {FAILURE_KINDS}")
        info = {"id": row_id, "kind": kind, "reason": reason, "epoch": self.manifest.get("retry_epoch", 0)}
        triple = (key.index, key.turn, key.sample)
        self.writer.append(
            encode_outcome(triple, _NO_DIGEST, FAILURE, info), ROW_KEY.pack(*triple), _NO_DIGEST, FAILURE
        )

    def retry_failed(self) -> None:
        """Forget every ``failed`` outcome so far (all shards): a new retry epoch, durably."""

        def bump(manifest: dict[str, Any]) -> None:
            manifest["retry_epoch"] = int(manifest.get("retry_epoch", 0)) + 1

        self.manifest = update_manifest(self.directory, bump)

    def update(self, change: Any) -> None:
        """Change the manifest (a function of the manifest dict), under its lock."""
        self.manifest = update_manifest(self.directory, change)

    def plan_records(self) -> npt.NDArray[np.void]:
        """Every shard's valid plan records (:func:`~eagle3_raw.journal.plans.read_plans`)."""
        return read_plans(self.directory)

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close_readers(self) -> None:
        self._reader.close()

    def close(self) -> None:
        try:
            if self.plans is not None:
                self.plans.close()
            if self._writer is not None:
                self._writer.close()
        finally:
            self._reader.close()
            if self._shard_lock is not None:
                with contextlib.suppress(OSError):
                    import os

                    os.close(self._shard_lock)
                self._shard_lock = None

    def __enter__(self) -> SetJournal:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- reading ---------------------------------------------------------------------------------

    def entries(self) -> Entries:
        """A snapshot of every outcome of every shard (this process's flushed first), sorted by key."""
        import numpy as np

        self.flush()
        files = log_files(self.directory, "out")
        c = entry_columns(files)
        keys = c.pop("key1").view("V16").view([("index", "<i8"), ("turn", "<i4"), ("sample", "<i4")])
        packed = pack_keys(keys["index"], keys["turn"].astype(np.int64), keys["sample"].astype(np.int64))
        del keys
        order = np.lexsort((c["offset"], c["file"], packed))  # by key, then file, then offset: first wins
        packed = packed[order]
        for name in ("key2", "kind", "file", "offset", "length"):
            c[name] = c[name][order]  # one column at a time: one copy alive, not all six
        return Entries(packed, c["key2"], c["kind"], c["file"], c["offset"], c["length"], files)

    def read_outcome(self, entries: Entries, position: int) -> Outcome:
        path = entries.files[int(entries.file[position])]
        payload = self._reader.read(path, int(entries.offset[position]), int(entries.length[position]))
        return decode_outcome(payload)

    def failures(
        self, entries: Entries | None = None, done: npt.NDArray[np.int64] | None = None
    ) -> list[dict[str, Any]]:
        """The current failure of every key that has one and no row, in key order: the latest of the
        current retry epoch (``failed``) or of any epoch (``skipped``). Each is ``{"key": RowKey,
        "id", "kind", "reason"}``."""
        import numpy as np

        entries = entries or self.entries()
        rows = entries.packed[entries.kind == ROW] if done is None else done
        epoch = self.manifest.get("retry_epoch", 0)
        latest: dict[int, dict[str, Any]] = {}
        for position in np.flatnonzero(entries.kind == FAILURE):
            outcome = self.read_outcome(entries, int(position))
            info = outcome.info
            if info.get("kind") == "failed" and info.get("epoch", 0) < epoch:
                continue
            latest[int(entries.packed[position])] = {
                "key": RowKey(outcome.index, outcome.turn, outcome.sample),
                "id": str(info.get("id", "")), "kind": str(info.get("kind")),
                "reason": str(info.get("reason", "")),
            }  # fmt: skip
        failed = np.fromiter(latest, np.int64, len(latest))
        # assume_unique skips numpy's unique (0.6 s a million); keys rows repeats may come out too,
        # which is harmless: only the keys of ``latest`` are looked up in done_set
        done_set = set(np.intersect1d(failed, rows, assume_unique=True).tolist())
        return [latest[k] for k in sorted(latest) if k not in done_set]

    def failure_counts(self, failures: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
        counts: dict[str, Counter[str]] = {kind: Counter() for kind in FAILURE_KINDS}
        for failure in failures:
            counts[failure["kind"]][failure["reason"]] += 1
        return {kind: dict(c) for kind, c in counts.items()}


def _lock_shard(directory: Path, shard: str) -> int:
    path = directory / f"shard-{shard}.lock"
    fd = try_lock(path)
    for _ in range(_LOCK_TRIES):  # a reader probing whether the shard runs holds it for an instant
        if fd is not None:
            break
        time.sleep(0.05)
        fd = try_lock(path)
    if fd is None:
        raise JournalError(
            f"another build is writing shard {shard} of the journal {directory} ({path} is locked by "
            f"{lock_holder(path)}); wait for it to finish or stop it, or run this one with another --shard"
        )
    return fd


def iter_positions(positions: npt.NDArray[np.intp], step: int) -> Iterator[npt.NDArray[np.intp]]:
    for start in range(0, len(positions), step):
        yield positions[start : start + step]
