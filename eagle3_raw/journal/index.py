"""Rows files: indexing and repairing them, the canonical order, and reading records back by offset.

An index (:class:`FileIndex`) says where the valid records of one rows file are: 40 bytes per
record, no row data. Scanning stops at a torn tail (short header, short record, bad magic, bad
checksum); damaged bytes followed by a valid record are corruption and raise JournalError instead.
Only the shard's writer cuts a torn tail (:func:`open_rows`); readers stop before it, since its
writer may be writing it right now.

Canonical order (:func:`canonical`): the first record of each key wins, "first" meaning the lowest
(shard file name, offset), and rows come out in RowKey order whatever order they were appended in.
"""

from __future__ import annotations

import mmap
import os
from array import array
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from eagle3_raw.errors import JournalError
from eagle3_raw.journal.files import cut, guard, open_append
from eagle3_raw.journal.records import (
    FIXED,
    HEAD,
    MAGIC,
    BadRecord,
    Record,
    checked_payload,
    decode,
    read_payload,
    record_at,
)

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

_MAX_BATCH_IDS = 8 << 20  # ids per Arrow batch: bounds batch memory and keeps int32 offsets valid
_READ_BUFFER = 1 << 20
_INDEX_COLUMNS = ("index", "turn", "sample", "offset", "length")
_SORT_COLUMNS = ("index", "turn", "sample", "file", "offset")


def _int64s() -> array[int]:
    return array("q")


@dataclass
class FileIndex:
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

    def copy(self) -> FileIndex:
        columns = {name: array("q", getattr(self, name)) for name in _INDEX_COLUMNS}
        return FileIndex(self.path, self.end, **columns)

    def nbytes(self) -> int:
        return sum(len(column) * column.itemsize for column in map(self.__getattribute__, _INDEX_COLUMNS))

    def __len__(self) -> int:
        return len(self.index)


# --- scanning and repair -----------------------------------------------------------------------------


def index_file(idx: FileIndex) -> str | None:
    """Index ``idx.path`` from ``idx.end`` to its end. Returns why it stopped short of the end of the
    file (a torn tail at ``idx.end``), or None. Raises JournalError if valid records follow bad bytes."""
    with guard("read", idx.path):
        while (reason := _scan(idx)) is not None:
            verdict = _classify_tail(idx.path, idx.end)
            if verdict == "torn":
                return reason
            if verdict == "corrupt":
                raise JournalError(
                    f"{idx.path}: the record at offset {idx.end} is damaged ({reason}) but valid records "
                    "follow it, so this is not a torn write and nothing was cut. To keep every record "
                    f"before the damage, copy the file aside and run: truncate -s {idx.end} {idx.path} "
                    "(the rows after it will be generated again); or restore it from a copy."
                )
    return None


def _scan(idx: FileIndex) -> str | None:
    with idx.path.open("rb", buffering=_READ_BUFFER) as f:
        f.seek(idx.end)
        while True:
            try:
                payload = read_payload(f)
            except BadRecord as exc:
                return str(exc)
            if payload is None:
                return None
            idx.add(FIXED.unpack_from(payload), HEAD.size + len(payload))


def _classify_tail(path: Path, start: int) -> str:
    """``grown`` if a valid record now starts at ``start`` (a writer finished it meanwhile),
    ``corrupt`` if one starts after it, else ``torn``."""
    with path.open("rb") as f:
        if os.fstat(f.fileno()).st_size <= start:
            return "torn"
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            if record_at(mm, start):
                return "grown"
            position = mm.find(MAGIC, start + 1)
            while position >= 0:
                if record_at(mm, position):
                    return "corrupt"
                position = mm.find(MAGIC, position + 1)
    return "torn"


def open_rows(path: Path) -> tuple[FileIndex, int]:
    """Index this shard's rows file, cut a torn tail, and open it for appending."""
    with guard("open", path):
        fd = open_append(path)
    try:
        idx = FileIndex(path)
        reason = index_file(idx)
        if reason is not None:
            cut(fd, path, idx.end, reason)
    except BaseException:
        os.close(fd)
        raise
    return idx, fd


# --- canonical order ---------------------------------------------------------------------------------


def canonical(files: Sequence[FileIndex]) -> Iterator[tuple[Path, int, int]]:
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


# --- reading -----------------------------------------------------------------------------------------


class _Reader:
    """Reads records by offset (pread), one descriptor per file, checking each record again."""

    def __init__(self) -> None:
        self._fds: dict[Path, int] = {}

    def __enter__(self) -> _Reader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        for fd in self._fds.values():
            os.close(fd)

    def read(self, path: Path, offset: int, length: int) -> Record:
        with guard("read", path):
            data = os.pread(self._fd(path), length, offset)
        payload = checked_payload(data, length)
        if payload is None:
            raise JournalError(f"{path}: the record at offset {offset} changed after it was indexed")
        return decode(payload)

    def read_info(self, path: Path, offset: int) -> tuple[int, int, dict[str, Any]]:
        """(n_prompt, n_output, JSON part) of the record at ``offset``, without reading the ids."""
        with guard("read", path):
            head = os.pread(self._fd(path), HEAD.size + FIXED.size, offset)
            *_, n_prompt, n_output, n_json = FIXED.unpack_from(head, HEAD.size)
            start = offset + len(head) + 4 * (n_prompt + n_output)
            info = orjson.loads(os.pread(self._fd(path), n_json, start))
        return n_prompt, n_output, info

    def _fd(self, path: Path) -> int:
        if path not in self._fds:
            self._fds[path] = os.open(path, os.O_RDONLY)
        return self._fds[path]


def record_batches(files: Sequence[FileIndex], batch_rows: int) -> Iterator[list[Record]]:
    """The canonical records of ``files``, at most ``batch_rows`` (and about 8M ids) per batch."""
    batch: list[Record] = []
    ids = 0
    with _Reader() as reader:
        for path, offset, length in canonical(files):
            batch.append(reader.read(path, offset, length))
            ids += len(batch[-1].ids) // 4
            if len(batch) >= batch_rows or ids >= _MAX_BATCH_IDS:
                yield batch
                batch, ids = [], 0
    if batch:
        yield batch


def row_stats(files: Sequence[FileIndex]) -> dict[str, Any]:
    """``rows``, ``duplicates``, ``prompt_tokens``, ``generated_tokens``, ``finish_reasons`` and
    ``tokens_by_reason`` {reason: {prompt_tokens, generated_tokens}} of ``files``' canonical
    records, read without their ids."""
    by_reason: dict[str, Counter[str]] = {}
    with _Reader() as reader:
        for path, offset, _ in canonical(files):
            n_prompt, n_output, info = reader.read_info(path, offset)
            counts = by_reason.setdefault(info["finish_reason"], Counter())
            counts.update(rows=1, prompt_tokens=n_prompt, generated_tokens=n_output)
    totals: Counter[str] = sum(by_reason.values(), Counter())
    return {
        "rows": totals["rows"],
        "duplicates": sum(map(len, files)) - totals["rows"],
        "prompt_tokens": totals["prompt_tokens"],
        "generated_tokens": totals["generated_tokens"],
        "finish_reasons": {reason: c["rows"] for reason, c in by_reason.items()},
        "tokens_by_reason": {
            reason: {"prompt_tokens": c["prompt_tokens"], "generated_tokens": c["generated_tokens"]}
            for reason, c in by_reason.items()
        },
    }
