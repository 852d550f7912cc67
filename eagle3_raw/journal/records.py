"""The journal's records: their framing, how to check them, and the two payloads (generations, outcomes).

Every data file is a sequence of framed records, all integers little-endian::

    magic (4 bytes, per kind) | u32 payload length | u32 CRC-32 of the payload | payload

A **generation** (``E3G2``; files under ``generations/<target>/``) is one ``/generate`` exchange::

    digest[16] | input_key[16] | u8 type | 3 pad | u32 n_prompt | u32 n_output | u32 n_json
    | int32 ids[n_prompt + n_output] (prompt, then output) | JSON[n_json]
    JSON = {"finish_reason", "sampling_params", "meta"}       (type 0: a generation)
         = {}                                                  (type 1: an alias, no ids)

An alias says that another input key produced a request already journaled under ``digest``.

An **outcome** (``E3O2``; files under ``sets/<config id>/``) is what became of one row of a set::

    i64 index | i32 turn | i32 sample | digest[16] | u8 type | 3 pad | u32 n_json | JSON[n_json]
    JSON = {"source_id", "sampling_seed", "attempts", "reused"}     (type 0: a row, by digest)
         = {"id", "kind", "reason", "epoch"}                          (type 1: a failure)

Binary framing rather than JSON lines: the checksum tells a torn or zero-filled tail (power loss)
from a record where a JSON parser could accept a cut line; the length lets a scan skip payloads;
and ids go to Arrow as one buffer per batch, never one Python int per token.
"""

from __future__ import annotations

import mmap
import struct
import sys
import zlib
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any

import orjson

MAGIC_GENERATION = b"E3G2"
MAGIC_OUTCOME = b"E3O2"
HEAD = struct.Struct("<4sII")  # magic, payload length, CRC-32 of the payload
GEN_FIXED = struct.Struct("<16s16sB3xIII")  # digest, input key, type, n_prompt, n_output, n_json
OUT_FIXED = struct.Struct("<qii16sB3xI")  # index, turn, sample, digest, type, n_json
ROW_KEY = struct.Struct("<qii")  # an outcome's key as its 16 index bytes
MAX_PAYLOAD = 1 << 30
_LITTLE = sys.byteorder == "little"

GENERATION, ALIAS = 0, 1
ROW, FAILURE = 0, 1

assert array("i").itemsize == 4, "the journal stores ids as 32-bit ints"


# --- payloads ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Generation:
    """A journaled ``/generate`` exchange: the request digest, the ids as sent and returned, facts."""

    digest: bytes
    input_key: bytes
    n_prompt: int
    ids: memoryview
    """Little-endian int32: the prompt ids, then the output ids."""
    info: Mapping[str, Any]

    @property
    def n_output(self) -> int:
        return len(self.ids) // 4 - self.n_prompt

    def prompt_ids(self) -> list[int]:
        return native_ints(self.ids[: 4 * self.n_prompt]).tolist()

    def output_ids(self) -> list[int]:
        return native_ints(self.ids[4 * self.n_prompt :]).tolist()


def encode_generation(
    digest: bytes,
    input_key: bytes,
    prompt_ids: Sequence[int],
    output_ids: Sequence[int],
    info: Mapping[str, Any],
) -> bytes:
    """The framed record of a generation (``info``: finish_reason, sampling_params, meta)."""
    prompt, output = _le_ints(prompt_ids), _le_ints(output_ids)
    tail = orjson.dumps(dict(info), option=orjson.OPT_SERIALIZE_NUMPY)
    fixed = GEN_FIXED.pack(digest, input_key, GENERATION, len(prompt_ids), len(output_ids), len(tail))
    return frame(MAGIC_GENERATION, b"".join((fixed, prompt, output, tail)))


def encode_alias(digest: bytes, input_key: bytes) -> bytes:
    """The framed record saying ``input_key`` produced the request journaled under ``digest``."""
    return frame(MAGIC_GENERATION, GEN_FIXED.pack(digest, input_key, ALIAS, 0, 0, 2) + b"{}")


def decode_generation(payload: memoryview | bytes) -> Generation:
    digest, key, _, n_prompt, n_output, _ = GEN_FIXED.unpack_from(payload)
    ids_end = GEN_FIXED.size + 4 * (n_prompt + n_output)
    view = memoryview(payload)
    return Generation(digest, key, n_prompt, view[GEN_FIXED.size : ids_end], orjson.loads(view[ids_end:]))


