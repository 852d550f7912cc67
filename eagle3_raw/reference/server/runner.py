"""Carrying planned jobs out: inline without capacity mode (the whole output at once), or under
the capacity slots with simulated prefill and decode time, where a generation can wait in the
queue, be refused by a full queue (503), or be aborted part way. Stream chunks go out through the
job's :data:`~.jobs.Emit` as the output grows; the stats counters are updated as jobs end.
"""

from __future__ import annotations

import asyncio

from eagle3_raw.reference.capacity import QueuedAbort, QueueFull, Slots, Ticket, Timing
from eagle3_raw.reference.server.jobs import Emit, Job
from eagle3_raw.reference.server.state import ServerState
from eagle3_raw.sglang import protocol as p


async def run_all(state: ServerState, jobs: list[Job], emit: Emit, streaming: bool) -> None:
    """Run every job; without capacity mode inline, else concurrently under the slots.

    A non-streamed request stops at the first generation that ends in a 400/503 (the whole
    request is refused then, as SGLang's ``gather`` does); the others are cancelled.
    """
    if state.slots is None:
        for job in jobs:
            _run_instant(state, job, emit, streaming)
        return
    tasks = [asyncio.ensure_future(_run_timed(state, job, emit, streaming)) for job in jobs]
    try:
        for next_done in asyncio.as_completed(tasks):
            await next_done
            if not streaming and any(job.refusal_status for job in jobs if job.finish):
                break
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _chunk_lengths(state: ServerState, job: Job) -> list[int]:
    """Output lengths at which the job's stream sends a chunk before the final one (SGLang's cadence)."""
    model = state.model

    def stop_tokens(stop: str) -> int:
        return len(model.encode(stop, add_special_tokens=False))

    held = p.stop_prefix_hold(job.planned, job.sampling, stop_tokens, model.decode_raw)
    return p.chunk_lengths(len(job.planned), job.interval, held)


def _run_instant(state: ServerState, job: Job, emit: Emit, streaming: bool) -> None:
    if job.planned_finish.get("status_code") is None and streaming:
        for k in _chunk_lengths(state, job):
            job.output_ids = job.planned[:k]
            emit(job, False)
    job.end(job.planned, job.planned_finish)
    _finished(state, job, emit)


async def _run_timed(state: ServerState, job: Job, emit: Emit, streaming: bool) -> None:
    assert state.slots is not None and state.config.timing is not None and job.ticket is not None
    if job.planned_finish.get("status_code") is not None:
        job.end([], job.planned_finish)
        return _finished(state, job, emit)
    try:
        steps = _chunk_lengths(state, job) if streaming else []
        await _queue_and_decode(job, state.slots, state.config.timing, job.ticket, emit, steps)
    except asyncio.CancelledError:
        state.counters.aborted_requests += 1  # the client left (or a batch was refused): SGLang aborts
        raise
    _finished(state, job, emit)


async def _queue_and_decode(
    job: Job, slots: Slots, timing: Timing, ticket: Ticket, emit: Emit, steps: list[int]
) -> None:
    try:
        await slots.acquire(ticket)
    except QueuedAbort:
        return job.end([], p.queued_abort(), queued=True)
    except QueueFull:
        return job.end([], p.queued_abort(p.QUEUE_FULL, 503), queued=True)
    try:
        await _decode(job, slots, timing, ticket, emit, steps)
    finally:
        slots.release(ticket)


async def _decode(
    job: Job, slots: Slots, timing: Timing, ticket: Ticket, emit: Emit, steps: list[int]
) -> None:
    """Hold the slot for the prefill, then until each of ``steps`` (the output lengths that send a
    stream chunk) and the end; stop early on an abort."""
    start = slots.now() + timing.prefill_seconds(len(job.input_ids) - job.cached)
    done, total = 0, len(job.planned)
    if await slots.hold_until(ticket, start):
        for k in [*steps, total]:
            if not await slots.hold_until(ticket, start + timing.decode_seconds(k)):
                done = min(timing.tokens_in(slots.now() - start), k)
                break
            done = k
            if k < total:
                job.output_ids = job.planned[:k]
                emit(job, False)
    if ticket.aborted.is_set():
        job.end(job.planned[:done], p.finish_abort())
    else:
        job.end(job.planned, job.planned_finish)


def _finished(state: ServerState, job: Job, emit: Emit) -> None:
    c = state.counters
    if job.finish and job.finish["type"] == "abort":
        c.aborted_requests += 1
    else:
        c.completed_requests += 1
        c.completed_tokens += len(job.output_ids)
        c.prompt_tokens += len(job.input_ids)
        c.cached_tokens += job.cached
    emit(job, True)
