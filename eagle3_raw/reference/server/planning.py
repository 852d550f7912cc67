"""From a normalized request to planned jobs: every item tokenized, validated and its sampling
parsed (:func:`prepare`), then the engine run for each (:func:`plan`): the scheduler's length
refusal, the silent ``max_new_tokens`` clip, stop strings and regexes, the prefix cache; and the
``abort`` fault (:func:`abort_one`).

A plan holds the whole output at once; how it reaches the client (at once, or step by step under
capacity mode's timing) is :mod:`.runner`'s business.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping
from typing import Any

from eagle3_raw.reference.capacity import Ticket
from eagle3_raw.reference.engine import EngineParams
from eagle3_raw.reference.server.jobs import Job
from eagle3_raw.reference.server.state import ServerState
from eagle3_raw.sglang import protocol as p

_YIELD_EVERY = 50_000


def prepare(state: ServerState, req: p.Normalized) -> list[Job]:
    """Tokenize and validate every item, in order (the first failing item decides the 400)."""
    jobs: list[Job] = []
    parsed: dict[int, p.Sampling] = {}  # the items of a batch usually share one sampling_params dict
    preferred = state.config.preferred_sampling_params
    merged: dict[int, Mapping[str, Any]] = {}  # one merged dict per dict sent, so `parsed` still hits
    reserved = state.config.reserved_tokens  # counted with the prompt (tokenizer_manager.py:1335)
    for index, given in enumerate(req.items):
        spec = given
        if preferred:  # SGLang: {**preferred_sampling_params, **sampling_params} (tokenizer_manager.py:1549)
            full = merged.setdefault(id(given.sampling), {**preferred, **given.sampling})
            spec = dataclasses.replace(given, sampling=full)
        ids = p.prompt_ids(spec, state.encode, radix_cache=state.cache is not None)
        p.check_item(spec, len(ids) + reserved, state.model.context_len, state.model.vocab_size)
        sampling = parsed.get(id(spec.sampling))
        if sampling is None:
            sampling = parsed[id(spec.sampling)] = p.parse_sampling(
                spec.sampling, state.model.vocab_size, has_tokenizer=state.encode is not None
            )
        interval = sampling.stream_interval or state.config.stream_interval
        jobs.append(Job(index, spec, ids, sampling, interval))
    if state.slots is not None:
        for job in jobs:
            job.ticket = state.inflight[job.spec.rid] = Ticket(job.spec.rid)
    return jobs


async def plan(state: ServerState, jobs: list[Job], req: p.Normalized) -> None:
    """Run the engine for every job (the timing, if any, is simulated afterwards).

    A big batch would hold the event loop for long: every ``_YIELD_EVERY`` generated ids it lets
    other connections (health probes, aborts) in.
    """
    if req.n > 1 and state.cache is not None:
        for job in jobs[:: req.n]:
            state.cache.insert(job.input_ids)  # SGLang's prefill-only warm-up caches the prompt
    since_yield = 0
    for job in jobs:
        _plan_one(state, job)
        since_yield += len(job.planned)
        if since_yield >= _YIELD_EVERY:
            since_yield = 0
            await asyncio.sleep(0)


def abort_one(state: ServerState, jobs: list[Job]) -> bool:
    """The ``abort`` fault: one generation ends early with a partial output; False if none can."""
    candidates = [job for job in jobs if job.planned_finish["type"] != "abort"]
    if not candidates or state.faults is None:
        return False
    job = candidates[state.faults.cut(len(candidates))]
    job.planned = job.planned[: state.faults.cut(len(job.planned))]
    job.planned_finish = p.finish_abort()
    return True


def _plan_one(state: ServerState, job: Job) -> None:
    refusal = state.limits.refusal(len(job.input_ids))
    if refusal is not None:
        job.planned_finish = p.finish_abort(refusal, 400, "BadRequestError")
        return
    if state.cache is not None:
        job.cached = state.cache.cached_tokens(job.input_ids)
    job.planned, job.planned_finish = _run_engine(state, job)
    if state.cache is not None:
        state.cache.insert(job.input_ids + job.planned[:-1])


def _run_engine(state: ServerState, job: Job) -> tuple[list[int], dict[str, Any]]:
    s = job.sampling
    max_new = state.limits.clip(len(job.input_ids), s.max_new_tokens)
    out = state.model.engine.generate(job.input_ids, _engine_params(s, max_new))
    if s.stop or s.stop_regex:
        hit = p.find_stop(out.output_ids, s, state.model.decode_raw)
        if hit is not None:
            return out.output_ids[: hit[0]], p.finish_stop(hit[1])
    if out.finish == "stop" and out.matched is not None:
        return out.output_ids, p.finish_stop(out.matched)
    return out.output_ids, p.finish_length(max_new)


def _engine_params(s: p.Sampling, max_new: int) -> EngineParams:
    """The engine's parameters for validated sampling, ``max_new_tokens`` already clipped."""
    return EngineParams(
        max_new_tokens=max_new, min_new_tokens=min(s.min_new_tokens, max_new),
        temperature=0.0 if s.greedy else s.temperature, top_p=s.top_p,
        top_k=-1 if s.top_k >= p.TOP_K_ALL else s.top_k, min_p=s.min_p,
        frequency_penalty=s.frequency_penalty, presence_penalty=s.presence_penalty,
        repetition_penalty=s.repetition_penalty, ignore_eos=s.ignore_eos,
        stop_token_ids=s.stop_token_ids, sampling_seed=s.sampling_seed,
    )  # fmt: skip
