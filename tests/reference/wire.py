"""HTTP helpers for the reference server's tests: raw requests, SSE parsing, concurrent posts."""

from __future__ import annotations

import asyncio
import http.client
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from tests.support.pace import scaled


@dataclass(frozen=True)
class Reply:
    """An HTTP response as the client saw it."""

    status: int
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "").split(";")[0].strip()

    def events(self) -> list[Any]:
        """SSE events, parsed: JSON values, and the string ``"[DONE]"``."""
        return sse_events(self.body)


def request(
    url: str,
    path: str,
    body: Any = None,
    *,
    method: str = "POST",
    raw: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: float = 30.0,
) -> Reply:
    """One request on a fresh connection; ``body`` is sent as JSON unless ``raw`` is given (``timeout``,
    generous on an idle machine, is stretched by its pace)."""
    parts = urllib.parse.urlsplit(url)
    data = raw if raw is not None else (None if body is None else orjson.dumps(body))
    host = parts.hostname or "127.0.0.1"
    connection = http.client.HTTPConnection(host, parts.port, timeout=scaled(timeout))
    try:
        all_headers = {"Content-Type": "application/json", **(headers or {})}
        connection.request(method, path, body=data, headers=all_headers)
        response = connection.getresponse()
        payload = response.read()
        return Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, payload)
    finally:
        connection.close()


def get(url: str, path: str, **kwargs: Any) -> Reply:
    return request(url, path, method="GET", **kwargs)


def sse_events(body: bytes) -> list[Any]:
    """Parse ``data: ...\\n\\n`` framing; anything else in the body is an error."""
    events: list[Any] = []
    for block in body.split(b"\n\n"):
        if not block:
            continue
        assert block.startswith(b"data: "), f"not an SSE data line: {block[:80]!r}"
        payload = block[len(b"data: ") :]
        events.append("[DONE]" if payload == b"[DONE]" else orjson.loads(payload))
    return events


@dataclass(frozen=True)
class Outcome:
    """What one concurrent request ended with: a status and body, or the client-side failure."""

    status: int | None
    body: bytes
    error: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    """Lower-cased names, as in :class:`Reply`."""

    def json(self) -> Any:
        return orjson.loads(self.body)

    def reply(self) -> Reply:
        """The complete reply (only when the request got one: a status and no client-side failure)."""
        assert self.status is not None and self.error is None, (self.status, self.error)
        return Reply(self.status, self.headers, self.body)


async def _post(session: aiohttp.ClientSession, url: str, body: Any, timeout: float) -> Outcome:
    try:
        async with asyncio.timeout(timeout):
            async with session.post(url, data=orjson.dumps(body)) as response:
                headers = {k.lower(): v for k, v in response.headers.items()}
                return Outcome(response.status, await response.read(), headers=headers)
    except TimeoutError:
        return Outcome(None, b"", "timeout")
    except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as exc:
        return Outcome(None, b"", type(exc).__name__)


def post_many(
    url: str, bodies: Sequence[Any], *, concurrency: int = 16, timeout: float = 30.0, path: str = "/generate"
) -> list[Outcome]:
    """POST every body (at most ``concurrency`` at once); outcomes in the order of ``bodies``."""

    async def run() -> list[Outcome]:
        gate = asyncio.Semaphore(concurrency)
        connector = aiohttp.TCPConnector(limit=concurrency, force_close=True)
        headers = {"Content-Type": "application/json"}
        async with aiohttp.ClientSession(connector=connector, headers=headers) as session:

            async def one(body: Any) -> Outcome:
                async with gate:
                    return await _post(session, url + path, body, timeout)

            return list(await asyncio.gather(*(one(body) for body in bodies)))

    return asyncio.run(run())


def wait_until(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    """Poll ``condition`` every 10 ms until it holds (a generous ``timeout``, stretched by the
    machine's pace, only catches hangs)."""
    deadline = time.monotonic() + scaled(timeout)
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)
