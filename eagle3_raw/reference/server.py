"""The SGLang-compatible reference server: SGLang 0.5.23's native HTTP API over the tiny engine.

Held to ``shared/sglang-protocol.md``: ``/generate`` (single, batch, ``n > 1``, SSE streams, the
three error shapes, context refusals and the silent ``max_new_tokens`` clip) and the side endpoints
(``/health``, ``/model_info``, ``/server_info``, ``/v1/models``, ``/tokenize``, ``/detokenize``,
``/flush_cache``, ``/abort_request``, ``/v1/loads``). On top, for tests and benchmarks: injected
faults (:mod:`.faults`), capacity mode (:mod:`.capacity`), the ledger (:mod:`.ledger`), and
``GET /reference/stats`` / ``POST /reference/stats/reset``.

Without capacity flags a generation runs inline on the event loop (the engine is fast) and the
response goes out at once; the ``/generate`` hot path does one ``orjson`` parse, the gates, one
engine call and one text decode per generation, and one ``orjson`` dump.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import secrets
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from eagle3_raw.reference import protocol as p
from eagle3_raw.reference.capacity import (
    Counters,
    PrefixCache,
    QueuedAbort,
    QueueFull,
    Slots,
    Ticket,
    Timing,
)
from eagle3_raw.reference.engine import EngineParams, ReferenceEngine
from eagle3_raw.reference.faults import FaultInjector, FaultSpec
from eagle3_raw.reference.ledger import Ledger

VERSION = "0.5.23"
_EARLY_FAULTS = frozenset({"http500", "http503", "hang"})
_JSON, _SSE, _TEXT = "application/json", "text/event-stream", "text/plain"
_YIELD_EVERY = 50_000
Record = dict[str, Any]


@dataclass(frozen=True)
class ServerConfig:
    """Everything ``eagle3-raw serve-reference`` can set; validated here, in one place."""

    host: str = "127.0.0.1"
    port: int = 30000
    api_key: str | None = None
    model_path: Path | None = None
    served_model_name: str | None = None
    context_length: int | None = None
    skip_tokenizer_init: bool = False
    max_running_requests: int | None = None
    max_queued_requests: int | None = None
    disable_radix_cache: bool = False
    stream_interval: int = 1
    faults: FaultSpec | None = None
    slots: int | None = None
    timing: Timing | None = None
    ledger: Path | None = None
    launch_command: str = ""

    def __post_init__(self) -> None:
        if (self.slots is None) != (self.timing is None):
            raise ValueError("--slots and --ms-per-token go together (capacity mode needs both)")
        if self.slots is not None and self.slots < 1:
            raise ValueError(f"--slots must be at least 1, got {self.slots}")
        if self.timing is not None and min(self.timing.ms_per_token, self.timing.prefill_ms_per_token) < 0:
            raise ValueError("--ms-per-token and --prefill-ms-per-token must be >= 0")
        if self.context_length is not None and self.context_length < 8:
            raise ValueError(f"--context-length must be at least 8, got {self.context_length}")
        if self.stream_interval < 1:
            raise ValueError(f"--stream-interval must be at least 1, got {self.stream_interval}")
        if self.max_queued_requests is not None and self.slots is None:
            raise ValueError("--max-queued-requests needs capacity mode (--slots, --ms-per-token)")


class Model:
    """The engine, its tokenizer (unless ``--skip-tokenizer-init``) and what the server reports."""

    def __init__(self, model_path: Path | None, *, tokenizer: bool, context_length: int | None) -> None:
        self.engine = ReferenceEngine(model_path)
        self.path = Path(self.engine.model_dir).resolve()
        self.vocab_size = self.engine.vocab_size
        if context_length is not None and context_length > self.engine.context_length:
            raise ValueError(
                f"--context-length {context_length} is greater than the model's max_position_embeddings "
                f"({self.engine.context_length})"
            )
        self.context_len = context_length or self.engine.context_length
        self.config = _read_json(self.path / "config.json")
        tokenizer_config = _read_json(self.path / "tokenizer_config.json")
        self._clean_up_spaces = bool(tokenizer_config.get("clean_up_tokenization_spaces", False))
        self.model_max_length = tokenizer_config.get("model_max_length")
        self.tokenizer = _load_tokenizer(self.path) if tokenizer else None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        assert self.tokenizer is not None
        ids: list[int] = self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool) -> str:
        """``PreTrainedTokenizerFast.decode`` (including its optional space clean-up)."""
        assert self.tokenizer is not None
        text: str = self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
        return _clean_up_tokenization(text) if self._clean_up_spaces else text

    def decode_raw(self, ids: Sequence[int]) -> str:
        """The text the scheduler matches stop strings against (special tokens kept)."""
        return self.decode(ids, False)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    return data


def _load_tokenizer(path: Path) -> Any:
    from eagle3_raw.reference.model_files import load_raw_tokenizer

    return load_raw_tokenizer(path)


def _clean_up_tokenization(text: str) -> str:
    """``transformers``' ``clean_up_tokenization`` (for tokenizers that ask for it)."""
    for before, after in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                          (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):  # fmt: skip
        text = text.replace(before, after)
    return text


