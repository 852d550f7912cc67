"""A server on 127.0.0.1 that misbehaves on purpose, for tests: it records every request it gets.

``HostileServer(routes, worker=URL)`` serves ``routes`` (``{"/generate": handler}``; a handler
receives the request and a ``forward`` coroutine that sends it on to ``worker`` and returns
``(status, body bytes)``), forwards every other path to ``worker`` (a reference server) unchanged,
and answers ``200 {}`` to anything when there is no worker: an attacker's server that only
listens. ``requests`` holds ``(method, path, headers, body)`` of every request, in order.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

Forward = Callable[[], Awaitable[tuple[int, bytes]]]
Handler = Callable[[web.Request, Forward], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    headers: Mapping[str, str]
    body: bytes


class HostileServer:
    """Serves from a background thread; use as a context manager."""

    def __init__(self, routes: Mapping[str, Handler] | None = None, *, worker: str | None = None) -> None:
        self.routes = dict(routes or {})
        self.worker = worker
        self.requests: list[Seen] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="hostile", daemon=True)
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.url = ""

    def __enter__(self) -> HostileServer:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._serve(sock), self._loop).result(timeout=30)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()

    async def _serve(self, sock: socket.socket) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120))
        app = web.Application(client_max_size=1 << 26)
        app.router.add_route("*", "/{path:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=0.5)
        await self._runner.setup()
        await web.SockSite(self._runner, sock).start()

    async def _shutdown(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.requests.append(Seen(request.method, request.path, dict(request.headers), body))

        async def forward() -> tuple[int, bytes]:
            return await self._forward(request, body)

        handler = self.routes.get(request.path)
        if handler is not None:
            return await handler(request, forward)
        if self.worker is None:
            return web.json_response({})
        status, answer = await forward()
        return web.Response(body=answer, status=status, content_type="application/json")

    async def _forward(self, request: web.Request, body: bytes) -> tuple[int, bytes]:
        assert self._session is not None and self.worker is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("content-type", "authorization")}
        async with self._session.request(
            request.method, self.worker + request.path_qs, data=body, headers=headers
        ) as answer:
            return answer.status, await answer.read()


def json_body(data: Any, status: int = 200) -> web.Response:
    import orjson

    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")
