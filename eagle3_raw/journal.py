"""Crash-safe, append-only journal of the rows a run has finished.

A journal is a directory outside the ``datasets`` cache (which deletes its ``.incomplete`` folder on
any error), one per recipe fingerprint, by default ``journal_root() / recipe.config_id``::

    manifest.json           fingerprint, recipe, server identity, history; replaced atomically
    manifest.lock           flock held while one process read-modify-writes the manifest
    rows-<shard>.bin        row records, appended by the one process that writes <shard>
    rows-<shard>.lock       flock held by that process while its Journal is open (holds its pid)
    failures-<shard>.jsonl  failure records and clear markers, one JSON object per line

**Rows file format.** A sequence of records, all integers little-endian::

    b"E3J1" | u32 payload length | u32 CRC-32 of the payload | payload
    payload = i64 index | i32 turn | i32 sample | u32 n_prompt | u32 n_output | u32 n_json
              | int32 ids[n_prompt + n_output] (prompt, then output) | JSON[n_json]
    JSON    = {"source_id", "finish_reason", "sampling_seed", "meta"}

Binary framing rather than JSON lines: the checksum tells a torn or zero-filled tail (power loss)
from a record where a JSON parser could accept a cut line; the length lets a scan index a file without
parsing rows; and the ids go to Arrow as one buffer per batch, never one Python int per token, which
keeps appending and :meth:`Journal.iter_tables` far faster than generation. The small JSON part keeps
the rest readable and extensible. The failures file is JSON lines: it is small, rare, and meant to be
read by people.

**Durability.** :meth:`Journal.append` encodes the row and buffers it; a background thread writes the
buffer every ``flush_interval`` seconds and fsyncs the file, so at most about that long of rows is at
risk; :meth:`Journal.flush` and :meth:`Journal.close` write at once. A row counts as journaled
(:meth:`Journal.done`, :meth:`Journal.iter_tables`) only after its fsync. A new file is followed by
an fsync of its directory; the manifest is replaced by write-temp, fsync, rename, fsync(directory).

**Repair.** Opening a shard for writing scans its file and cuts a torn tail (short header, short
record, bad magic, bad checksum) back to the last complete record. Damaged bytes followed by a valid
record are corruption, not a torn write: that raises JournalError instead of dropping data. Readers
stop at a torn tail without cutting it (its writer may be writing it right now).

**Exactly once.** Records are never rewritten; readers deduplicate by RowKey and the first record of
a key wins, "first" meaning the lowest (shard file name, offset). Rows come out in RowKey order,
whatever order they were appended in.

**Processes.** One process writes one shard file (flock on ``rows-<shard>.lock``; a second writer
gets JournalError). Every reader (:meth:`Journal.done`, :meth:`Journal.iter_tables`,
:meth:`Journal.failures`, :meth:`Journal.stats`) reads all shard files of the directory, so merging
shards is opening the directory with :meth:`Journal.read` and iterating.

**Errors.** An OSError while writing (ENOSPC, EFBIG, EROFS, EACCES, EIO) becomes JournalError naming
the path and the error. The partial group is truncated away at once (or cut at the next open), what
was fsync'd stays readable, and the Journal accepts no more writes.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import mmap
import os
import re
import socket
import struct
import sys
import threading
import time
import zlib
from array import array
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any

import orjson

from eagle3_raw.errors import JournalError, ServerMismatch
from eagle3_raw.rows import META_FIELDS, Row, RowKey, arrow_schema, row_id

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    import pyarrow as pa

__all__ = ["FAILURE_KINDS", "IDENTITY_KEYS", "Journal", "journal_root"]

#: Server identity keys compared on resume (those the journal recorded); other keys are kept as facts.
IDENTITY_KEYS = (
    "model_path",
    "served_model_name",
    "tokenizer_path",
    "tokenizer_hash",
    "weight_version",
    "version",
)
#: ``failed``: may succeed if tried again (``--retry-failed``); ``skipped``: the prompt is unusable.
FAILURE_KINDS = ("failed", "skipped")

FORMAT_VERSION = 1
MAGIC = b"E3J1"
MANIFEST = "manifest.json"
_HEAD = struct.Struct("<4sII")  # magic, payload length, CRC-32 of the payload
_FIXED = struct.Struct("<qiiIII")  # index, turn, sample, n_prompt, n_output, n_json
_MAX_PAYLOAD = 1 << 30
_MAX_PENDING_BYTES = 16 << 20  # past this, append() writes at once: the disk is slower than the run
_MAX_BATCH_IDS = 8 << 20  # ids per Arrow batch: bounds batch memory and keeps int32 offsets valid
_READ_BUFFER = 1 << 20
_LITTLE = sys.byteorder == "little"
_SHARD = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
_INDEX_COLUMNS = ("index", "turn", "sample", "offset", "length")
_SORT_COLUMNS = ("index", "turn", "sample", "file", "offset")

assert array("i").itemsize == 4, "the journal stores ids as 32-bit ints"

_log = logging.getLogger(__name__)
_Key = tuple[int, int, int]


def journal_root() -> Path:
    """Where journals live: ``$EAGLE3_RAW_JOURNAL_DIR``, else ``~/.cache/eagle3_raw/journals``.

    A recipe's journal is ``journal_root() / recipe.config_id`` (name plus fingerprint).
    """
    configured = os.environ.get("EAGLE3_RAW_JOURNAL_DIR")
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "eagle3_raw" / "journals"


class Journal:
    """The rows and failures of one recipe, in one directory (see the module docstring).

    :meth:`open` writes one shard and reads all; :meth:`read` only reads. Not for use after
    :meth:`close` except for reading. ``append``/``record_failure`` may be called from any thread;
    ``close`` must not race them.
    """

    def __init__(self, directory: Path, manifest: dict[str, Any], shard: str | None) -> None:
        """Use :meth:`open` or :meth:`read`."""
        self.directory = directory
        self.manifest = manifest
        self.shard = shard
        self._own: _FileIndex | None = None  # this writer's rows file; changed only under _io
        self._others: dict[str, _FileIndex] = {}  # other shards' rows files; under _scan
        self._fds: dict[str, int] = {}
        self._failures_end = 0
        self._pending: list[bytes] = []
        self._pending_keys: list[_Key] = []
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
        _make_dir(directory)
        journal = cls(directory, _open_manifest(directory, fingerprint, recipe), shard)
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
        manifest = _read_manifest(directory)
        if manifest is None:
            raise JournalError(f"no journal at {directory}: {MANIFEST} is missing")
        if fingerprint is not None:
            _check_fingerprint(directory, manifest, fingerprint)
        return cls(directory, manifest, None)

    def _start(self, flush_interval: float) -> None:
        self._fds["lock"] = _take_lock(self._path("rows", ".lock"), self.directory, str(self.shard))
        self._own, self._fds["rows"] = _open_rows(self._path("rows", ".bin"))
        self._fds["failures"], self._failures_end = _open_failures(self._path("failures", ".jsonl"))
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
        with _manifest_lock(self.directory):
            manifest = _read_manifest(self.directory) or self.manifest
            _apply_identity(manifest, dict(identity), allow_change, self.directory / MANIFEST)
            manifest["updated"] = _now()
            _write_manifest(self.directory, manifest)
        self.manifest = manifest

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
        if kind not in FAILURE_KINDS:
            raise ValueError(f"failure kind {kind!r}: expected one of {FAILURE_KINDS}")
        record = {"key": [key.index, key.turn, key.sample], "id": row_id, "kind": kind, "reason": reason}
        self._add_failure_line(record)

    def clear_failures(self, kinds: Iterable[str] = ("failed",)) -> None:
        """Forget the failures of these kinds recorded so far by any shard; durable on return.

        Appends a marker (failures are never rewritten); :meth:`failures` applies it to records
        with an earlier wall-clock time, so shards on other machines need roughly synced clocks.
        """
        kinds = sorted(set(kinds))
        if not set(kinds) <= set(FAILURE_KINDS):
            raise ValueError(f"failure kinds {kinds}: expected some of {FAILURE_KINDS}")
        self._add_failure_line({"clear": kinds})
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
            _write_all(fd, b"".join(records))
            os.fsync(fd)  # fsync point: the whole group is durable once this returns
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, good_size)  # drop the partial group now; else the next open cuts it
            self._error = JournalError(
                f"cannot write the journal file {path}: {_describe(exc)}; {len(records)} record(s) not "
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
            yield _to_table(records, schema)

    def iter_rows(self) -> Iterator[Row]:
        """Every journaled row once, in RowKey order, as :class:`Row` (like :meth:`iter_tables`)."""
        for records in self._record_batches(1000):
            yield from map(_to_row, records)

    def failures(self) -> list[dict[str, Any]]:
        """The current failure of every key that has one, in RowKey order.

        Each is ``{"key": RowKey, "id", "kind", "reason", "time"}``: the latest record for the key
        across all shards, unless a later :meth:`clear_failures` covered its kind or the key has been
        journaled as a row since.
        """
        current = _current_failures(self._failure_records())
        done = self.done()
        keys = sorted(RowKey(*key) for key in current)
        return [
            _failure_view(key, current[(key.index, key.turn, key.sample)]) for key in keys if key not in done
        ]

    def stats(self) -> dict[str, Any]:
        """Counts: ``rows``, ``duplicates`` (records beyond the first of a key), ``prompt_tokens``,
        ``generated_tokens``, ``finish_reasons`` {reason: rows}, ``failures`` {kind: {reason: n}}."""
        failures: dict[str, Counter[str]] = {kind: Counter() for kind in FAILURE_KINDS}
        for failure in self.failures():
            failures[failure["kind"]][failure["reason"]] += 1
        return {**_row_stats(self._snapshot()), "failures": {k: dict(v) for k, v in failures.items()}}

    def _record_batches(self, batch_rows: int) -> Iterator[list[_Record]]:
        if batch_rows < 1:
            raise ValueError(f"batch_rows must be at least 1, got {batch_rows}")
        batch: list[_Record] = []
        ids = 0
        with _Reader() as reader:
            for path, offset, length in _canonical(self._snapshot()):
                batch.append(reader.read(path, offset, length))
                ids += len(batch[-1].ids) // 4
                if len(batch) >= batch_rows or ids >= _MAX_BATCH_IDS:
                    yield batch
                    batch, ids = [], 0
        if batch:
            yield batch

    def _snapshot(self) -> list[_FileIndex]:
        """Copies of every shard file's index, brought up to date, in file name order."""
        files: dict[str, _FileIndex] = {}
        with self._io:
            self._flush_if_healthy()
            if self._own is not None:
                files[self._own.path.name] = self._own.copy()
        # Scanning other shards can take long: not under _io, so the flusher keeps its interval.
        with self._scan:
            for path in self.directory.glob("rows-*.bin"):
                if path.name not in files:
                    idx = self._others.setdefault(path.name, _FileIndex(path))
                    _index_file(idx)
                    files[path.name] = idx.copy()
        return [files[name] for name in sorted(files)]

    def _failure_records(self) -> list[dict[str, Any]]:
        with self._io:
            self._flush_if_healthy()
        records: list[dict[str, Any]] = []
        for path in sorted(self.directory.glob("failures-*.jsonl")):
            with _guard("read", path):
                records += _parse_failures(path.read_bytes(), path)[0]
        return records

    def _flush_if_healthy(self) -> None:
        # Readers see every row appended before the call; a failed or closed writer has nothing to add.
        if self.shard is not None and self._error is None and not self._closed:
            self._write_pending()

    def _indexed_own(self) -> _FileIndex:
        assert self._own is not None, "only a writer has its own rows file"
        return self._own

    def _path(self, kind: str, suffix: str) -> Path:
        return self.directory / f"{kind}-{self.shard}{suffix}"


