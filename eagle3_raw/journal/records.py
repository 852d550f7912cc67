"""The rows-file record: its bytes, how to check them, and what they decode to (Row, Arrow).

A rows file is a sequence of records, all integers little-endian::

    b"E3J1" | u32 payload length | u32 CRC-32 of the payload | payload
    payload = i64 index | i32 turn | i32 sample | u32 n_prompt | u32 n_output | u32 n_json
              | int32 ids[n_prompt + n_output] (prompt, then output) | JSON[n_json]
    JSON    = {"source_id", "finish_reason", "sampling_seed", "meta"}

Binary framing rather than JSON lines: the checksum tells a torn or zero-filled tail (power loss)
from a record where a JSON parser could accept a cut line; the length lets a scan index a file without
parsing rows; and the ids go to Arrow as one buffer per batch, never one Python int per token, which
keeps appending and :meth:`~eagle3_raw.journal.Journal.iter_tables` far faster than generation. The
small JSON part keeps the rest readable and extensible.
"""

from __future__ import annotations

import mmap
import struct
import sys
import zlib
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

import orjson

from eagle3_raw.rows import META_FIELDS, Row, RowKey, row_id

if TYPE_CHECKING:
    import pyarrow as pa

MAGIC = b"E3J1"
HEAD = struct.Struct("<4sII")  # magic, payload length, CRC-32 of the payload
FIXED = struct.Struct("<qiiIII")  # index, turn, sample, n_prompt, n_output, n_json
_MAX_PAYLOAD = 1 << 30
_LITTLE = sys.byteorder == "little"

assert array("i").itemsize == 4, "the journal stores ids as 32-bit ints"

#: A RowKey as plain ints (index, turn, sample): what indexes and failure records hold.
Key = tuple[int, int, int]


@dataclass(frozen=True)
class Record:
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
    fixed = FIXED.pack(row.key.index, row.key.turn, row.key.sample, len(prompt), len(output), len(tail))
    payload = b"".join((fixed, prompt, output, tail))
    return HEAD.pack(MAGIC, len(payload), zlib.crc32(payload)) + payload


def decode(payload: memoryview) -> Record:
    """The record of a payload already checked (:func:`read_payload`, :func:`checked_payload`)."""
    index, turn, sample, n_prompt, n_output, _ = FIXED.unpack_from(payload)
    ids_end = FIXED.size + 4 * (n_prompt + n_output)
    info = orjson.loads(payload[ids_end:])
    return Record(RowKey(index, turn, sample), n_prompt, payload[FIXED.size : ids_end], info)


def _consistent(payload: bytes | memoryview) -> bool:
    *_, n_prompt, n_output, n_json = FIXED.unpack_from(payload)
    return bool(FIXED.size + 4 * (n_prompt + n_output) + n_json == len(payload))


# --- checking ----------------------------------------------------------------------------------------


class BadRecord(Exception):
    """The bytes at the scan position are not a complete, valid record."""


def read_payload(f: IO[bytes]) -> bytes | None:
    """The payload of the record at ``f``'s position (None at the end of the file); BadRecord, saying
    why, when the bytes there are not a complete, valid record."""
    head = f.read(HEAD.size)
    if not head:
        return None
    if len(head) < HEAD.size:
        raise BadRecord("short header")
    magic, length, crc = HEAD.unpack(head)
    if magic != MAGIC or not FIXED.size <= length <= _MAX_PAYLOAD:
        raise BadRecord("bad header")
    payload = f.read(length)
    if len(payload) < length:
        raise BadRecord("short record")
    if zlib.crc32(payload) != crc or not _consistent(payload):
        raise BadRecord("bad checksum")
    return payload


def record_at(mm: mmap.mmap, position: int) -> bool:
    """True if a complete, valid record starts at ``position``."""
    if position + HEAD.size > len(mm):
        return False
    magic, length, crc = HEAD.unpack_from(mm, position)
    end = position + HEAD.size + length
    if magic != MAGIC or length < FIXED.size or end > len(mm):
        return False
    payload = mm[position + HEAD.size : end]
    return zlib.crc32(payload) == crc and _consistent(payload)


def checked_payload(data: bytes, length: int) -> memoryview | None:
    """The payload of ``data``, a record read back by offset, or None if it is not the ``length``
    bytes of a valid record any more."""
    payload = memoryview(data)[HEAD.size :]
    if len(data) != length or data[:4] != MAGIC or HEAD.unpack_from(data)[2] != zlib.crc32(payload):
        return None
    return payload


# --- rows and Arrow ----------------------------------------------------------------------------------


def _native_ints(data: bytes | memoryview) -> array[int]:
    ints = array("i")
    ints.frombytes(data)
    if not _LITTLE:
        ints.byteswap()
    return ints


def to_row(record: Record) -> Row:
    """``record`` as a :class:`~eagle3_raw.rows.Row`."""
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


def to_table(records: list[Record], schema: pa.Schema) -> pa.Table:
    """``records`` as one table in ``schema``; the ids of all records go in as one buffer."""
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


def _columns(records: list[Record]) -> Iterator[tuple[str, list[Any]]]:
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