# --- one generation ---------------------------------------------------------------------------


@dataclass(eq=False)
class Job:
    """One generation of a request (a prompt x sample), from its plan to its outcome."""

    index: int
    spec: p.ItemSpec
    input_ids: list[int]
    sampling: p.Sampling
    interval: int
    ticket: Ticket | None = None
    cached: int = 0
    planned: list[int] = field(default_factory=list)
    planned_finish: dict[str, Any] = field(default_factory=dict)
    output_ids: list[int] = field(default_factory=list)
    finish: dict[str, Any] | None = None
    queued: bool = False
    """Ended before leaving the queue (SGLang then sends a smaller ``meta_info``)."""
    ended: float = 0.0
    sent: bool = False

    def end(self, output_ids: list[int], finish: dict[str, Any], *, queued: bool = False) -> None:
        self.output_ids, self.finish, self.queued, self.ended = output_ids, finish, queued, time.monotonic()

    @property
    def refusal_status(self) -> int | None:
        """The HTTP status SGLang turns this generation's abort into (400/503), or None."""
        status = (self.finish or self.planned_finish).get("status_code")
        return status if isinstance(status, int) and status >= 400 else None


Emit = Callable[[Job, bool], None]


@dataclass(eq=False)
class _Context:
    """One ``/generate`` HTTP request: its sequence number, arrival, body and drawn fault."""

    request: web.Request
    seq: int
    received: float
    body: Any = None
    fault: str | None = None


def _fault_record(ctx: _Context, status: int | None) -> Record:
    return {"request": ctx.seq, "status": status, "fault": ctx.fault, "body": ctx.body}