# --- records ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Record:
    """A decoded rows-file record; ``ids`` are little-endian int32, prompt then output."""

    key: RowKey
    n_prompt: int
    ids: memoryview
    info: dict[str, Any]


def encode_record(row: Row) -> bytes:
    """The bytes of one rows-file record for ``row`` (see the module docstring)."""
    prompt = array("i", row.prompt_ids)
    output = array("i", row.output_ids)
    if not _LITTLE:
        prompt.byteswap()
        output.byteswap()
    info = {
        "source_id": row.source_id,
        "finish_reason": row.finish_reason,
        "sampling_seed": row.sampling_seed,
        "meta": dict(row.meta),
    }
    tail = orjson.dumps(info, option=orjson.OPT_SERIALIZE_NUMPY)
    fixed = _FIXED.pack(row.key.index, row.key.turn, row.key.sample, len(prompt), len(output), len(tail))
    payload = b"".join((fixed, prompt, output, tail))
    return _HEAD.pack(MAGIC, len(payload), zlib.crc32(payload)) + payload


def _decode(payload: memoryview) -> _Record:
    index, turn, sample, n_prompt, n_output, _ = _FIXED.unpack_from(payload)
    ids_end = _FIXED.size + 4 * (n_prompt + n_output)
    info = orjson.loads(payload[ids_end:])
    return _Record(RowKey(index, turn, sample), n_prompt, payload[_FIXED.size : ids_end], info)


