"""Append-only logs with one writer each: a data file of framed records and an index file beside it.

A log is ``<prefix>-<host>-<n>.bin`` (the records), ``.idx`` (one 48-byte entry per record: two
16-byte keys, the record's offset and type, its length, a check word) and ``.lock`` (held by the
one process that writes it). Writers only ever open logs named after their own host, so on a
shared filesystem no host writes, cuts or deletes another host's files.

**Commit order.** The writer appends a group of records to the data file and fsyncs it, then
appends their entries to the index and fsyncs that. An entry exists only for a durable record, so
the index is the log's commit point: readers (:func:`read_entries`) look at the index alone and
never see a record being written, even through NFS's loose ordering. A reader stops at the first
entry that fails its check (a writer's torn tail, or NFS showing a page late) without calling it
damage; only the writer judges its own files.

**Recovery.** A writer adopting a log left by a dead process (same host, lock free) cuts a torn
index tail, indexes durable records that have no entry yet (a crash between the two fsyncs), and
cuts a torn data tail back to the last complete record. Damaged bytes followed by a valid record
are corruption, not a torn write: JournalError, nothing cut.

**Full disks.** A write that fails for lack of space (ENOSPC, EDQUOT) is undone and kept: the
records stay pending and the next flush tries again, so nothing generated is lost while space
comes back (:attr:`LogWriter.full_since` says since when; :meth:`LogWriter.held` how many). What
is still pending when the writer closes can be taken out first (:meth:`LogWriter.take_pending`)
and kept elsewhere (:mod:`.spill`). Other write errors stop the log (JournalError on the next call).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import mmap
import os
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3_raw.errors import JournalError
from eagle3_raw.journal.files import (
    cut,
    describe,
    guard,
    host_name,
    open_append,
    open_read,
    read_bytes,
    try_lock,
    write_all,
)
from eagle3_raw.journal.records import HEAD, BadRecord, checked_payload, read_payload, record_at

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

ENTRY = struct.Struct("<16s16sQII")  # key1, key2, offset << 8 | type, length, check word
_CHECKED_WORDS = 11  # the check word covers the first 44 bytes
_CHECK_CHUNK = 8192
_READ_BUFFER = 1 << 20
_FULL_DISK = frozenset({errno.ENOSPC, errno.EDQUOT})


@dataclass(frozen=True)
class LogKind:
    """What a log holds: its records' magic, their smallest payload, and how to read an entry's
    keys back from a payload (None: not a payload of this kind)."""

    magic: bytes
    minimum: int
    keys: Callable[[bytes], tuple[bytes, bytes, int] | None]


def entry_dtype() -> np.dtype[np.void]:
    import numpy as np

    return np.dtype([("key1", "V16"), ("key2", "V16"), ("pos", "<u8"), ("length", "<u4"), ("check", "<u4")])


def encode_entry(key1: bytes, key2: bytes, offset: int, kind: int, length: int) -> bytes:
    head = ENTRY.pack(key1, key2, offset << 8 | kind, length, 0)[: 4 * _CHECKED_WORDS]
    return head + struct.pack("<I", _check(struct.unpack(f"<{_CHECKED_WORDS}I", head)))


def _check(words: tuple[int, ...]) -> int:
    total = 0x9E3779B9
    for position, word in enumerate(words):
        total = (total + word * (2 * position + 0x01000193)) & 0xFFFFFFFF
    return total


def read_entries(path: Path) -> npt.NDArray[np.void]:
    """The valid entries of the index file ``path`` (a structured array, see :func:`entry_dtype`),
    stopping at the first that fails its check or is cut short; empty when the file is missing."""
    import numpy as np

    try:
        data = read_bytes(path)
    except FileNotFoundError:
        return np.zeros(0, entry_dtype())
    except OSError as exc:
        raise JournalError(f"cannot read {path}: {describe(exc)}") from exc
    return np.frombuffer(data, entry_dtype(), count=valid_entries(data))


def valid_entries(data: bytes) -> int:
    """How many whole, checked entries ``data`` starts with."""
    import numpy as np

    count = len(data) // ENTRY.size
    words = np.frombuffer(data, "<u4", count=count * ENTRY.size // 4).reshape(count, ENTRY.size // 4)
    weights = 2 * np.arange(_CHECKED_WORDS, dtype=np.uint64) + 0x01000193
    for start in range(0, count, _CHECK_CHUNK):  # in chunks: the uint64 products are 88 bytes an entry
        chunk = words[start : start + _CHECK_CHUNK]
        sums = (chunk[:, :_CHECKED_WORDS].astype(np.uint64) * weights).sum(axis=1, dtype=np.uint64)
        bad = np.flatnonzero(((sums + 0x9E3779B9) & 0xFFFFFFFF) != chunk[:, _CHECKED_WORDS])
        if len(bad):
            return start + int(bad[0])
    return count


def entry_columns(paths: list[Path]) -> dict[str, npt.NDArray[Any]]:
    """The columns of the index files ``paths`` (their data files' ``.idx``), concatenated: ``key1``,
    ``key2`` (``S16``), ``file`` (position in ``paths``), ``offset``, ``kind``, ``length``.

    Each index is read up to the size it had when this began, in chunks, into columns allocated
    once: ~47 bytes an entry, and one chunk's bytes besides."""
    import numpy as np

    sizes = [_index_size(path.with_suffix(".idx")) for path in paths]
    total = sum(size // ENTRY.size for size in sizes)
    types = {"key1": "S16", "key2": "S16", "file": "u2", "offset": "u8", "kind": "u1", "length": "u4"}
    columns = {name: np.empty(total, np.dtype(kind)) for name, kind in types.items()}
    filled = 0
    for number, (path, size) in enumerate(zip(paths, sizes, strict=True)):
        for entries in _entry_chunks(path.with_suffix(".idx"), size):
            span = slice(filled, filled + len(entries))
            columns["offset"][span], columns["kind"][span] = entry_offsets(entries)
            columns["key1"][span] = entries["key1"].view("S16")
            columns["key2"][span] = entries["key2"].view("S16")
            columns["file"][span] = number
            columns["length"][span] = entries["length"]
            filled += len(entries)
    return {name: column[:filled] for name, column in columns.items()}


def _index_size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0
    except OSError as exc:
        raise JournalError(f"cannot read {path}: {describe(exc)}") from exc


def _entry_chunks(path: Path, size: int) -> Iterator[npt.NDArray[np.void]]:
    """The valid entries of the index ``path`` in its first ``size`` bytes, a chunk at a time,
    stopping at the first that fails its check (as :func:`read_entries`)."""
    import numpy as np

    step = _CHECK_CHUNK * 8 * ENTRY.size
    for start in range(0, size - size % ENTRY.size, step):
        try:
            data = read_bytes(path, start, min(step, size - start))
        except FileNotFoundError:
            return
        except OSError as exc:
            raise JournalError(f"cannot read {path}: {describe(exc)}") from exc
        count = valid_entries(data)
        yield np.frombuffer(data, entry_dtype(), count=count)
        if count * ENTRY.size < min(step, size - start):  # a bad entry, or the file got shorter
            return


def entry_offsets(entries: npt.NDArray[np.void]) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint8]]:
    """(offsets, types) of ``entries``."""
    import numpy as np

    pos = entries["pos"]
    return pos >> np.uint64(8), (pos & np.uint64(0xFF)).astype(np.uint8)


