"""``POST /v1/completions`` and ``POST /inference/v1/generate`` in vLLM mode, in this order: the
injected fault is drawn (``http500``/``http503`` answer at once), the body is read into a
:class:`Generation` (:mod:`.requests`; a refusal is vLLM's ``ErrorResponse``), its engine id is
registered as in flight (for ``/inference/v1/abort_requests``), the engine plans it, the ``abort``
fault cuts it, the ``hang`` fault holds it (until the client leaves, or an abort: then a 200
``abort``), capacity mode times it, and the reply goes out (the ``reset`` fault breaks it). Every
outcome is a ledger line (:mod:`eagle3_raw.reference.ledger`) with ``endpoint`` the route,
``rid`` the engine id, and ``finish_reason``/``stop_reason`` as vLLM reports them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web

from eagle3_raw.reference.capacity import Ticket
from eagle3_raw.reference.server.replies import JSON, Exchange, send
from eagle3_raw.reference.server.state import ServerState
from eagle3_raw.reference.vllmapi.errors import VLLMError, error_body
from eagle3_raw.reference.vllmapi.plan import Generation, carry_out, count, plan
from eagle3_raw.reference.vllmapi.replies import completion_reply, generate_reply
from eagle3_raw.reference.vllmapi.requests import COMPLETIONS, completion_request, generate_request

Reader = Callable[[ServerState, Any, "str | None"], Generation]
Record = dict[str, Any]


class Generations:
    """The two generation routes over the shared :class:`ServerState`."""

    def __init__(self, state: ServerState) -> None:
        self.state = state

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, completion_request)

    async def generate(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, generate_request)

    async def _handle(self, request: web.Request, read: Reader) -> web.StreamResponse:
        state = self.state
        ex = Exchange(state, request, next(state.sequence), time.monotonic())
        state.counters.generate_requests += 1
        ex.fault = state.faults.draw() if state.faults else None
        if ex.fault in ("http500", "http503"):
            return await _early_fault(ex, request.path)
        try:
            ex.body = orjson.loads(await request.read() or b"{}")
            gen = read(state, ex.body, request.headers.get("X-Request-Id"))
        except orjson.JSONDecodeError:
            return await _refuse(ex, request.path, VLLMError("Expecting value: the body is not JSON"))
        except VLLMError as exc:
            return await _refuse(ex, request.path, exc)
        if gen.engine_id in state.inflight:
            return await _refuse(ex, request.path, VLLMError(f"Request id {gen.engine_id} already running."))
        gen.ticket = state.inflight[gen.engine_id] = Ticket(gen.engine_id)
        try:
            return await self._serve(ex, gen)
        finally:
            state.inflight.pop(gen.engine_id, None)

    async def _serve(self, ex: Exchange, gen: Generation) -> web.StreamResponse:
        state = self.state
        plan(state, gen)
        if ex.fault == "abort" and state.faults is not None:
            state.count_fault("abort")
            cut = state.faults.cut(len(gen.planned))
            gen.planned, gen.planned_finish, gen.planned_stop_reason = gen.planned[:cut], "abort", None
        try:
            await (_hang(ex, gen) if ex.fault == "hang" else carry_out(state, gen))
        except asyncio.CancelledError:
            state.counters.aborted_requests += 1  # the client left: vLLM aborts the request
            raise
        count(state, gen)
        reply = completion_reply if gen.route == COMPLETIONS else generate_reply
        payload = orjson.dumps(reply(state, gen))
        return await send(ex, 200, payload, JSON, [_line(ex, gen)])


async def _hang(ex: Exchange, gen: Generation) -> None:
    """No reply until the client leaves (the line then says so), or until the engine id is aborted."""
    ex.state.count_fault("hang")
    assert gen.ticket is not None
    try:
        await gen.ticket.aborted.wait()
    except asyncio.CancelledError:
        ex.state.log([_line(ex, gen, None)], delivered=False)
        raise
    gen.abort(0)


async def _early_fault(ex: Exchange, route: str) -> web.StreamResponse:
    fault = ex.fault or ""
    ex.state.count_fault(fault)
    status = 500 if fault == "http500" else 503
    message = "Internal Server Error" if status == 500 else "The server is overloaded (injected fault)"
    body = error_body(message, status)
    return await send(ex, status, orjson.dumps(body), JSON, [_refusal_line(ex, route, status, body)])


async def _refuse(ex: Exchange, route: str, exc: VLLMError) -> web.StreamResponse:
    lines = [_refusal_line(ex, route, exc.status, exc.body)]
    return await send(ex, exc.status, orjson.dumps(exc.body), JSON, lines)


def _refusal_line(ex: Exchange, route: str, status: int, error: Any) -> Record:
    return {"endpoint": route, "request": ex.seq, "status": status, "fault": ex.fault, "body": ex.body,
            "error": error}  # fmt: skip


def _line(ex: Exchange, gen: Generation, status: int | None = 200) -> Record:
    """The generation's ledger line (``status`` None: no reply was sent)."""
    return {
        "endpoint": gen.route, "request": ex.seq, "status": status, "fault": ex.fault, "index": 0,
        "rid": gen.engine_id, "input_ids": gen.prompt, "text": None,
        "sampling_params": gen.sampling_given, "output_ids": gen.output, "finish_reason": gen.finish,
        "stop_reason": gen.stop_reason, "stream": False, "spec": None,
    }  # fmt: skip