def _consistent(payload: bytes | memoryview) -> bool:
    *_, n_prompt, n_output, n_json = _FIXED.unpack_from(payload)
    return bool(_FIXED.size + 4 * (n_prompt + n_output) + n_json == len(payload))


def _native_ints(data: bytes | memoryview) -> array[int]:
    ints = array("i")
    ints.frombytes(data)
    if not _LITTLE:
        ints.byteswap()
    return ints


def _row_stats(files: Sequence[_FileIndex]) -> dict[str, Any]:
    totals: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    with _Reader() as reader:
        for path, offset, _ in _canonical(files):
            n_prompt, n_output, info = reader.read_info(path, offset)
            totals.update(rows=1, prompt_tokens=n_prompt, generated_tokens=n_output)
            reasons[info["finish_reason"]] += 1
    return {
        "rows": totals["rows"],
        "duplicates": sum(map(len, files)) - totals["rows"],
        "prompt_tokens": totals["prompt_tokens"],
        "generated_tokens": totals["generated_tokens"],
        "finish_reasons": dict(reasons),
    }


def _to_row(record: _Record) -> Row:
    ids = _native_ints(record.ids).tolist()
    return Row(
        key=record.key,
        source_id=record.info["source_id"],
        prompt_ids=ids[: record.n_prompt],
        output_ids=ids[record.n_prompt :],
        finish_reason=record.info["finish_reason"],
        sampling_seed=record.info["sampling_seed"],
        meta=record.info["meta"],
    )