def generation_keys(payload: bytes | memoryview) -> tuple[bytes, bytes, int] | None:
    """(digest, input key, type) of a generation payload, or None if its lengths do not add up."""
    digest, key, kind, n_prompt, n_output, n_json = GEN_FIXED.unpack_from(payload)
    whole = GEN_FIXED.size + 4 * (n_prompt + n_output) + n_json == len(payload)
    return (digest, key, kind) if whole and kind in (GENERATION, ALIAS) else None


@dataclass(frozen=True)
class Outcome:
    """A journaled outcome of one row of a set (a row by digest, or a failure)."""

    index: int
    turn: int
    sample: int
    digest: bytes
    kind: int
    info: Mapping[str, Any]


def encode_outcome(key: Sequence[int], digest: bytes, kind: int, info: Mapping[str, Any]) -> bytes:
    """The framed record of a row's outcome (``key`` = index, turn, sample)."""
    tail = orjson.dumps(dict(info))
    return frame(MAGIC_OUTCOME, OUT_FIXED.pack(*key, digest, kind, len(tail)) + tail)


def decode_outcome(payload: memoryview | bytes) -> Outcome:
    index, turn, sample, digest, kind, _ = OUT_FIXED.unpack_from(payload)
    return Outcome(index, turn, sample, digest, kind, orjson.loads(memoryview(payload)[OUT_FIXED.size :]))


def outcome_keys(payload: bytes | memoryview) -> tuple[bytes, bytes, int] | None:
    """(16 key bytes, digest, type) of an outcome payload, or None if its lengths do not add up."""
    index, turn, sample, digest, kind, n_json = OUT_FIXED.unpack_from(payload)
    whole = OUT_FIXED.size + n_json == len(payload) and kind in (ROW, FAILURE)
    return (ROW_KEY.pack(index, turn, sample), digest, kind) if whole else None


# --- framing and checking --------------------------------------------------------------------------


def frame(magic: bytes, payload: bytes) -> bytes:
    return HEAD.pack(magic, len(payload), zlib.crc32(payload)) + payload


class BadRecord(Exception):
    """The bytes at the scan position are not a complete, valid record."""


def read_payload(f: IO[bytes], magic: bytes, minimum: int) -> bytes | None:
    """The payload of the record at ``f``'s position (None at the end of the file); BadRecord, saying
    why, when the bytes there are not a complete, valid record of this ``magic``."""
    head = f.read(HEAD.size)
    if not head:
        return None
    if len(head) < HEAD.size:
        raise BadRecord("short header")
    found, length, crc = HEAD.unpack(head)
    if found != magic or not minimum <= length <= MAX_PAYLOAD:
        raise BadRecord("bad header")
    payload = f.read(length)
    if len(payload) < length:
        raise BadRecord("short record")
    if zlib.crc32(payload) != crc:
        raise BadRecord("bad checksum")
    return payload


def record_at(mm: mmap.mmap, position: int, magic: bytes, minimum: int) -> bool:
    """True if a complete, valid record of this ``magic`` starts at ``position``."""
    if position + HEAD.size > len(mm):
        return False
    found, length, crc = HEAD.unpack_from(mm, position)
    end = position + HEAD.size + length
    if found != magic or length < minimum or end > len(mm):
        return False
    return bool(zlib.crc32(mm[position + HEAD.size : end]) == crc)


def checked_payload(data: bytes, length: int, magic: bytes) -> memoryview | None:
    """The payload of ``data``, a record read back by offset, or None if it is not the ``length``
    bytes of a valid record any more."""
    payload = memoryview(data)[HEAD.size :]
    if len(data) != length or data[:4] != magic or HEAD.unpack_from(data)[2] != zlib.crc32(payload):
        return None
    return payload


def native_ints(data: bytes | memoryview) -> array[int]:
    ints = array("i")
    ints.frombytes(data)
    if not _LITTLE:
        ints.byteswap()
    return ints


def _le_ints(values: Sequence[int]) -> bytes:
    ints = array("i", values)
    if not _LITTLE:
        ints.byteswap()
    return ints.tobytes()