def log_files(directory: Path, prefix: str) -> list[Path]:
    """The data files of the logs named ``<prefix>-*`` in ``directory``, in name order."""
    return sorted(p for p in directory.glob(f"{prefix}-*.bin") if not p.is_symlink())


class RecordReader:
    """Reads records back by (path, offset, length), one descriptor per file, checking each again."""

    def __init__(self, magic: bytes) -> None:
        self._magic = magic
        self._fds: dict[Path, int] = {}

    def __enter__(self) -> RecordReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def pread(self, path: Path, length: int, offset: int) -> bytes:
        """``length`` bytes of ``path`` at ``offset``, unchecked, on this reader's descriptor."""
        fd = self._fds.get(path)
        if fd is None:
            with guard("read", path):
                fd = self._fds[path] = open_read(path)
        try:  # not guard(): a context manager per record costs a third of reading one
            return os.pread(fd, length, offset)
        except OSError as exc:
            raise JournalError(f"cannot read {path}: {describe(exc)}") from exc

    def read(self, path: Path, offset: int, length: int) -> memoryview:
        """The checked payload of the record at ``offset``; JournalError if it is not one any more."""
        data = self.pread(path, length, offset)
        payload = checked_payload(data, length, self._magic)
        if payload is None:
            raise JournalError(f"{path}: the record at offset {offset} changed after it was indexed")
        return payload