def _to_table(records: list[_Record], schema: pa.Schema) -> pa.Table:
    import pyarrow as pa

    arrays = {name: pa.array(values, schema.field(name).type) for name, values in _columns(records)}
    lengths = array("i", [0])
    for record in records:
        lengths.append(lengths[-1] + len(record.ids) // 4)
    offsets = pa.Array.from_buffers(pa.int32(), len(lengths), [None, pa.py_buffer(lengths)])
    ids = b"".join(record.ids for record in records)
    ids = ids if _LITTLE else _native_ints(ids).tobytes()
    mask = b"".join(b"\0" * r.n_prompt + b"\1" * (len(r.ids) // 4 - r.n_prompt) for r in records)
    arrays["input_ids"] = _list_array(offsets, ids, pa.int32())
    arrays["loss_mask"] = _list_array(offsets, mask, pa.int8())
    return pa.Table.from_arrays([arrays[name] for name in schema.names], schema=schema)


def _columns(records: list[_Record]) -> Iterator[tuple[str, list[Any]]]:
    infos = [record.info for record in records]
    yield "id", [row_id(r.info["source_id"], r.key.turn, r.key.sample) for r in records]
    yield "source_id", [info["source_id"] for info in infos]
    yield "turn", [record.key.turn for record in records]
    yield "sample", [record.key.sample for record in records]
    yield "prompt_len", [record.n_prompt for record in records]
    yield "finish_reason", [info["finish_reason"] for info in infos]
    yield "sampling_seed", [info["sampling_seed"] for info in infos]
    yield "meta", [{name: info["meta"].get(name) for name in META_FIELDS} for info in infos]


def _list_array(offsets: pa.Array, data: bytes, kind: pa.DataType) -> pa.Array:
    import pyarrow as pa

    values = pa.Array.from_buffers(kind, len(data) // kind.byte_width, [None, pa.py_buffer(data)])
    return pa.ListArray.from_arrays(offsets, values)


class _Reader:
    """Reads records by offset (pread), one descriptor per file, checking each record again."""

    def __init__(self) -> None:
        self._fds: dict[Path, int] = {}

    def __enter__(self) -> _Reader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        for fd in self._fds.values():
            os.close(fd)

    def read(self, path: Path, offset: int, length: int) -> _Record:
        with _guard("read", path):
            data = os.pread(self._fd(path), length, offset)
        payload = memoryview(data)[_HEAD.size :]
        if len(data) != length or data[:4] != MAGIC or _HEAD.unpack_from(data)[2] != zlib.crc32(payload):
            raise JournalError(f"{path}: the record at offset {offset} changed after it was indexed")
        return _decode(payload)

    def read_info(self, path: Path, offset: int) -> tuple[int, int, dict[str, Any]]:
        """(n_prompt, n_output, JSON part) of the record at ``offset``, without reading the ids."""
        with _guard("read", path):
            head = os.pread(self._fd(path), _HEAD.size + _FIXED.size, offset)
            *_, n_prompt, n_output, n_json = _FIXED.unpack_from(head, _HEAD.size)
            start = offset + len(head) + 4 * (n_prompt + n_output)
            info = orjson.loads(os.pread(self._fd(path), n_json, start))
        return n_prompt, n_output, info

    def _fd(self, path: Path) -> int:
        if path not in self._fds:
            self._fds[path] = os.open(path, os.O_RDONLY)
        return self._fds[path]


# --- indexes and scanning --------------------------------------------------------------------------


def _int64s() -> array[int]:
    return array("q")


@dataclass
class _FileIndex:
    """Where the valid records of one rows file are: 40 bytes per record, no row data."""

    path: Path
    end: int = 0  # bytes from the start known to be complete, valid records
    index: array[int] = field(default_factory=_int64s)
    turn: array[int] = field(default_factory=_int64s)
    sample: array[int] = field(default_factory=_int64s)
    offset: array[int] = field(default_factory=_int64s)
    length: array[int] = field(default_factory=_int64s)

    def add(self, key: Sequence[int], length: int) -> None:
        self.index.append(key[0])
        self.turn.append(key[1])
        self.sample.append(key[2])
        self.offset.append(self.end)
        self.length.append(length)
        self.end += length

    def copy(self) -> _FileIndex:
        columns = {name: array("q", getattr(self, name)) for name in _INDEX_COLUMNS}
        return _FileIndex(self.path, self.end, **columns)

    def nbytes(self) -> int:
        return sum(len(column) * column.itemsize for column in map(self.__getattribute__, _INDEX_COLUMNS))

    def __len__(self) -> int:
        return len(self.index)


class _BadRecord(Exception):
    """The bytes at the scan position are not a complete, valid record."""


def _index_file(idx: _FileIndex) -> str | None:
    """Index ``idx.path`` from ``idx.end`` to its end. Returns why it stopped short of the end of the
    file (a torn tail at ``idx.end``), or None. Raises JournalError if valid records follow bad bytes."""
    with _guard("read", idx.path):
        while (reason := _scan(idx)) is not None:
            verdict = _classify_tail(idx.path, idx.end)
            if verdict == "torn":
                return reason
            if verdict == "corrupt":
                raise JournalError(
                    f"{idx.path}: the record at offset {idx.end} is damaged ({reason}) but valid records "
                    "follow it, so this is not a torn write and nothing was cut. Move the file aside "
                    "(its rows will be generated again) or restore it from a copy."
                )
    return None


def _scan(idx: _FileIndex) -> str | None:
    with idx.path.open("rb", buffering=_READ_BUFFER) as f:
        f.seek(idx.end)
        while True:
            try:
                payload = _read_payload(f)
            except _BadRecord as exc:
                return str(exc)
            if payload is None:
                return None
            idx.add(_FIXED.unpack_from(payload), _HEAD.size + len(payload))


def _read_payload(f: IO[bytes]) -> bytes | None:
    head = f.read(_HEAD.size)
    if not head:
        return None
    if len(head) < _HEAD.size:
        raise _BadRecord("short header")
    magic, length, crc = _HEAD.unpack(head)
    if magic != MAGIC or not _FIXED.size <= length <= _MAX_PAYLOAD:
        raise _BadRecord("bad header")
    payload = f.read(length)
    if len(payload) < length:
        raise _BadRecord("short record")
    if zlib.crc32(payload) != crc or not _consistent(payload):
        raise _BadRecord("bad checksum")
    return payload


def _classify_tail(path: Path, start: int) -> str:
    """``grown`` if a valid record now starts at ``start`` (a writer finished it meanwhile),
    ``corrupt`` if one starts after it, else ``torn``."""
    with path.open("rb") as f:
        if os.fstat(f.fileno()).st_size <= start:
            return "torn"
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            if _record_at(mm, start):
                return "grown"
            position = mm.find(MAGIC, start + 1)
            while position >= 0:
                if _record_at(mm, position):
                    return "corrupt"
                position = mm.find(MAGIC, position + 1)
    return "torn"


def _record_at(mm: mmap.mmap, position: int) -> bool:
    if position + _HEAD.size > len(mm):
        return False
    magic, length, crc = _HEAD.unpack_from(mm, position)
    end = position + _HEAD.size + length
    if magic != MAGIC or length < _FIXED.size or end > len(mm):
        return False
    payload = mm[position + _HEAD.size : end]
    return zlib.crc32(payload) == crc and _consistent(payload)


def _canonical(files: Sequence[_FileIndex]) -> Iterator[tuple[Path, int, int]]:
    """(path, offset, length) of each key's first record (lowest file, then offset), in RowKey order.

    Memory: ~100 bytes per record while iterating (the columns, the order), no row data.
    """
    import numpy as np

    if not files:
        return
    column = {
        name: np.concatenate([_int64s_view(getattr(idx, name)) for idx in files]) for name in _INDEX_COLUMNS
    }
    column["file"] = np.concatenate([np.full(len(idx), number, np.int64) for number, idx in enumerate(files)])
    order = np.lexsort([column[name] for name in reversed(_SORT_COLUMNS)])  # the last key is primary
    first = order[_starts_of_keys([column[name][order] for name in _SORT_COLUMNS[:3]])]
    for start in range(0, len(first), 2048):
        picked = first[start : start + 2048]
        located = (column[name][picked].tolist() for name in ("file", "offset", "length"))
        for file, offset, length in zip(*located, strict=True):
            yield files[file].path, offset, length


def _int64s_view(values: array[int]) -> npt.NDArray[np.int64]:
    import numpy as np

    return np.frombuffer(values, np.int64)  # a view: the snapshot's arrays never change


def _starts_of_keys(sorted_keys: list[npt.NDArray[np.int64]]) -> npt.NDArray[np.bool_]:
    """True where a sorted key differs from the one before it (its first record)."""
    import numpy as np

    starts = np.ones(len(sorted_keys[0]), dtype=bool)
    changed = np.zeros(max(len(starts) - 1, 0), dtype=bool)
    for part in sorted_keys:
        changed |= part[1:] != part[:-1]
    starts[1:] = changed
    return starts


# --- failures --------------------------------------------------------------------------------------


def _parse_failures(data: bytes, path: Path) -> tuple[list[dict[str, Any]], int]:
    """The records of a failures file and the bytes they span. A torn last line is left out; a bad
    line followed by a good one is corruption (JournalError)."""
    lines = data.split(b"\n")  # the last item is what follows the final newline
    records: list[dict[str, Any]] = []
    end = 0
    for number, line in enumerate(lines[:-1]):
        record = _parse_line(line)
        if record is None:
            if any(_parse_line(later) is not None for later in lines[number + 1 : -1]):
                raise JournalError(f"{path}: line {number + 1} is damaged but valid lines follow it")
            break
        records.append(record)
        end += len(line) + 1
    return records, end


def _parse_line(line: bytes) -> dict[str, Any] | None:
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    return record if isinstance(record, dict) and "time" in record else None


def _current_failures(records: list[dict[str, Any]]) -> dict[_Key, dict[str, Any]]:
    latest: dict[_Key, dict[str, Any]] = {}
    clears: list[tuple[float, list[str]]] = []
    for record in records:
        if "clear" in record:
            clears.append((record["time"], record["clear"]))
            continue
        key = (record["key"][0], record["key"][1], record["key"][2])
        if key not in latest or record["time"] >= latest[key]["time"]:
            latest[key] = record

    def cleared(record: dict[str, Any]) -> bool:
        return any(record["kind"] in kinds and when >= record["time"] for when, kinds in clears)

    return {key: record for key, record in latest.items() if not cleared(record)}


def _failure_view(key: RowKey, record: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "key": key,
        "id": record["id"],
        "kind": record["kind"],
        "reason": record["reason"],
        "time": record["time"],
    }


# --- files -----------------------------------------------------------------------------------------


@contextlib.contextmanager
def _guard(action: str, path: Path) -> Iterator[None]:
    """Turn an OSError into a JournalError naming the path and the error."""
    try:
        yield
    except OSError as exc:
        raise JournalError(f"cannot {action} {path}: {_describe(exc)}") from exc


def _describe(exc: OSError) -> str:
    name = errno.errorcode.get(exc.errno or 0)
    return f"{exc.strerror} ({name})" if name and exc.strerror else str(exc)


def _make_dir(directory: Path) -> None:
    with _guard("create the journal directory", directory):
        if not directory.is_dir():
            directory.mkdir(parents=True, exist_ok=True)
            _fsync_dir(directory.parent)  # fsync point: the new directory's entry


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _open_append(path: Path) -> int:
    created = not path.exists()
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    if created:
        try:
            _fsync_dir(path.parent)  # fsync point: the new file's directory entry
        except BaseException:
            os.close(fd)
            raise
    return fd


def _open_rows(path: Path) -> tuple[_FileIndex, int]:
    """Index this shard's rows file, cut a torn tail, and open it for appending."""
    with _guard("open", path):
        fd = _open_append(path)
    try:
        idx = _FileIndex(path)
        reason = _index_file(idx)
        if reason is not None:
            _cut(fd, path, idx.end, reason)
    except BaseException:
        os.close(fd)
        raise
    return idx, fd


def _open_failures(path: Path) -> tuple[int, int]:
    """Open this shard's failures file for appending, cutting a torn last line. (fd, valid size)."""
    with _guard("open", path):
        fd = _open_append(path)
    try:
        with _guard("read", path):
            data = path.read_bytes()
        end = _parse_failures(data, path)[1]
        if end < len(data):
            _cut(fd, path, end, "torn last line")
    except BaseException:
        os.close(fd)
        raise
    return fd, end


def _cut(fd: int, path: Path, end: int, reason: str) -> None:
    with _guard("repair", path):
        size = os.fstat(fd).st_size
        _log.warning(
            "journal file %s: cutting a torn tail (%s) of %d bytes at offset %d",
            path,
            reason,
            size - end,
            end,
        )
        os.ftruncate(fd, end)
        os.fsync(fd)  # fsync point: the cut is durable before new records follow it


def _take_lock(path: Path, directory: Path, shard: str) -> int:
    with _guard("open the lock file", path):
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        _lock_or_refuse(fd, path, directory, shard)
        with _guard("write the lock file", path):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _lock_or_refuse(fd: int, path: Path, directory: Path, shard: str) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
        raise JournalError(
            f"another build is writing shard {shard} of the journal {directory} ({path} is locked by "
            f"{holder}); wait for it to finish or stop it, or run this one with another --shard"
        ) from None
    except OSError as exc:
        raise JournalError(f"cannot lock {path}: {_describe(exc)}") from exc


# --- manifest --------------------------------------------------------------------------------------


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _read_manifest(directory: Path) -> dict[str, Any] | None:
    path = directory / MANIFEST
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise JournalError(f"cannot read {path}: {_describe(exc)}") from exc
    try:
        manifest = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise JournalError(f"cannot read {path}: not valid JSON ({exc})") from exc
    if not isinstance(manifest, dict) or manifest.get("format", 0) > FORMAT_VERSION:
        raise JournalError(f"{path} is not a manifest this version of eagle3_raw can read")
    return manifest


def _open_manifest(directory: Path, fingerprint: str, recipe: Mapping[str, Any]) -> dict[str, Any]:
    """The directory's manifest, created if missing, checked against ``fingerprint``, stamped."""
    with _manifest_lock(directory):
        for stale in directory.glob(f".{MANIFEST}.*.tmp"):  # left by a crash mid-write; we hold the lock
            with _guard("remove", stale):
                stale.unlink()
        manifest = _read_manifest(directory) or _new_manifest(directory, fingerprint, recipe)
        _check_fingerprint(directory, manifest, fingerprint)
        manifest["updated"] = _now()
        _write_manifest(directory, manifest)
    return manifest


def _new_manifest(directory: Path, fingerprint: str, recipe: Mapping[str, Any]) -> dict[str, Any]:
    if any(directory.glob("rows-*.bin")):
        raise JournalError(f"{directory} holds rows files but no {MANIFEST}; refusing to adopt it")
    return {
        "format": FORMAT_VERSION,
        "fingerprint": fingerprint,
        "recipe": dict(recipe),
        "server": None,
        "created": _now(),
        "history": [],
    }


def _check_fingerprint(directory: Path, manifest: Mapping[str, Any], fingerprint: str) -> None:
    if manifest.get("fingerprint") == fingerprint:
        return
    name = (manifest.get("recipe") or {}).get("name", "?")
    raise JournalError(
        f"the journal {directory} holds rows of recipe {name!r} with fingerprint "
        f"{manifest.get('fingerprint')}, not {fingerprint}; a changed recipe gets its own journal "
        "(<name>-<fingerprint>), so use that directory or move this one aside"
    )


@contextlib.contextmanager
def _manifest_lock(directory: Path) -> Iterator[None]:
    path = directory / "manifest.lock"
    with _guard("open the lock file", path):
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        with _guard("lock", path):
            fcntl.flock(fd, fcntl.LOCK_EX)  # held for one read-modify-write: shards share the manifest
        yield
    finally:
        os.close(fd)


def _write_manifest(directory: Path, manifest: Mapping[str, Any]) -> None:
    path = directory / MANIFEST
    data = orjson.dumps(manifest, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS, default=str)
    temporary = directory / f".{MANIFEST}.{os.getpid()}.tmp"
    with _guard("write", path):
        try:
            _write_file(temporary, data)
            os.replace(temporary, path)
        except BaseException:
            with contextlib.suppress(OSError):
                temporary.unlink()
            raise
        _fsync_dir(directory)  # fsync point: the rename itself


def _write_file(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _write_all(fd, data)
        os.fsync(fd)  # fsync point: the content is durable before a rename publishes it
    finally:
        os.close(fd)


def _apply_identity(
    manifest: dict[str, Any], identity: dict[str, Any], allow_change: bool, path: Path
) -> None:
    recorded = manifest.get("server")
    differences = identity_differences(recorded, identity) if recorded else {}
    if differences and not allow_change:
        raise ServerMismatch(_mismatch_message(path, differences))
    if differences:
        changes = {key: {"recorded": old, "now": new} for key, (old, new) in differences.items()}
        manifest.setdefault("history", []).append(
            {"event": "allow-server-change", "time": _now(), "changes": changes, "previous": recorded}
        )
    if differences or not recorded:
        manifest["server"] = identity


def identity_differences(
    recorded: Mapping[str, Any], identity: Mapping[str, Any]
) -> dict[str, tuple[Any, Any]]:
    """{key: (recorded, now)} for each :data:`IDENTITY_KEYS` key ``recorded`` has and ``identity``
    does not match (a key missing now counts as a difference)."""
    keys = [key for key in IDENTITY_KEYS if key in recorded]
    return {key: (recorded[key], identity.get(key)) for key in keys if recorded[key] != identity.get(key)}


def _mismatch_message(path: Path, differences: Mapping[str, tuple[Any, Any]]) -> str:
    lines = [
        f"  {key}: journal has {old!r}, server now reports {new!r}" for key, (old, new) in differences.items()
    ]
    return "\n".join(
        [
            f"the server differs from the one that generated the rows journaled in {path.parent}:",
            *lines,
            "Rows from two models or tokenizers would make an inconsistent set. Point the build at the "
            "original server, or rerun with --allow-server-change to go on anyway (the change is recorded "
            f"in the history of {path}).",
        ]
    )
