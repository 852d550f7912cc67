"""The failures files: why keys did not become rows, and markers that clear them.

``failures-<shard>.jsonl`` holds one JSON object per line, appended with the shard's rows: a failure
``{"key": [index, turn, sample], "id", "kind", "reason", "time"}`` or a clear marker
``{"clear": [kinds], "time"}``. JSON lines rather than binary records: the file is small, rare, and
meant to be read by people. A torn last line is cut when the shard's writer opens the file; a
damaged line followed by a good one is corruption (JournalError).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import orjson

from eagle3_raw.errors import JournalError
from eagle3_raw.journal.files import cut, guard, open_append
from eagle3_raw.journal.records import Key
from eagle3_raw.rows import RowKey

#: ``failed``: may succeed if tried again (``--retry-failed``); ``skipped``: the prompt is unusable.
FAILURE_KINDS = ("failed", "skipped")


def failure_record(key: RowKey, row_id: str, kind: str, reason: str) -> dict[str, Any]:
    """The record of a failure (without its time); ValueError for a kind not in FAILURE_KINDS."""
    if kind not in FAILURE_KINDS:
        raise ValueError(f"failure kind {kind!r}: expected one of {FAILURE_KINDS}")
    return {"key": [key.index, key.turn, key.sample], "id": row_id, "kind": kind, "reason": reason}


def clear_record(kinds: Iterable[str]) -> dict[str, Any]:
    """The marker clearing failures of ``kinds`` (without its time); ValueError for unknown kinds."""
    kinds = sorted(set(kinds))
    if not set(kinds) <= set(FAILURE_KINDS):
        raise ValueError(f"failure kinds {kinds}: expected some of {FAILURE_KINDS}")
    return {"clear": kinds}


def open_failures(path: Path) -> tuple[int, int]:
    """Open this shard's failures file for appending, cutting a torn last line. (fd, valid size)."""
    with guard("open", path):
        fd = open_append(path)
    try:
        with guard("read", path):
            data = path.read_bytes()
        end = parse_failures(data, path)[1]
        if end < len(data):
            cut(fd, path, end, "torn last line")
    except BaseException:
        os.close(fd)
        raise
    return fd, end


def read_failures(directory: Path) -> list[dict[str, Any]]:
    """The records of every failures file of ``directory``, file by file in name order."""
    records: list[dict[str, Any]] = []
    for path in sorted(directory.glob("failures-*.jsonl")):
        with guard("read", path):
            records += parse_failures(path.read_bytes(), path)[0]
    return records


def parse_failures(data: bytes, path: Path) -> tuple[list[dict[str, Any]], int]:
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
    """The record on ``line``, or None unless it is a whole one: a clear marker, or a failure with
    every field well-typed (a damaged line must not pass as a failure of another row)."""
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(record, dict) or not isinstance(record.get("time"), int | float):
        return None
    if "clear" in record:
        return record if isinstance(record["clear"], list) else None
    key = record.get("key")
    whole = (
        isinstance(key, list) and len(key) == 3 and all(isinstance(k, int) for k in key)
        and all(isinstance(record.get(f), str) for f in ("id", "kind", "reason"))
    )  # fmt: skip
    return record if whole else None


def current_failures(records: list[dict[str, Any]], done: set[RowKey]) -> list[dict[str, Any]]:
    """The current failure of every key that has one and is not in ``done``, in RowKey order.

    Each is ``{"key": RowKey, "id", "kind", "reason", "time"}``: the latest record for the key,
    unless a clear marker with a later time covered its kind.
    """
    current = _latest_uncleared(records)
    keys = sorted(RowKey(*key) for key in current)
    return [_view(key, current[(key.index, key.turn, key.sample)]) for key in keys if key not in done]


def _latest_uncleared(records: list[dict[str, Any]]) -> dict[Key, dict[str, Any]]:
    latest: dict[Key, dict[str, Any]] = {}
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


def _view(key: RowKey, record: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "key": key,
        "id": record["id"],
        "kind": record["kind"],
        "reason": record["reason"],
        "time": record["time"],
    }
