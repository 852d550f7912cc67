"""One vLLM-mode generation, from its request to its outcome: :class:`Generation`, what the
reference engine makes of it (:func:`plan`), and carrying it out (:func:`carry_out`: at once, or under
capacity mode's slots with simulated prefill and decode time, where an abort ends it part way).

vLLM keeps a stop id or EOS as the last output id; ``stop_reason`` is the stop id, or null for EOS
and for ``length``; an aborted generation finishes ``abort`` with the ids made so far.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from eagle3_raw.reference.capacity import QueuedAbort, Ticket
from eagle3_raw.reference.engine import EngineOutput, collect
from eagle3_raw.reference.server.state import ServerState
from eagle3_raw.reference.vllmapi.sampling import Sampling, engine_params


@dataclass(eq=False)
class Generation:
    """One request's single generation: the engine's id, the prompt ids and the fitted ``max_tokens``."""

    route: str
    engine_id: str
    prompt: list[int]
    sampling: Sampling
    sampling_given: Mapping[str, Any]
    max_tokens: int
    return_token_ids: bool
    ticket: Ticket | None = None
    cached: int = 0
    planned: list[int] = field(default_factory=list)
    planned_finish: str = "length"
    planned_stop_reason: int | None = None
    output: list[int] = field(default_factory=list)
    finish: str = "length"
    stop_reason: int | None = None
    created: int = field(default_factory=lambda: int(time.time()))

    def end(self, output: list[int], finish: str, stop_reason: int | None) -> None:
        self.output, self.finish, self.stop_reason = output, finish, stop_reason

    def end_as_planned(self) -> None:
        self.end(self.planned, self.planned_finish, self.planned_stop_reason)

    def abort(self, done: int) -> None:
        self.end(self.planned[:done], "abort", None)


def plan(state: ServerState, gen: Generation) -> None:
    """Run the engine for ``gen`` (its timing, if any, is simulated by :func:`carry_out`)."""
    if state.cache is not None:
        gen.cached = state.cache.cached_tokens(gen.prompt)
    params = engine_params(gen.sampling, gen.max_tokens)
    eos = state.model.engine.eos_token_id
    forced = _forced_stream(gen.sampling, eos)
    if forced is not None:
        out: EngineOutput = collect(forced, params, eos)
    else:
        out = state.model.engine.generate(gen.prompt, params)
    gen.planned = out.output_ids
    if out.finish == "stop":
        gen.planned_finish, gen.planned_stop_reason = "stop", None if out.matched == eos else out.matched
    if state.cache is not None:
        state.cache.insert(gen.prompt + gen.planned[:-1])


def _forced_stream(s: Sampling, eos: int) -> Any:
    """The endless stream of a ``logit_bias``-forced id (None: not forced, or forced to a stop id
    that ``min_tokens`` still holds back: the engine then writes as usual)."""
    if s.forced_id is None:
        return None
    stops = frozenset() if s.ignore_eos else s.stop_token_ids | {eos}
    if s.forced_id in stops and s.min_tokens > 0:
        return None
    return itertools.repeat([s.forced_id])


async def carry_out(state: ServerState, gen: Generation) -> None:
    """End ``gen``: at once without capacity mode, else after its simulated time in a slot (an
    abort, :meth:`Slots.abort`, ends it with the ids decoded so far)."""
    slots, timing, ticket = state.slots, state.config.timing, gen.ticket
    if slots is None or timing is None or ticket is None:
        gen.end_as_planned()
        return
    try:
        await slots.acquire(ticket)
    except QueuedAbort:
        gen.abort(0)
        return
    try:
        start = slots.now() + timing.prefill_seconds(len(gen.prompt) - gen.cached)
        total = len(gen.planned)
        if await slots.hold_until(ticket, start) and await slots.hold_until(
            ticket, start + timing.decode_seconds(total)
        ):
            gen.end_as_planned()
        else:
            gen.abort(min(max(timing.tokens_in(slots.now() - start), 0), total))
    finally:
        slots.release(ticket)


def count(state: ServerState, gen: Generation) -> None:
    """The stats counters, once ``gen`` has ended."""
    c = state.counters
    if gen.finish == "abort":
        c.aborted_requests += 1
        return
    c.completed_requests += 1
    c.completed_tokens += len(gen.output)
    c.prompt_tokens += len(gen.prompt)
    c.cached_tokens += gen.cached
