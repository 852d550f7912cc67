"""Getting a ``/generate`` reply out: whole responses, refusals in the shape SGLang uses for each
error, the injected faults that break a reply (``http500``, ``http503``, ``reset``, ``hang``), and
the ledger lines, written just before the last bytes of their response go out (so a client holding
a response always finds its line).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from eagle3_raw.reference.server.jobs import Job
from eagle3_raw.reference.server.state import ServerState
from eagle3_raw.reference.speculation import Drafter
from eagle3_raw.sglang import protocol as p

JSON, SSE, TEXT = "application/json", "text/event-stream", "text/plain"
SSE_DONE = b"data: [DONE]\n\n"
EARLY_FAULTS = frozenset({"http500", "http503", "hang"})
"""Faults that replace the reply before the body is even read."""
_INTERNAL_ERROR = b"Internal Server Error"
Record = dict[str, Any]


@dataclass(eq=False)
class Exchange:
    """One ``/generate`` HTTP request: its sequence number, arrival, body and drawn fault."""

    state: ServerState
    request: web.Request
    seq: int
    received: float
    body: Any = None
    fault: str | None = None


def json_response(body: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(body), content_type=JSON)


def sse_event(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def new_response(
    content_type: str, content_length: int | None = None, status: int = 200
) -> web.StreamResponse:
    response = web.StreamResponse(status=status)
    response.content_type = content_type
    if content_length is not None:
        response.content_length = content_length
    return response


def connected(request: web.Request) -> bool:
    transport = request.transport
    return transport is not None and not transport.is_closing()


def generation_lines(ex: Exchange, req: p.Normalized, jobs: list[Job], status: int = 200) -> list[Record]:
    """Ledger lines, one per generation (empty without ``--ledger``)."""
    if ex.state.ledger is None:
        return []
    drafter = ex.state.config.drafter
    return [
        {
            "request": ex.seq, "status": status, "fault": ex.fault, "index": job.index,
            "rid": job.spec.rid, "input_ids": job.input_ids,
            "text": job.spec.prompt if isinstance(job.spec.prompt, str) else None,
            "sampling_params": job.spec.sampling, "output_ids": job.output_ids,
            "finish_reason": job.finish or job.planned_finish, "stream": req.stream,
            "spec": _figures(drafter, job),
        }
        for job in jobs
    ]  # fmt: skip


def _figures(drafter: Drafter | None, job: Job) -> dict[str, Any] | None:
    """The speculative figures a finished generation's ``meta_info`` carried (None: none)."""
    if drafter is None or job.finish is None or job.queued:
        return None
    return drafter.figures(job.input_ids, job.output_ids) or None


def _request_line(ex: Exchange, status: int | None) -> Record:
    """The ledger line of a request that got no generation (refused, or an injected fault)."""
    return {"request": ex.seq, "status": status, "fault": ex.fault, "body": ex.body}


async def send(
    ex: Exchange, status: int, payload: bytes, content_type: str, records: list[Record]
) -> web.StreamResponse:
    """Send a whole response now (or, with the ``reset`` fault, part of it). The ledger line is
    written before the body goes out, so a client holding the response always finds its line."""
    if ex.fault == "reset":
        return await reset(ex, new_response(content_type, len(payload), status), payload, records)
    response = web.Response(status=status, body=payload, content_type=content_type)
    try:
        await response.prepare(ex.request)
    except (asyncio.CancelledError, ConnectionError):
        ex.state.log(records, delivered=False)
        raise
    ex.state.log(records, delivered=connected(ex.request))
    await response.write_eof()
    return response


async def reset(
    ex: Exchange, response: web.StreamResponse, payload: bytes, records: list[Record]
) -> web.StreamResponse:
    """Send the headers and part of ``payload``, then abort the connection."""
    if ex.fault == "reset":
        ex.state.count_fault("reset")
    await response.prepare(ex.request)
    cut = ex.state.faults.cut(len(payload)) if ex.state.faults else 0
    await response.write(payload[:cut])
    await _flushed(ex.request)
    if ex.request.transport is not None:
        ex.request.transport.abort()
    ex.state.log(records, delivered=False)
    return response


async def refuse(ex: Exchange, exc: Exception, *, stream: bool) -> web.StreamResponse:
    """A request refused before any generation, in the shape SGLang uses for ``exc``."""

    def lines(status: int, error: Any = None) -> list[Record]:
        return [{**_request_line(ex, status), "error": error}]

    if isinstance(exc, p.InternalServerError):
        if stream:  # the stream had started: the connection just breaks
            return await reset(ex, new_response(SSE), b"", lines(200))
        return await send(ex, 500, _INTERNAL_ERROR, TEXT, lines(500))
    if isinstance(exc, p.GateError):
        return await send(ex, 400, orjson.dumps(exc.body), JSON, lines(400, exc.body))
    if stream:
        event = p.stream_error_event(str(exc))
        return await send(ex, 200, sse_event(event) + SSE_DONE, SSE, lines(200, event))
    error = p.value_error_body(str(exc))
    return await send(ex, 400, orjson.dumps(error), JSON, lines(400, error))


async def early_fault(ex: Exchange) -> web.StreamResponse:
    """Carry out an :data:`EARLY_FAULTS` fault instead of the reply."""
    fault = ex.fault or ""
    ex.state.count_fault(fault)
    if fault == "http500":
        return await send(ex, 500, _INTERNAL_ERROR, TEXT, [_request_line(ex, 500)])
    if fault == "http503":
        body = p.http_exception_body(503, p.QUEUE_FULL)
        return await send(ex, 503, orjson.dumps(body), JSON, [_request_line(ex, 503)])
    try:
        await asyncio.Event().wait()  # hang: the reply never comes; ends when the client leaves
    finally:
        ex.state.log([_request_line(ex, None)], delivered=False)
    raise AssertionError("a hang never ends")


async def _flushed(request: web.Request) -> None:
    """Let the transport hand what was written to the socket (before an abort throws it away)."""
    for _ in range(100):
        transport = request.transport
        if transport is None or transport.get_write_buffer_size() == 0:
            return
        await asyncio.sleep(0.001)
