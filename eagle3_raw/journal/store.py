"""The :class:`Journal`: one recipe's rows and failures in one directory, and where journals live.

It ties the parts together: the record format (:mod:`.records`), rows-file indexes and repair
(:mod:`.index`), the failures files (:mod:`.failures`) and the manifest (:mod:`.manifest`). See
:mod:`eagle3_raw.journal` for the directory layout and the guarantees.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import orjson

from eagle3_raw.errors import JournalError
from eagle3_raw.journal.failures import (
    FAILURE_KINDS,
    clear_record,
    current_failures,
    failure_record,
    open_failures,
    read_failures,
)
from eagle3_raw.journal.files import describe, make_dir, take_lock, write_all
from eagle3_raw.journal.index import FileIndex, index_file, open_rows, record_batches, row_stats
from eagle3_raw.journal.manifest import (
    MANIFEST,
    check_fingerprint,
    open_manifest,
    read_manifest,
    update_identity,
)
from eagle3_raw.journal.records import Key, Record, encode_record, to_row, to_table
from eagle3_raw.rows import Row, RowKey, arrow_schema

if TYPE_CHECKING:
    import pyarrow as pa

_MAX_PENDING_BYTES = 16 << 20  # past this, append() writes at once: the disk is slower than the run
_SHARD = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")

_log = logging.getLogger("eagle3_raw.journal")


def journal_root() -> Path:
    """Where journals live: ``$EAGLE3_RAW_JOURNAL_DIR``, else ``~/.cache/eagle3_raw/journals``.

    A recipe's journal is ``journal_root() / recipe.config_id`` (name plus fingerprint).
    """
    configured = os.environ.get("EAGLE3_RAW_JOURNAL_DIR")
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "eagle3_raw" / "journals"


class Journal:
    """The rows and failures of one recipe, in one directory (see :mod:`eagle3_raw.journal`).

    :meth:`open` writes one shard and reads all; :meth:`read` only reads. Not for use after
    :meth:`close` except for reading. ``append``/``record_failure`` may be called from any thread;
    ``close`` must not race them.
    """

    def __init__(self, directory: Path, manifest: dict[str, Any], shard: str | None) -> None:
        """Use :meth:`open` or :meth:`read`."""
        self.directory = directory
        self.manifest = manifest
        self.shard = shard
        self._own: FileIndex | None = None  # this writer's rows file; changed only under _io
        self._others: dict[str, FileIndex] = {}  # other shards' rows files; under _scan
        self._fds: dict[str, int] = {}
        self._failures_end = 0
        self._pending: list[bytes] = []
        self._pending_keys: list[Key] = []
        self._pending_failures: list[bytes] = []
        self._pending_bytes = 0
        self._state = threading.Lock()  # guards the pending lists and the clock
        self._io = threading.RLock()  # one thread at a time writes files and updates _own
        self._scan = threading.Lock()
        self._stop = threading.Event()
        self._flusher: threading.Thread | None = None
        self._error: JournalError | None = None
        self._error_reported = False
        self._closed = False
        self._last_time = 0.0

    # --- opening and closing -------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        directory: Path | str,
        *,
        fingerprint: str,
        recipe: Mapping[str, Any],
        shard: str = "0-of-1",
        flush_interval: float = 1.0,
    ) -> Journal:
        """Create or reopen ``directory`` and become the one writer of ``shard``.

        Creates the manifest (fingerprint, recipe) if there is none; refuses, with JournalError, a
        directory whose manifest has another fingerprint, a shard another process is writing, and a
        directory that cannot be written. Repairs a torn tail of this shard's files.
        """
        if not _SHARD.match(shard):
            raise ValueError(f"shard name {shard!r}: expected letters, digits, '.', '_', '-'")
        if flush_interval <= 0:
            raise ValueError(f"flush_interval must be positive, got {flush_interval!r}")
        directory = Path(directory)
        make_dir(directory)
        journal = cls(directory, open_manifest(directory, fingerprint, recipe), shard)
        try:
            journal._start(flush_interval)
        except BaseException:
            journal._release()
            raise
        return journal

    @classmethod
    def read(cls, directory: Path | str, *, fingerprint: str | None = None) -> Journal:
        """Open ``directory`` to read every shard, without locks and without writing anything."""
        directory = Path(directory)
        manifest = read_manifest(directory)
        if manifest is None:
            raise JournalError(f"no journal at {directory}: {MANIFEST} is missing")
        if fingerprint is not None:
            check_fingerprint(directory, manifest, fingerprint)
        return cls(directory, manifest, None)

    def _start(self, flush_interval: float) -> None:
        self._fds["lock"] = take_lock(self._path("rows", ".lock"), self.directory, str(self.shard))
        self._own, self._fds["rows"] = open_rows(self._path("rows", ".bin"))
        self._fds["failures"], self._failures_end = open_failures(self._path("failures", ".jsonl"))
        self._flusher = threading.Thread(
            target=self._flush_loop, args=(flush_interval,), name=f"journal-{self.shard}", daemon=True
        )
        self._flusher.start()

    def close(self) -> None:
        """Write and fsync what is pending, stop the flusher, release the shard lock.

        Raises JournalError if that last write fails, or if a background write failed and no call
        has raised it yet. Idempotent.
        """
        if self._closed:
            return
        self._stop.set()
        if self._flusher is not None:
            self._flusher.join()
        try:
            self._final_write()
        finally:
            self._closed = True
            self._release()

    def _final_write(self) -> None:
        if self.shard is None or (self._error is not None and self._error_reported):
            return
        self._raise_error()
        self._write_pending()

    def _release(self) -> None:
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)  # closing the lock file releases the shard lock
        self._fds.clear()

    def __enter__(self) -> Journal:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None:
            self.close()
            return
        try:
            self.close()
        except JournalError:  # the exception already propagating is the one to see
            _log.exception("journal %s: closing after an error failed too", self.directory)

    # --- identity --------------------------------------------------------------------------------

    def set_server_identity(self, identity: Mapping[str, Any], *, allow_change: bool) -> None:
        """Record the server identity the first time; later, compare it with the recorded one.

        Compared: the :data:`IDENTITY_KEYS` the journal recorded. A difference raises ServerMismatch
        naming each key with both values and how to go on (``--allow-server-change``), unless
        ``allow_change``: then the new identity is recorded and the change appended to
        ``manifest["history"]``.
        """
        self._check_writable()
        self.manifest = update_identity(self.directory, self.manifest, identity, allow_change=allow_change)

    # --- writing ---------------------------------------------------------------------------------

    def append(self, row: Row) -> None:
        """Journal ``row``: durable within about ``flush_interval`` seconds, at once on flush()/close().

        Raises JournalError if an earlier write failed (no later append succeeds then). ``row.meta``
        must be JSON-serializable and the ids must fit int32.
        """
        record = encode_record(row)
        self._check_writable()
        with self._state:
            self._pending.append(record)
            self._pending_keys.append((row.key.index, row.key.turn, row.key.sample))
            self._pending_bytes += len(record)
            full = self._pending_bytes >= _MAX_PENDING_BYTES
        if full:
            self.flush()

    def record_failure(self, key: RowKey, row_id: str, kind: str, reason: str) -> None:
        """Record that ``key`` (row ``row_id``) could not become a row; written with the next group.

        ``kind`` is ``failed`` (tried again by ``--retry-failed``) or ``skipped``.
        """
        self._add_failure_line(failure_record(key, row_id, kind, reason))

    def clear_failures(self, kinds: Iterable[str] = ("failed",)) -> None:
        """Forget the failures of these kinds recorded so far by any shard; durable on return.

        Appends a marker (failures are never rewritten); :meth:`failures` applies it to records
        with an earlier wall-clock time, so shards on other machines need roughly synced clocks.
        """
        self._add_failure_line(clear_record(kinds))
        self.flush()

    def _add_failure_line(self, record: dict[str, Any]) -> None:
        self._check_writable()
        with self._state:
            # Strictly increasing in this process, so a clear marker sorts after what it clears.
            self._last_time = record["time"] = max(time.time(), self._last_time + 1e-6)
            line = orjson.dumps(record) + b"\n"
            self._pending_failures.append(line)
            self._pending_bytes += len(line)

    def flush(self) -> None:
        """Write and fsync every appended row and failure now. Raises JournalError on failure."""
        self._check_writable()
        self._write_pending()

    def _flush_loop(self, interval: float) -> None:
        # Runs beside the caller's threads; they only touch the pending lists (under _state).
        while not self._stop.wait(interval):
            try:
                self._write_pending()
            except Exception as exc:  # kept in _error; the next append/flush/close raises it
                if self._error is None:
                    self._error = JournalError(f"journal {self.directory}: background write failed: {exc!r}")
                return

    def _write_pending(self) -> None:
        with self._io:
            self._raise_error()
            with self._state:
                rows, keys, failures = self._pending, self._pending_keys, self._pending_failures
                self._pending, self._pending_keys, self._pending_failures = [], [], []
                self._pending_bytes = 0
            if rows:
                own = self._indexed_own()
                self._commit("rows", own.path, own.end, rows)
                for key, record in zip(keys, rows, strict=True):
                    own.add(key, len(record))  # indexed (= journaled) only after the fsync
            if failures:
                self._commit("failures", self._path("failures", ".jsonl"), self._failures_end, failures)
                self._failures_end += sum(map(len, failures))

    def _commit(self, name: str, path: Path, good_size: int, records: list[bytes]) -> None:
        fd = self._fds[name]
        try:
            write_all(fd, b"".join(records))
            os.fsync(fd)  # fsync point: the whole group is durable once this returns
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, good_size)  # drop the partial group now; else the next open cuts it
            self._error = JournalError(
                f"cannot write the journal file {path}: {describe(exc)}; {len(records)} record(s) not "
                "written. Everything written before stays readable; free space or fix permissions, "
                "then run the build again to resume."
            )
            self._note_raised()
            raise self._error from exc

    def _check_writable(self) -> None:
        if self.shard is None:
            raise ValueError(f"journal {self.directory} was opened with Journal.read(): read-only")
        if self._closed:
            raise ValueError(f"journal {self.directory} is closed")
        self._raise_error()

    def _raise_error(self) -> None:
        if self._error is not None:
            self._note_raised()
            raise JournalError(str(self._error)) from self._error.__cause__

    def _note_raised(self) -> None:
        # close() raises a write error only if no call has raised it to the caller yet.
        if threading.current_thread() is not self._flusher:
            self._error_reported = True

    # --- reading ---------------------------------------------------------------------------------

    def done(self) -> set[RowKey]:
        """The key of every row journaled by any shard file of the directory (flushes first)."""
        keys: set[RowKey] = set()
        for idx in self._snapshot():
            keys.update(map(RowKey, idx.index, idx.turn, idx.sample))
        return keys

    def iter_tables(self, batch_rows: int = 1000) -> Iterator[pa.Table]:
        """Every journaled row once, in RowKey order, as tables in ``rows.arrow_schema()``.

        Reads all shard files (the first record of a key wins) from a snapshot taken when iteration
        starts (flushing first). Tables hold at most ``batch_rows`` rows (fewer if their ids are
        very many). Memory: ~100 bytes per record for the sorted index, plus one batch.
        """
        schema = arrow_schema()
        for records in self._record_batches(batch_rows):
            yield to_table(records, schema)

    def iter_rows(self) -> Iterator[Row]:
        """Every journaled row once, in RowKey order, as :class:`Row` (like :meth:`iter_tables`)."""
        for records in self._record_batches(1000):
            yield from map(to_row, records)

    def failures(self) -> list[dict[str, Any]]:
        """The current failure of every key that has one, in RowKey order.

        Each is ``{"key": RowKey, "id", "kind", "reason", "time"}``: the latest record for the key
        across all shards, unless a later :meth:`clear_failures` covered its kind or the key has been
        journaled as a row since.
        """
        records = self._failure_records()
        return current_failures(records, self.done())

    def stats(self) -> dict[str, Any]:
        """Counts: ``rows``, ``duplicates`` (records beyond the first of a key), ``prompt_tokens``,
        ``generated_tokens``, ``finish_reasons`` {reason: rows}, ``failures`` {kind: {reason: n}}."""
        failures: dict[str, Counter[str]] = {kind: Counter() for kind in FAILURE_KINDS}
        for failure in self.failures():
            failures[failure["kind"]][failure["reason"]] += 1
        return {**row_stats(self._snapshot()), "failures": {k: dict(v) for k, v in failures.items()}}

    def _record_batches(self, batch_rows: int) -> Iterator[list[Record]]:
        if batch_rows < 1:
            raise ValueError(f"batch_rows must be at least 1, got {batch_rows}")
        yield from record_batches(self._snapshot(), batch_rows)

    def _snapshot(self) -> list[FileIndex]:
        """Copies of every shard file's index, brought up to date, in file name order."""
        files: dict[str, FileIndex] = {}
        with self._io:
            self._flush_if_healthy()
            if self._own is not None:
                files[self._own.path.name] = self._own.copy()
        # Scanning other shards can take long: not under _io, so the flusher keeps its interval.
        with self._scan:
            for path in self.directory.glob("rows-*.bin"):
                if path.name not in files:
                    idx = self._others.setdefault(path.name, FileIndex(path))
                    index_file(idx)
                    files[path.name] = idx.copy()
        return [files[name] for name in sorted(files)]

    def _failure_records(self) -> list[dict[str, Any]]:
        with self._io:
            self._flush_if_healthy()
        return read_failures(self.directory)

    def _flush_if_healthy(self) -> None:
        # Readers see every row appended before the call; a failed or closed writer has nothing to add.
        if self.shard is not None and self._error is None and not self._closed:
            self._write_pending()

    def _indexed_own(self) -> FileIndex:
        assert self._own is not None, "only a writer has its own rows file"
        return self._own

    def _path(self, kind: str, suffix: str) -> Path:
        return self.directory / f"{kind}-{self.shard}{suffix}"