class ReferenceServer:
    """The server's state and its HTTP handlers (one asyncio event loop, so no locks)."""

    def __init__(self, config: ServerConfig, model: Model) -> None:
        self.config = config
        self.model = model
        self.max_total_num_tokens = model.context_len * 256
        self.limits = p.SchedulerLimits(model.context_len, self.max_total_num_tokens)
        self.cache = None if config.disable_radix_cache else PrefixCache(self.max_total_num_tokens)
        self.slots = Slots(config.slots, max_queued=config.max_queued_requests) if config.slots else None
        self.faults = FaultInjector(config.faults) if config.faults else None
        self.ledger = Ledger(config.ledger, config.port) if config.ledger else None
        self.counters = Counters()
        self.inflight: dict[str, Ticket | None] = {}
        self.started = time.time()
        self._sequence = itertools.count()
        self._encode = model.encode if model.tokenizer is not None else None

    @property
    def max_running_requests(self) -> int:
        return self.config.max_running_requests or self.config.slots or 2048

    # --- /generate ----------------------------------------------------------------------------

    async def generate(self, request: web.Request) -> web.StreamResponse:
        """``POST``/``PUT /generate``: see ``shared/sglang-protocol.md`` §1-§5."""
        ctx = _Context(request, next(self._sequence), time.monotonic())
        self.counters.generate_requests += 1
        ctx.fault = self.faults.draw() if self.faults else None
        if ctx.fault in _EARLY_FAULTS:
            return await self._early_fault(ctx)
        try:
            ctx.body = p.parse_body(await request.read())
            req = p.normalize(ctx.body)
            p.check_request(ctx.body)
        except (p.GateError, p.RequestError, p.InternalServerError) as exc:
            stream = isinstance(ctx.body, dict) and bool(ctx.body.get("stream"))  # the body passed both gates
            return await self._refuse(ctx, exc, stream=stream and not isinstance(exc, p.GateError))
        try:
            self._register(req.rids)
        except p.RequestError as exc:
            return await self._refuse(ctx, exc, stream=req.stream)
        rids = [*req.rids, *(item.rid for item in req.items)]
        try:
            return await self._serve(ctx, req)
        finally:
            for rid in rids:
                self.inflight.pop(rid, None)

    def _register(self, rids: Sequence[str]) -> None:
        """SGLang's ``_init_req_state``: a rid already in flight is refused."""
        for rid in rids:
            if rid in self.inflight:
                raise p.RequestError(f"Duplicate request ID detected: {rid}")
        self.inflight.update(dict.fromkeys(rids))

    async def _serve(self, ctx: _Context, req: p.Normalized) -> web.StreamResponse:
        try:
            p.check_lora(ctx.body)
            jobs = self._prepare(req)
        except (p.RequestError, p.InternalServerError) as exc:
            return await self._refuse(ctx, exc, stream=req.stream)
        await self._plan(jobs, req, ctx)
        if req.stream:
            return await self._stream(ctx, req, jobs)
        return await self._respond(ctx, req, jobs)

    def _prepare(self, req: p.Normalized) -> list[Job]:
        """Tokenize and validate every item, in order (the first failing item decides the 400)."""
        jobs: list[Job] = []
        parsed: dict[int, p.Sampling] = {}  # the items of a batch usually share one sampling_params dict
        for index, spec in enumerate(req.items):
            ids = p.prompt_ids(spec, self._encode, radix_cache=self.cache is not None)
            p.check_item(spec, len(ids), self.model.context_len, self.model.vocab_size)
            sampling = parsed.get(id(spec.sampling))
            if sampling is None:
                sampling = parsed[id(spec.sampling)] = p.parse_sampling(
                    spec.sampling, self.model.vocab_size, has_tokenizer=self._encode is not None
                )
            interval = sampling.stream_interval or self.config.stream_interval
            jobs.append(Job(index, spec, ids, sampling, interval))
        if self.slots is not None:
            for job in jobs:
                job.ticket = self.inflight[job.spec.rid] = Ticket(job.spec.rid)
        return jobs

    async def _plan(self, jobs: list[Job], req: p.Normalized, ctx: _Context) -> None:
        """Run the engine for every job (the timing, if any, is simulated afterwards).

        A big batch would hold the event loop for long: every ``_YIELD_EVERY`` generated ids it lets
        other connections (health probes, aborts) in.
        """
        if req.n > 1 and self.cache is not None:
            for job in jobs[:: req.n]:
                self.cache.insert(job.input_ids)  # SGLang's prefill-only warm-up caches the prompt
        since_yield = 0
        for job in jobs:
            self._plan_one(job)
            since_yield += len(job.planned)
            if since_yield >= _YIELD_EVERY:
                since_yield = 0
                await asyncio.sleep(0)
        if ctx.fault == "abort":
            ctx.fault = "abort" if self._abort_one(jobs) else None
            self._count_fault(ctx.fault)

    def _plan_one(self, job: Job) -> None:
        refusal = self.limits.refusal(len(job.input_ids))
        if refusal is not None:
            job.planned_finish = p.finish_abort(refusal, 400, "BadRequestError")
            return
        if self.cache is not None:
            job.cached = self.cache.cached_tokens(job.input_ids)
        job.planned, job.planned_finish = self._run_engine(job)
        if self.cache is not None:
            self.cache.insert(job.input_ids + job.planned[:-1])

    def _run_engine(self, job: Job) -> tuple[list[int], dict[str, Any]]:
        s = job.sampling
        max_new = self.limits.clip(len(job.input_ids), s.max_new_tokens)
        params = EngineParams(
            max_new_tokens=max_new, min_new_tokens=min(s.min_new_tokens, max_new),
            temperature=0.0 if s.greedy else s.temperature, top_p=s.top_p,
            top_k=-1 if s.top_k >= p.TOP_K_ALL else s.top_k, min_p=s.min_p,
            frequency_penalty=s.frequency_penalty, presence_penalty=s.presence_penalty,
            repetition_penalty=s.repetition_penalty, ignore_eos=s.ignore_eos,
            stop_token_ids=s.stop_token_ids, sampling_seed=s.sampling_seed,
        )  # fmt: skip
        out = self.model.engine.generate(job.input_ids, params)
        if s.stop or s.stop_regex:
            hit = p.find_stop(out.output_ids, s, self.model.decode_raw)
            if hit is not None:
                return out.output_ids[: hit[0]], p.finish_stop(hit[1])
        if out.finish == "stop" and out.matched is not None:
            return out.output_ids, p.finish_stop(out.matched)
        return out.output_ids, p.finish_length(max_new)

    def _abort_one(self, jobs: list[Job]) -> bool:
        """The ``abort`` fault: one generation ends early with a partial output."""
        candidates = [job for job in jobs if job.planned_finish["type"] != "abort"]
        if not candidates or self.faults is None:
            return False
        job = candidates[self.faults.cut(len(candidates))]
        job.planned = job.planned[: self.faults.cut(len(job.planned))]
        job.planned_finish = p.finish_abort()
        return True

    # --- running jobs -------------------------------------------------------------------------

    async def _run_all(self, jobs: list[Job], emit: Emit, streaming: bool) -> None:
        """Run every job; without capacity mode inline, else concurrently under the slots.

        A non-streamed request stops at the first generation that ends in a 400/503 (the whole
        request is refused then, as SGLang's ``gather`` does); the others are cancelled.
        """
        if self.slots is None:
            for job in jobs:
                self._run_instant(job, emit, streaming)
            return
        tasks = [asyncio.ensure_future(self._run_timed(job, emit, streaming)) for job in jobs]
        try:
            for next_done in asyncio.as_completed(tasks):
                await next_done
                if not streaming and any(job.refusal_status for job in jobs if job.finish):
                    break
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _run_instant(self, job: Job, emit: Emit, streaming: bool) -> None:
        if job.planned_finish.get("status_code") is None and streaming:
            for k in _steps(len(job.planned), job.interval):
                job.output_ids = job.planned[:k]
                emit(job, False)
        job.end(job.planned, job.planned_finish)
        self._finished(job, emit)

    async def _run_timed(self, job: Job, emit: Emit, streaming: bool) -> None:
        assert self.slots is not None and self.config.timing is not None and job.ticket is not None
        if job.planned_finish.get("status_code") is not None:
            job.end([], job.planned_finish)
            return self._finished(job, emit)
        try:
            await self._queue_and_decode(job, self.slots, self.config.timing, job.ticket, emit, streaming)
        except asyncio.CancelledError:
            self.counters.aborted_requests += 1  # the client left (or a batch was refused): SGLang aborts
            raise
        self._finished(job, emit)

    async def _queue_and_decode(
        self, job: Job, slots: Slots, timing: Timing, ticket: Ticket, emit: Emit, streaming: bool
    ) -> None:
        try:
            await slots.acquire(ticket)
        except QueuedAbort:
            return job.end([], p.queued_abort(), queued=True)
        except QueueFull:
            return job.end([], p.queued_abort(p.QUEUE_FULL, 503), queued=True)
        try:
            await self._decode(job, slots, timing, ticket, emit, streaming)
        finally:
            slots.release(ticket)

    async def _decode(
        self, job: Job, slots: Slots, timing: Timing, ticket: Ticket, emit: Emit, streaming: bool
    ) -> None:
        """Hold the slot for the prefill, then for each streamed step; stop early on an abort."""
        start = slots.now() + timing.prefill_seconds(len(job.input_ids) - job.cached)
        done, total = 0, len(job.planned)
        if await slots.hold_until(ticket, start):
            for k in [*_steps(total, job.interval), total] if streaming else [total]:
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

    def _finished(self, job: Job, emit: Emit) -> None:
        c = self.counters
        if job.finish and job.finish["type"] == "abort":
            c.aborted_requests += 1
        else:
            c.completed_requests += 1
            c.completed_tokens += len(job.output_ids)
            c.prompt_tokens += len(job.input_ids)
            c.cached_tokens += job.cached
        emit(job, True)

    # --- responses ----------------------------------------------------------------------------

    def _object(self, job: Job, req: p.Normalized, received: float, final: bool) -> dict[str, Any]:
        """One response object (or stream chunk) of a job, SGLang's keys in SGLang's order."""
        out: dict[str, Any] = {}
        if self.model.tokenizer is not None:
            out["text"] = self._text(job, final)
        out["output_ids"] = job.output_ids
        if final and job.queued:
            meta = p.queued_abort_meta(job.spec.rid, job.finish or {}, job.ended - received)
        else:
            finish = job.finish if final else None
            meta = p.meta_info(job.spec.rid, finish, len(job.input_ids), len(job.output_ids), job.cached)
            if final:
                meta["e2e_latency"] = job.ended - received
        if not job.sent:
            job.sent = True
            meta["response_sent_to_client_ts"] = time.time()
        out["meta_info"] = meta
        if req.return_prompt_token_ids:
            out["prompt_token_ids"] = job.input_ids
        return out

    def _text(self, job: Job, final: bool) -> str:
        if final:
            return p.output_text(job.output_ids, job.finish, job.sampling, self.model.decode)
        return self.model.decode(job.output_ids, job.sampling.skip_special_tokens).rstrip("\ufffd")

    async def _respond(self, ctx: _Context, req: p.Normalized, jobs: list[Job]) -> web.StreamResponse:
        refused = next((job for job in jobs if job.refusal_status), None)
        if refused is None:
            await self._run_all(jobs, _no_emit, False)
            refused = next((job for job in jobs if job.finish and job.refusal_status), None)
        if refused is not None:
            status = refused.refusal_status or 400
            message = str((refused.finish or refused.planned_finish).get("message", ""))
            body = p.value_error_body(message) if status == 400 else p.http_exception_body(status, message)
            return await self._send(
                ctx, status, orjson.dumps(body), _JSON, self._records(ctx, req, jobs, status)
            )
        objects = [self._object(job, req, ctx.received, True) for job in jobs]
        payload = orjson.dumps(objects[0] if req.is_single else objects)
        return await self._send(ctx, 200, payload, _JSON, self._records(ctx, req, jobs))

    async def _stream(self, ctx: _Context, req: p.Normalized, jobs: list[Job]) -> web.StreamResponse:
        """SSE: cumulative chunks, ``index`` on batch streams, the final chunk as the non-stream object."""
        chunks: asyncio.Queue[bytes | None] = asyncio.Queue()

        def emit(job: Job, final: bool) -> None:
            obj = self._object(job, req, ctx.received, final)
            if not req.is_single:
                obj["index"] = job.index
            chunks.put_nowait(b"data: " + orjson.dumps(obj) + b"\n\n")

        async def produce() -> None:
            await self._run_all(jobs, emit, True)
            chunks.put_nowait(b"data: [DONE]\n\n")
            chunks.put_nowait(None)

        response = _new_response(_SSE)
        if ctx.fault == "reset":
            await produce()
            return await self._reset(ctx, response, b"".join(_drain(chunks)), self._records(ctx, req, jobs))
        logged = False

        def log_before_done() -> None:
            nonlocal logged
            logged = True
            self._log(self._records(ctx, req, jobs), delivered=_connected(ctx.request))

        try:
            await response.prepare(ctx.request)
            await asyncio.gather(produce(), _pump(chunks, response, log_before_done))
        except (asyncio.CancelledError, ConnectionError):
            if not logged:
                self._log(self._records(ctx, req, jobs), delivered=False)
            raise
        await response.write_eof()
        return response

    def _records(self, ctx: _Context, req: p.Normalized, jobs: list[Job], status: int = 200) -> list[Record]:
        """Ledger lines, one per generation (empty without ``--ledger``)."""
        if self.ledger is None:
            return []
        return [
            {
                "request": ctx.seq, "status": status, "fault": ctx.fault, "index": job.index,
                "rid": job.spec.rid, "input_ids": job.input_ids,
                "text": job.spec.prompt if isinstance(job.spec.prompt, str) else None,
                "sampling_params": job.spec.sampling, "output_ids": job.output_ids,
                "finish_reason": job.finish or job.planned_finish, "stream": req.stream,
            }
            for job in jobs
        ]  # fmt: skip

    def _log(self, records: list[Record], *, delivered: bool) -> None:
        if self.ledger is not None and records:
            self.ledger.write([{**record, "delivered": delivered} for record in records])

    async def _refuse(self, ctx: _Context, exc: Exception, *, stream: bool) -> web.StreamResponse:
        """A request refused before any generation, in the shape SGLang uses for ``exc``."""

        def record(status: int, error: Any = None) -> list[Record]:
            return [
                {"request": ctx.seq, "status": status, "fault": ctx.fault, "body": ctx.body, "error": error}
            ]

        if isinstance(exc, p.InternalServerError):
            if stream:  # the stream had started: the connection just breaks
                return await self._reset(ctx, _new_response(_SSE), b"", record(200))
            return await self._send(ctx, 500, b"Internal Server Error", _TEXT, record(500))
        if isinstance(exc, p.GateError):
            return await self._send(ctx, 400, orjson.dumps(exc.body), _JSON, record(400, exc.body))
        if stream:
            event = p.stream_error_event(str(exc))
            payload = b"data: " + orjson.dumps(event) + b"\n\ndata: [DONE]\n\n"
            return await self._send(ctx, 200, payload, _SSE, record(200, event))
        error = p.value_error_body(str(exc))
        return await self._send(ctx, 400, orjson.dumps(error), _JSON, record(400, error))

    def _count_fault(self, fault: str | None) -> None:
        if fault is not None:
            self.counters.faults[fault] = self.counters.faults.get(fault, 0) + 1

    async def _early_fault(self, ctx: _Context) -> web.StreamResponse:
        fault = ctx.fault or ""
        self._count_fault(fault)
        if fault == "http500":
            return await self._send(ctx, 500, b"Internal Server Error", _TEXT, [_fault_record(ctx, 500)])
        if fault == "http503":
            body = p.http_exception_body(503, p.QUEUE_FULL)
            return await self._send(ctx, 503, orjson.dumps(body), _JSON, [_fault_record(ctx, 503)])
        try:
            await asyncio.Event().wait()  # hang: the reply never comes; ends when the client leaves
        finally:
            self._log([_fault_record(ctx, None)], delivered=False)
        raise AssertionError("a hang never ends")

    async def _send(
        self, ctx: _Context, status: int, payload: bytes, content_type: str, records: list[Record]
    ) -> web.StreamResponse:
        """Send a whole response now (or, with the ``reset`` fault, part of it). The ledger line is
        written before the body goes out, so a client holding the response always finds its line."""
        if ctx.fault == "reset":
            return await self._reset(ctx, _new_response(content_type, len(payload), status), payload, records)
        response = web.Response(status=status, body=payload, content_type=content_type)
        try:
            await response.prepare(ctx.request)
        except (asyncio.CancelledError, ConnectionError):
            self._log(records, delivered=False)
            raise
        self._log(records, delivered=_connected(ctx.request))
        await response.write_eof()
        return response

    async def _reset(
        self, ctx: _Context, response: web.StreamResponse, payload: bytes, records: list[Record]
    ) -> web.StreamResponse:
        """Send the headers and part of ``payload``, then abort the connection."""
        if ctx.fault == "reset":
            self._count_fault("reset")
        await response.prepare(ctx.request)
        cut = self.faults.cut(len(payload)) if self.faults else 0
        await response.write(payload[:cut])
        await _flushed(ctx.request)
        if ctx.request.transport is not None:
            ctx.request.transport.abort()
        self._log(records, delivered=False)
        return response

    # --- side endpoints -----------------------------------------------------------------------

    async def health(self, request: web.Request) -> web.StreamResponse:
        """``/health`` and ``/health_generate``: a one-token greedy generation from ``[0]``."""
        from eagle3_raw.reference.engine import EngineParams

        self.model.engine.generate([0], EngineParams(max_new_tokens=1, temperature=0.0))
        return web.Response(status=200)

    async def model_info(self, request: web.Request) -> web.StreamResponse:
        return _json(self.model_info_dict())

    def model_info_dict(self) -> dict[str, Any]:
        return {
            "model_path": str(self.model.path),
            "served_model_name": self.served_model_name,
            "tokenizer_path": str(self.model.path),
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "load_format": "auto",
            "reasoning_parser": None,
            "tool_call_parser": None,
            "disaggregation_mode": "null",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": self.model.config.get("model_type"),
            "architectures": self.model.config.get("architectures"),
        }

    @property
    def served_model_name(self) -> str:
        return self.config.served_model_name or str(self.model.path)

    async def server_info(self, request: web.Request) -> web.StreamResponse:
        return _json(self.server_info_dict())

    def server_info_dict(self) -> dict[str, Any]:
        """Every server argument (``context_length`` null unless passed), scheduler facts, version."""
        c = self.config
        return {
            "model_path": str(self.model.path), "tokenizer_path": str(self.model.path),
            "tokenizer_mode": "auto", "skip_tokenizer_init": c.skip_tokenizer_init, "load_format": "auto",
            "trust_remote_code": False, "context_length": c.context_length, "is_embedding": False,
            "revision": None, "host": c.host, "port": c.port, "served_model_name": self.served_model_name,
            "dtype": "auto", "quantization": None, "device": "cpu", "api_key": "***" if c.api_key else None,
            "max_running_requests": self.max_running_requests, "max_queued_requests": c.max_queued_requests,
            "max_total_tokens": None, "chunked_prefill_size": 8192, "max_prefill_tokens": 16384,
            "schedule_policy": "fcfs", "tp_size": 1, "dp_size": 1, "pp_size": 1,
            "stream_interval": c.stream_interval, "incremental_streaming_output": False,
            "random_seed": None, "enable_deterministic_inference": True, "allow_auto_truncate": False,
            "disable_radix_cache": c.disable_radix_cache, "enable_return_hidden_states": False,
            "enable_custom_logit_processor": False, "preferred_sampling_params": None,
            "sampling_defaults": "model", "launch_command": c.launch_command, "status": "ready",
            "max_total_num_tokens": self.max_total_num_tokens,
            "max_req_input_len": self.limits.max_req_input_len,
            "startup_time": self.started, "kv_events": None, "internal_states": [self._internal_state()],
            "version": VERSION, "frontend": "python", "reference": self._reference_info(),
        }  # fmt: skip

    def _internal_state(self) -> dict[str, Any]:
        return {
            "effective_max_running_requests_per_dp": self.max_running_requests,
            "last_gen_throughput": 0.0,
            "#running-req": self.slots.running if self.slots else 0,
            "#queue-req": self.slots.queue_depth if self.slots else 0,
            "memory_usage": {},
        }

    def _reference_info(self) -> dict[str, Any]:
        c = self.config
        return {
            "faults": dict(c.faults.rates) if c.faults else None,
            "fault_seed": c.faults.seed if c.faults else None,
            "slots": c.slots,
            "ms_per_token": c.timing.ms_per_token if c.timing else None,
            "prefill_ms_per_token": c.timing.prefill_ms_per_token if c.timing else None,
            "ledger": str(c.ledger) if c.ledger else None,
        }

    async def models(self, request: web.Request) -> web.StreamResponse:
        card = {
            "id": self.served_model_name, "object": "model", "created": int(self.started),
            "owned_by": "sglang",
            "root": self.served_model_name, "parent": None, "max_model_len": self.model.context_len,
        }  # fmt: skip
        return _json({"object": "list", "data": [card]})

    async def loads(self, request: web.Request) -> web.StreamResponse:
        running = self.slots.running if self.slots else 0
        waiting = self.slots.queue_depth if self.slots else 0
        load = {
            "timestamp": time.time(), "dp_rank": 0, "num_running_reqs": running,
            "num_waiting_reqs": waiting, "max_total_num_tokens": self.max_total_num_tokens,
            "max_running_requests": self.max_running_requests,
            "utilization": running / self.slots.slots if self.slots else 0.0,
        }  # fmt: skip
        return _json(
            {"timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "version": VERSION,
             "accelerator": None, "num_accelerators": 1, "loads": [load]}
        )  # fmt: skip

    async def tokenize(self, request: web.Request) -> web.StreamResponse:
        """``/tokenize``: ``{"prompt": str | [str], "add_special_tokens": true}`` → tokens, count."""
        body = await _json_body(request)
        prompt: Any = body.get("prompt")
        add_special = body.get("add_special_tokens", True)
        valid = isinstance(prompt, str) or (
            isinstance(prompt, list) and all(isinstance(t, str) for t in prompt)
        )
        if not valid or "messages" in body or not isinstance(add_special, bool):
            return _json(_validation_body("prompt", prompt), 400)
        if self.model.tokenizer is None:
            error = "Internal server error during tokenization: the server runs with --skip-tokenizer-init"
            return _json(p.error_object(error, "InternalServerError", 500), 500)
        limit = self.model.model_max_length
        limit = limit if isinstance(limit, int) and -(2**63) <= limit < 2**64 else self.model.context_len
        if isinstance(prompt, str):
            ids = self.model.encode(prompt, add_special)
            return _json({"tokens": ids, "count": len(ids), "max_model_len": limit})
        rows = [self.model.encode(text, add_special) for text in prompt]
        return _json({"tokens": rows, "count": [len(ids) for ids in rows], "max_model_len": limit})

    async def detokenize(self, request: web.Request) -> web.StreamResponse:
        """``/detokenize``: ``{"tokens": [int] | [[int]], "skip_special_tokens": true}`` → text."""
        body = await _json_body(request)
        tokens: Any = body.get("tokens")
        skip = body.get("skip_special_tokens", True)
        nested = isinstance(tokens, list) and bool(tokens) and isinstance(tokens[0], list)
        rows: list[Any] = tokens if nested else [tokens]
        if not all(_is_id_list(row) for row in rows) or not isinstance(skip, bool):
            return _json(_validation_body("tokens", tokens), 400)
        if self.model.tokenizer is None:
            error = "Internal server error during detokenization: the server runs with --skip-tokenizer-init"
            return _json(p.error_object(error, "InternalServerError", 500), 500)
        try:
            texts = [self.model.decode(row, skip) for row in rows]
        except (OverflowError, ValueError, TypeError) as exc:
            message = f"Error decoding tokens: {exc}. Input tokens might be invalid for the model."
            return _json(p.error_object(message, "DecodeError", 400), 400)
        return _json({"text": texts if nested else texts[0]})

    async def flush_cache(self, request: web.Request) -> web.StreamResponse:
        """``/flush_cache``: clears the prefix cache; refused (400) while generations run or wait."""
        if self.slots is not None and (self.slots.running or self.slots.queue_depth):
            return web.Response(status=400, text="Flush cache failed.\n")
        if self.cache is not None:
            self.cache.clear()
        text = (
            "Cache flushed.\nPlease check backend logs for more details. "
            "(When there are running or waiting requests, the operation will not be performed.)\n"
        )
        return web.Response(status=200, text=text)

    async def abort_request(self, request: web.Request) -> web.StreamResponse:
        """``/abort_request``: ``{"rid": ..., "abort_all": false}``; exact rid, in flight only."""
        body = await _json_body(request)
        rid, abort_all = body.get("rid", ""), body.get("abort_all", False)
        if not isinstance(rid, str) or not isinstance(abort_all, bool):
            return _json(_validation_body("rid", rid), 400)
        tickets = list(self.inflight.values()) if abort_all else [self.inflight.get(rid)] if rid else []
        for ticket in tickets:
            if ticket is not None and self.slots is not None:
                self.slots.abort(ticket)
        return web.Response(status=200)

    async def stats(self, request: web.Request) -> web.StreamResponse:
        """``GET /reference/stats``: slots, busy-slot seconds, wall seconds, counters, faults."""
        return _json(self.counters.snapshot(self.slots, self.config.timing))

    async def reset_stats(self, request: web.Request) -> web.StreamResponse:
        self.counters = Counters()
        if self.slots is not None:
            self.slots.reset_accounting()
        return _json(self.counters.snapshot(self.slots, self.config.timing))

    def close(self) -> None:
        if self.ledger is not None:
            self.ledger.close()


