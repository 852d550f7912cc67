"""``POST``/``PUT /generate`` (``shared/sglang-protocol.md`` §1-§5), in SGLang's order: the injected
fault is drawn, the body goes through the gates and normalization, its rids are registered as in
flight, every item is prepared and planned, then one JSON reply is sent (or a stream, :mod:`.streaming`).

Without capacity flags a generation runs inline on the event loop (the engine is fast) and the
response goes out at once; the hot path does one ``orjson`` parse, the gates, one engine call and
one text decode per generation, and one ``orjson`` dump.
"""

from __future__ import annotations

import time

import orjson
from aiohttp import web

from eagle3_raw.reference.server.jobs import Job, no_emit, response_object
from eagle3_raw.reference.server.planning import abort_one, plan, prepare
from eagle3_raw.reference.server.replies import (
    EARLY_FAULTS,
    JSON,
    Exchange,
    early_fault,
    generation_lines,
    refuse,
    send,
)
from eagle3_raw.reference.server.runner import run_all
from eagle3_raw.reference.server.state import ServerState
from eagle3_raw.reference.server.streaming import stream_reply
from eagle3_raw.sglang import protocol as p


class Generate:
    """The ``/generate`` handler over the shared :class:`ServerState`."""

    def __init__(self, state: ServerState) -> None:
        self.state = state

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """``POST``/``PUT /generate``: see ``shared/sglang-protocol.md`` §1-§5."""
        state = self.state
        ex = Exchange(state, request, next(state.sequence), time.monotonic())
        state.counters.generate_requests += 1
        ex.fault = state.faults.draw() if state.faults else None
        if ex.fault in EARLY_FAULTS:
            return await early_fault(ex)
        try:
            ex.body = p.parse_body(await request.read())
            req = p.normalize(ex.body)
            p.check_request(ex.body)
        except (p.GateError, p.RequestError, p.InternalServerError) as exc:
            stream = isinstance(ex.body, dict) and bool(ex.body.get("stream"))  # the body passed both gates
            return await refuse(ex, exc, stream=stream and not isinstance(exc, p.GateError))
        try:
            state.register(req.rids)
        except p.RequestError as exc:
            return await refuse(ex, exc, stream=req.stream)
        rids = [*req.rids, *(item.rid for item in req.items)]
        try:
            return await self._serve(ex, req)
        finally:
            state.unregister(rids)

    async def _serve(self, ex: Exchange, req: p.Normalized) -> web.StreamResponse:
        try:
            p.check_lora(ex.body)
            jobs = prepare(self.state, req)
        except (p.RequestError, p.InternalServerError) as exc:
            return await refuse(ex, exc, stream=req.stream)
        await plan(self.state, jobs, req)
        if ex.fault == "abort":
            ex.fault = "abort" if abort_one(self.state, jobs) else None
            self.state.count_fault(ex.fault)
        if req.stream:
            return await stream_reply(ex, req, jobs)
        return await self._respond(ex, req, jobs)

    async def _respond(self, ex: Exchange, req: p.Normalized, jobs: list[Job]) -> web.StreamResponse:
        """The whole JSON reply, or the 400/503 of the first generation the scheduler refused."""
        refused = next((job for job in jobs if job.refusal_status), None)
        if refused is None:
            await run_all(self.state, jobs, no_emit, False)
            refused = next((job for job in jobs if job.finish and job.refusal_status), None)
        if refused is not None:
            status = refused.refusal_status or 400
            message = str((refused.finish or refused.planned_finish).get("message", ""))
            body = p.value_error_body(message) if status == 400 else p.http_exception_body(status, message)
            return await send(ex, status, orjson.dumps(body), JSON, generation_lines(ex, req, jobs, status))
        drafter = self.state.config.drafter
        objects = [response_object(job, self.state.model, req, ex.received, True, drafter) for job in jobs]
        payload = orjson.dumps(objects[0] if req.is_single else objects)
        return await send(ex, 200, payload, JSON, generation_lines(ex, req, jobs))
