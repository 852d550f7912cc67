"""The reference server's ledger (``--ledger FILE``): one JSON line per ``/generate`` outcome.

A test checks a dataset against it: every generation the server answered, with the ids it
received and the ids it returned, and whether the answer reached the client. Lines are appended
with one ``write`` per response on an ``O_APPEND`` descriptor (flushed per write, not fsync'd), so
a server restarted on the same file keeps appending.

Each line carries ``time`` (Unix seconds), ``port``, ``endpoint`` (``"/generate"``; in vLLM mode the
route, ``/v1/completions`` or ``/inference/v1/generate``, whose lines also carry ``stop_reason``,
have ``finish_reason`` as vLLM's string and ``rid`` the engine's request id), ``request``
(the server's sequence number of the HTTP request, from 0 per process), ``status`` (the HTTP status
sent, ``null`` for a reply that never came), ``fault`` (the injected fault or ``null``) and
``delivered`` (false when the connection was reset, hung or dropped by the client; a line is written
just before the last bytes of its response go out, so a client holding a response always finds it,
and a client vanishing in that very instant may be recorded as served). Generation
lines (one per prompt x sample, ``status`` 200, or the 400/503 a generation ended with) add
``index`` (position in the response), ``rid``, ``input_ids`` (as received, or as tokenized from
``text``), ``text``, ``sampling_params`` (as received), ``output_ids``, ``finish_reason`` and
``stream``. A request refused before any generation (400 on validation, injected 5xx, hang) has one
line with ``error`` (the body sent) instead.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import orjson


class Ledger:
    """An append-only JSON-lines file shared by the server's handlers (one event loop, no locks)."""

    def __init__(self, path: Path, port: int) -> None:
        self.path = path
        self.port = port
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Append ``records`` (each gains ``time``, ``port`` and ``endpoint``) in one write."""
        now = time.time()
        data = b"".join(
            orjson.dumps({"time": now, "port": self.port, "endpoint": "/generate", **record}) + b"\n"
            for record in records
        )
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]

    def close(self) -> None:
        os.close(self._fd)


def read_ledger(path: Path) -> list[dict[str, Any]]:
    """Every line of a ledger file, parsed (a torn last line, from a killed server, is skipped)."""
    records = []
    for line in path.read_bytes().splitlines():
        try:
            records.append(orjson.loads(line))
        except orjson.JSONDecodeError:
            continue
    return records
