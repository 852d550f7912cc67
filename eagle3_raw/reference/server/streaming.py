"""SSE streams of ``/generate`` (``shared/sglang-protocol.md`` §4): cumulative chunks, ``index`` on
batch streams, the final chunk equal to the non-stream object, then ``data: [DONE]``.

Chunks are queued as the jobs produce them and written as they come, whatever is already waiting
in one write; the ledger lines are written just before the write that carries ``[DONE]``. A client
that leaves mid-stream cancels the handler, which aborts its generations (:mod:`.runner`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

from aiohttp import web

from eagle3_raw.reference.server.jobs import Job, response_object
from eagle3_raw.reference.server.replies import (
    SSE,
    SSE_DONE,
    Exchange,
    connected,
    generation_lines,
    new_response,
    reset,
    sse_event,
)
from eagle3_raw.reference.server.runner import run_all
from eagle3_raw.sglang import protocol as p


async def stream_reply(ex: Exchange, req: p.Normalized, jobs: list[Job]) -> web.StreamResponse:
    """SSE: cumulative chunks, ``index`` on batch streams, the final chunk as the non-stream object."""
    chunks: asyncio.Queue[bytes | None] = asyncio.Queue()

    def emit(job: Job, final: bool) -> None:
        obj = response_object(job, ex.state.model, req, ex.received, final, ex.state.config.drafter)
        if not req.is_single:
            obj["index"] = job.index
        chunks.put_nowait(sse_event(obj))

    async def produce() -> None:
        await run_all(ex.state, jobs, emit, True)
        chunks.put_nowait(SSE_DONE)
        chunks.put_nowait(None)

    response = new_response(SSE)
    if ex.fault == "reset":
        await produce()
        return await reset(ex, response, b"".join(_drain(chunks)), generation_lines(ex, req, jobs))
    logged = False

    def log_before_done() -> None:
        nonlocal logged
        logged = True
        ex.state.log(generation_lines(ex, req, jobs), delivered=connected(ex.request))

    try:
        await response.prepare(ex.request)
        await asyncio.gather(produce(), _pump(chunks, response, log_before_done))
    except (asyncio.CancelledError, ConnectionError):
        if not logged:
            ex.state.log(generation_lines(ex, req, jobs), delivered=False)
        raise
    await response.write_eof()
    return response


def _drain(chunks: asyncio.Queue[bytes | None]) -> Iterator[bytes]:
    while not chunks.empty():
        chunk = chunks.get_nowait()
        if chunk is not None:
            yield chunk


async def _pump(
    chunks: asyncio.Queue[bytes | None], response: web.StreamResponse, before_last: Callable[[], None]
) -> None:
    """Write queued SSE chunks as they come, batching whatever is already waiting; ``before_last``
    runs just before the write that carries ``[DONE]``."""
    while True:
        batch = [await chunks.get()]
        while not chunks.empty():
            batch.append(chunks.get_nowait())
        done = batch[-1] is None
        if done:
            before_last()
        await response.write(b"".join(c for c in batch if c is not None))
        if done:
            return
