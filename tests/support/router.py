"""A stand-in for an SGLang router on 127.0.0.1, for tests: one URL in front of several workers.

``POST /generate`` goes to the workers in turn (round robin, as ``sglang_router`` does without
cache-aware routing); every other request goes to the first worker, so ``/server_info`` and
``/model_info`` describe one worker, as behind a real router. ``tokenize_status`` makes
``/tokenize`` answer that HTTP status instead (404: a router that does not forward it).
"""

from __future__ import annotations

import asyncio
import itertools
import socket
import threading
from collections.abc import Sequence

import aiohttp
from aiohttp import web


class Router:
    """Serves from a background thread; use as a context manager. ``routed`` counts /generate per worker."""

    def __init__(self, workers: Sequence[str], *, tokenize_status: int | None = None) -> None:
        self.workers = list(workers)
        self.tokenize_status = tokenize_status
        self.routed = dict.fromkeys(self.workers, 0)
        self._next = itertools.cycle(self.workers)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="router", daemon=True)
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.url = ""

    def __enter__(self) -> Router:
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
        app = web.Application()
        app.router.add_route("*", "/{path:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.SockSite(self._runner, sock).start()

    async def _shutdown(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        if request.path == "/tokenize" and self.tokenize_status is not None:
            return web.json_response({"error": {"message": "not here"}}, status=self.tokenize_status)
        worker = next(self._next) if request.path == "/generate" else self.workers[0]
        if request.path == "/generate":
            self.routed[worker] += 1
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("content-type", "authorization")}
        async with self._session.request(
            request.method, worker + request.path_qs, data=await request.read(), headers=headers
        ) as answer:
            body = await answer.read()
            return web.Response(body=body, status=answer.status, content_type=answer.content_type)
