"""``torch.save``'s file format, written without torch: the ``.pt`` files the trainers ``torch.load``.

torch 2.x saves a zip archive of stored (uncompressed) records, all inside one folder named after
the file (torch 2.13.0, ``torch/serialization.py`` ``_save`` and
``caffe2/serialize/inline_container.cc``; checked by reading files ``torch.save`` wrote)::

    <stem>/data.pkl                 the object, pickle protocol 2, tensors by persistent id
    <stem>/.format_version          b"1"
    <stem>/.storage_alignment       b"64"
    <stem>/byteorder                b"little"
    <stem>/data/<key>               one storage's raw little-endian bytes
    <stem>/version                  b"3\\n"
    <stem>/.data/serialization_id   40 decimal digits (here derived from the content: same input,
                                    same bytes)

Every record's bytes start on a 64-byte boundary: the local header's extra field is padded with a
``FB`` record, as torch's writer does (needed for ``torch.load(mmap=True)``). A tensor pickles as
``torch._utils._rebuild_tensor_v2(storage, 0, (n,), (1,), False, collections.OrderedDict())`` with
``storage`` the persistent id ``("storage", torch.LongStorage, "<key>", "cpu", n)``: only globals
``torch.load(weights_only=True)`` (the default since torch 2.6) accepts.

The functions return the file's bytes; ``stem`` is the file name without ``.pt`` (torch's folder
name; any name loads). Only what the trainers read is supported: 1-D int64 and bool tensors, a
dict of them, one tensor, and a dict of ints.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

_ALIGNMENT = 64
_SETITEMS_BATCH = 1000
_STORAGES = {"int64": ("LongStorage", "<i8"), "bool": ("BoolStorage", "|b1")}
_DOS_DATE = (0 << 9) | (1 << 5) | 1  # 1980-01-01: a fixed date keeps the bytes reproducible


def tensors_file(stem: str, tensors: Mapping[str, np.ndarray]) -> bytes:
    """``torch.save({name: tensor, ...})`` of 1-D int64/bool arrays (SpecForge's vocab mapping)."""
    items = [_str(name) + _tensor(array, str(key)) for key, (name, array) in enumerate(tensors.items())]
    return _archive(stem, _dict(items), list(tensors.values()))


def tensor_file(stem: str, array: np.ndarray) -> bytes:
    """``torch.save(tensor)`` of one 1-D int64/bool array (Model-Optimizer's ``d2t`` cache)."""
    return _archive(stem, b"\x80\x02" + _tensor(array, "0") + b".", [array])


def int_dict_file(stem: str, values: Mapping[int, int]) -> bytes:
    """``torch.save({int: int, ...})``, in ``values``' order (speculators' ``token_freq.pt``)."""
    return _archive(stem, _dict([_int(int(k)) + _int(int(v)) for k, v in values.items()]), [])


# --- pickle protocol 2, the opcodes torch's pickler emits for these objects ---------------------------


def _dict(items: list[bytes]) -> bytes:
    body = b"".join(
        b"(" + b"".join(items[i : i + _SETITEMS_BATCH]) + b"u" for i in range(0, len(items), _SETITEMS_BATCH)
    )
    return b"\x80\x02}" + body + b"."


def _tensor(array: np.ndarray, key: str) -> bytes:
    storage_type, _ = _storage(array)
    count = int(array.shape[0])
    storage = b"(" + _str("storage") + _global("torch", storage_type) + _str(key) + _str("cpu")
    storage += _int(count) + b"tQ"  # TUPLE, BINPERSID
    hooks = _global("collections", "OrderedDict") + b")R"  # EMPTY_TUPLE, REDUCE
    args = storage + _int(0) + _int(count) + b"\x85" + _int(1) + b"\x85" + b"\x89" + hooks
    return _global("torch._utils", "_rebuild_tensor_v2") + b"(" + args + b"tR"


def _storage(array: np.ndarray) -> tuple[str, str]:
    if array.ndim != 1 or array.dtype.name not in _STORAGES:
        raise ValueError(f"only 1-D int64 or bool arrays are written, not {array.dtype}{list(array.shape)}")
    return _STORAGES[array.dtype.name]


def _int(value: int) -> bytes:
    if 0 <= value < 1 << 8:
        return b"K" + bytes([value])
    if 0 <= value < 1 << 16:
        return b"M" + value.to_bytes(2, "little")
    if -(1 << 31) <= value < 1 << 31:
        return b"J" + value.to_bytes(4, "little", signed=True)
    data = value.to_bytes(value.bit_length() // 8 + 1, "little", signed=True)
    return b"\x8a" + bytes([len(data)]) + data  # LONG1


def _str(text: str) -> bytes:
    data = text.encode()
    return b"X" + struct.pack("<I", len(data)) + data


def _global(module: str, name: str) -> bytes:
    return b"c" + f"{module}\n{name}\n".encode()


# --- the zip archive ---------------------------------------------------------------------------------


def _archive(stem: str, pickled: bytes, storages: list[np.ndarray]) -> bytes:
    data = [array.astype(_storage(array)[1], copy=False).tobytes() for array in storages]
    digest = hashlib.sha256(pickled + b"".join(data)).digest()
    records = [
        ("data.pkl", pickled),
        (".format_version", b"1"),
        (".storage_alignment", str(_ALIGNMENT).encode()),
        ("byteorder", b"little"),
        *((f"data/{key}", blob) for key, blob in enumerate(data)),
        ("version", b"3\n"),
        (".data/serialization_id", f"{int.from_bytes(digest) % 10**40:040d}".encode()),
    ]
    return _zip((f"{stem}/{name}", blob) for name, blob in records)


def _zip(records: Iterable[tuple[str, bytes]]) -> bytes:
    """A stored zip archive whose every record's data starts on a 64-byte boundary."""
    out, central = bytearray(), bytearray()
    count = 0
    for name, blob in records:
        encoded, crc, offset = name.encode(), zlib.crc32(blob), len(out)
        pad = -(offset + 30 + len(encoded) + 4) % _ALIGNMENT
        extra = b"FB" + struct.pack("<H", pad) + b"Z" * pad
        fields = (20, 0x0800, 0, 0, _DOS_DATE, crc, len(blob), len(blob), len(encoded))
        out += struct.pack("<IHHHHHIIIHH", 0x04034B50, *fields, len(extra)) + encoded + extra + blob
        central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, *fields, 0, 0, 0, 0, 0, offset)
        central += encoded
        count += 1
    if len(out) + len(central) >= 1 << 32:
        raise ValueError("a .pt file of 4 GiB or more needs zip64, which this writer does not do")
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, count, count, len(central), len(out), 0)
    return bytes(out + central + end)