class LogWriter:
    """The one writer of a log (see the module docstring). ``append`` may be called from any
    thread; a background thread flushes every ``flush_interval`` seconds."""

    def __init__(self, directory: Path, prefix: str, kind: LogKind, *, flush_interval: float = 1.0) -> None:
        self.kind = kind
        self.prefix = prefix
        self.path, self._lock_fd = _claim(directory, prefix)
        self.index_path = self.path.with_suffix(".idx")
        self._fds: dict[str, int] = {"lock": self._lock_fd}
        self._pending: list[tuple[bytes, bytes, bytes, int]] = []  # record, key1, key2, type
        self._written: list[bytes] = []  # entries of durable records, not yet in the index
        self._pending_bytes = 0
        self._state = threading.Lock()  # the pending lists
        self._io = threading.RLock()  # one thread at a time writes the files
        self._error: JournalError | None = None
        self.full_since: float | None = None
        """When writes started failing for lack of space (None: they do not)."""
        self._stop = threading.Event()
        try:
            self._open_files()
        except BaseException:
            self._release()
            raise
        self._flusher = threading.Thread(
            target=self._flush_loop, args=(flush_interval,), name=f"journal-{self.path.name}", daemon=True
        )
        self._flusher.start()

    # --- opening ---------------------------------------------------------------------------------

    def _open_files(self) -> None:
        with guard("open", self.path):
            self._fds["data"] = open_append(self.path)
            self._fds["index"] = open_append(self.index_path)
        self._recover()

    def _recover(self) -> None:
        """Cut a torn index tail, index durable records without an entry, cut a torn data tail."""
        with guard("read", self.index_path):
            data = read_bytes(self.index_path)
        self.entries = valid_entries(data)
        if self.entries * ENTRY.size < len(data):
            cut(self._fds["index"], self.index_path, self.entries * ENTRY.size, "torn index entry")
        self.end = _end_of(data, self.entries)
        with guard("read", self.path):
            size = os.fstat(self._fds["data"]).st_size
        if size < self.end:
            raise JournalError(
                f"{self.path} is shorter ({size} bytes) than its index says ({self.end}): it was cut "
                "or replaced"
            )
        found, self.end = self._scan_unindexed(self.end)
        if found:
            with guard("write", self.index_path):
                self._write_entries(found)

    def _scan_unindexed(self, start: int) -> tuple[list[bytes], int]:
        entries: list[bytes] = []
        end = start
        with guard("read", self.path), open(self.path, "rb", buffering=_READ_BUFFER) as f:
            f.seek(start)
            while True:
                try:
                    payload = read_payload(f, self.kind.magic, self.kind.minimum)
                except BadRecord as exc:
                    self._cut_or_refuse(end, str(exc))
                    break
                if payload is None:
                    break
                keys = self.kind.keys(payload)
                if keys is None:
                    self._cut_or_refuse(end, "inconsistent lengths")
                    break
                length = HEAD.size + len(payload)
                entries.append(encode_entry(keys[0], keys[1], end, keys[2], length))
                end += length
        return entries, end

    def _cut_or_refuse(self, end: int, reason: str) -> None:
        if _valid_record_after(self.path, end, self.kind):
            raise JournalError(
                f"{self.path}: the record at offset {end} is damaged ({reason}) but valid records follow "
                "it, so this is not a torn write and nothing was cut. To keep every record before the "
                f"damage, copy the file aside and run: truncate -s {end} {self.path} (the rows after it "
                "will be generated again); or restore it from a copy."
            )
        cut(self._fds["data"], self.path, end, reason)

    # --- writing ---------------------------------------------------------------------------------

    def append(self, record: bytes, key1: bytes, key2: bytes, kind: int) -> None:
        """Queue ``record`` (framed); durable within about ``flush_interval`` s, at once on flush()."""
        self._raise_error()
        with self._state:
            self._pending.append((record, key1, key2, kind))
            self._pending_bytes += len(record)

    @property
    def pending_bytes(self) -> int:
        return self._pending_bytes

    def held(self, kind: int) -> int:
        """How many records of type ``kind`` are appended and not written yet."""
        with self._state:
            return sum(1 for pending in self._pending if pending[3] == kind)

    def take_pending(self) -> list[tuple[bytes, bytes, bytes, int]]:
        """Remove and return the records not written yet (record, key1, key2, type), in order; the
        caller keeps them elsewhere (a spill log) or appends them back."""
        with self._io, self._state:
            pending, self._pending = self._pending, []
            self._pending_bytes -= sum(len(p[0]) for p in pending)
        return pending

    def flush(self) -> None:
        """Write and fsync everything appended so far. JournalError if that fails (a full disk too:
        the records stay pending and a later flush tries again)."""
        with self._io:
            self._raise_error()
            self._write_pending()
            if self.full_since is not None:
                raise JournalError(f"cannot write {self.path}: no space left on the journal's disk")

    def _flush_loop(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                with self._io:
                    if self._error is None:
                        self._write_pending()
            except Exception as exc:  # kept; the next append/flush/close raises it
                if self._error is None:
                    self._error = JournalError(f"journal {self.path}: background write failed: {exc!r}")
                return

    def _write_pending(self) -> None:
        with self._state:
            pending, self._pending = self._pending, []
        if pending:
            try:
                self._write_records(pending)
            except OSError as exc:
                self._keep(pending, exc)
                return
        if self._written:
            try:
                self._write_entries(self._written)
            except OSError as exc:
                self._keep([], exc)
                return
            self._written = []
        self.full_since = None

    def _write_records(self, pending: list[tuple[bytes, bytes, bytes, int]]) -> None:
        fd, offset, entries = self._fds["data"], self.end, []
        for record, key1, key2, kind in pending:
            entries.append(encode_entry(key1, key2, offset, kind, len(record)))
            offset += len(record)
        try:
            write_all(fd, b"".join(p[0] for p in pending))
            os.fsync(fd)  # fsync point: records are durable before their entries exist
        except OSError:
            _truncate_quietly(fd, self.end)
            raise
        self.end = offset
        self._written.extend(entries)
        with self._state:
            self._pending_bytes -= sum(len(p[0]) for p in pending)

    def _write_entries(self, entries: list[bytes]) -> None:
        fd = self._fds["index"]
        try:
            write_all(fd, b"".join(entries))
            os.fsync(fd)  # fsync point: the entries publish their records to readers
        except OSError:
            _truncate_quietly(fd, self.entries * ENTRY.size)
            raise
        self.entries += len(entries)

    def _keep(self, pending: list[tuple[bytes, bytes, bytes, int]], exc: OSError) -> None:
        """A write failed: keep the records for the next try when the disk is full, else stop."""
        if exc.errno in _FULL_DISK:
            with self._state:
                self._pending[:0] = pending
            self.full_since = self.full_since or time.monotonic()
            return
        self._error = JournalError(f"cannot write {self.path}: {describe(exc)}")
        raise self._error from exc

    def _raise_error(self) -> None:
        if self._error is not None:
            raise JournalError(str(self._error)) from self._error.__cause__

    # --- closing ---------------------------------------------------------------------------------

    def close(self) -> None:
        """Flush what is pending, stop the flusher, release the lock. Raises JournalError if the last
        write fails (pending records are then lost, and generated again by a rerun)."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._flusher.join()
        try:
            with self._io:
                self._raise_error()
                self._write_pending()
                if self.full_since is not None and self._pending:  # unindexed records: recovery indexes them
                    held = len(self._pending)
                    raise JournalError(
                        f"cannot write {self.path}: no space left on the journal's disk; {held} records "
                        "held in memory are lost (a rerun generates them again)"
                    )
        finally:
            self._release()

    def _release(self) -> None:
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)  # closing the lock file releases the lock
        self._fds.clear()


def _claim(directory: Path, prefix: str) -> tuple[Path, int]:
    """The first log ``<prefix>-<host>-<n>`` of this host nobody holds, locked for this process."""
    host = host_name()
    for n in itertools.count():
        path = directory / f"{prefix}-{host}-{n}.bin"
        fd = try_lock(path.with_suffix(".lock"))
        if fd is not None:
            return path, fd
    raise AssertionError("unreachable")


def _end_of(index: bytes, count: int) -> int:
    if count == 0:
        return 0
    _, _, pos, length, _ = ENTRY.unpack_from(index, (count - 1) * ENTRY.size)
    return int((pos >> 8) + length)


def _valid_record_after(path: Path, start: int, kind: LogKind) -> bool:
    fd = open_read(path)
    try:
        if os.fstat(fd).st_size <= start + HEAD.size:
            return False
        with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as mm:
            position = mm.find(kind.magic, start + 1)
            while position >= 0:
                if record_at(mm, position, kind.magic, kind.minimum):
                    return True
                position = mm.find(kind.magic, position + 1)
    finally:
        os.close(fd)
    return False


def _truncate_quietly(fd: int, size: int) -> None:
    with contextlib.suppress(OSError):  # else the next writer cuts the partial group when it adopts the log
        os.ftruncate(fd, size)