def _no_emit(job: Job, final: bool) -> None:
    return None


def _steps(length: int, interval: int) -> list[int]:
    """Output lengths at which a stream sends a chunk before the final one (the first id at once)."""
    return sorted({1, *range(interval, length, interval)} - {length}) if length > 1 else []


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


def _connected(request: web.Request) -> bool:
    transport = request.transport
    return transport is not None and not transport.is_closing()


async def _flushed(request: web.Request) -> None:
    """Let the transport hand what was written to the socket (before an abort throws it away)."""
    for _ in range(100):
        transport = request.transport
        if transport is None or transport.get_write_buffer_size() == 0:
            return
        await asyncio.sleep(0.001)


def _new_response(
    content_type: str, content_length: int | None = None, status: int = 200
) -> web.StreamResponse:
    response = web.StreamResponse(status=status)
    response.content_type = content_type
    if content_length is not None:
        response.content_length = content_length
    return response


def _is_id_list(row: Any) -> bool:
    return isinstance(row, list) and all(type(t) is int for t in row)


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


async def _json_body(request: web.Request) -> dict[str, Any]:
    try:
        body = orjson.loads(await request.read() or b"{}")
    except orjson.JSONDecodeError:
        return {"__invalid__": True}
    return body if isinstance(body, dict) else {"__invalid__": True}


def _validation_body(field_name: str, value: Any) -> dict[str, Any]:
    """FastAPI's 400 for a body that does not fit the endpoint's pydantic model."""
    return p.validation_error("value_error", (field_name,), "Input should be valid", value).body


# --- the application --------------------------------------------------------------------------

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_OPEN_PATHS = ("/health", "/ready", "/metrics")


def _auth_middleware(api_key: str) -> Any:
    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method != "OPTIONS" and not request.path.startswith(_OPEN_PATHS):
            scheme, _, token = request.headers.get("Authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not secrets.compare_digest(token, api_key):
                return _json({"error": "Unauthorized"}, 401)
        return await handler(request)

    return check


@web.middleware
async def _fastapi_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """FastAPI's JSON bodies for unknown paths and wrong methods."""
    try:
        return await handler(request)
    except web.HTTPNotFound:
        return _json({"detail": "Not Found"}, 404)
    except web.HTTPMethodNotAllowed:
        return _json({"detail": "Method Not Allowed"}, 405)


def build_app(server: ReferenceServer) -> web.Application:
    """The aiohttp application serving ``server``'s routes."""
    middlewares = [_fastapi_errors]
    if server.config.api_key:
        middlewares.append(_auth_middleware(server.config.api_key))
    app = web.Application(middlewares=middlewares, client_max_size=1 << 30)
    routes: list[tuple[str, str, Handler]] = [
        ("POST", "/generate", server.generate), ("PUT", "/generate", server.generate),
        ("GET", "/health", server.health), ("GET", "/health_generate", server.health),
        ("GET", "/model_info", server.model_info), ("GET", "/get_model_info", server.model_info),
        ("GET", "/server_info", server.server_info), ("GET", "/get_server_info", server.server_info),
        ("GET", "/v1/models", server.models), ("GET", "/v1/loads", server.loads),
        ("POST", "/tokenize", server.tokenize), ("POST", "/v1/tokenize", server.tokenize),
        ("POST", "/detokenize", server.detokenize), ("POST", "/v1/detokenize", server.detokenize),
        ("GET", "/flush_cache", server.flush_cache), ("POST", "/flush_cache", server.flush_cache),
        ("POST", "/abort_request", server.abort_request),
        ("GET", "/reference/stats", server.stats), ("POST", "/reference/stats/reset", server.reset_stats),
    ]  # fmt: skip
    for method, path, handler in routes:
        app.router.add_route(method, path, handler)
    return app


async def serve(config: ServerConfig, *, ready: Callable[[str], None] | None = None) -> None:
    """Load the model, serve until cancelled (SIGINT/SIGTERM), then close cleanly."""
    tokenizer, context_length = not config.skip_tokenizer_init, config.context_length
    server = ReferenceServer(
        config, Model(config.model_path, tokenizer=tokenizer, context_length=context_length)
    )
    app = build_app(server)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    try:
        await web.TCPSite(runner, config.host, config.port, reuse_address=True).start()
        if ready is not None:
            ready(f"http://{config.host}:{config.port}")
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
        server.close()
