"""Sending planned rows: one worker per in-flight slot, retries with backoff, and the journal.

A worker takes the next planned item in canonical order: a :class:`~eagle3_raw.run.plan.Reuse` is
journaled at once, a :class:`~eagle3_raw.run.plan.Skip` recorded, a :class:`~eagle3_raw.run.plan.Job`
sent to the least-loaded healthy endpoint (its conversation's earlier endpoint when it has room,
so the prefix cache hits) and retried on transient errors until the budget is spent. Every
attempt has its own rid; a timed-out one is aborted on the server.

While the journal's disk has no room, no new request goes out (what is generated is held in
memory until it can be written): a worker waits for space, up to ``disk_wait`` seconds of a full
disk, then the run stops (:class:`~eagle3_raw.errors.JournalFull`) and the journal spills what it
holds (:mod:`eagle3_raw.journal.spill`).

A :class:`~eagle3_raw.run.plan.Pending` generation point is rendered by the server's chat path first
(``/tokenize`` with ``messages``; at most :data:`RENDERS_IN_FLIGHT` at a time, taking no generation
slot), then its rows go on like planned ones, the samples side by side. A
:class:`~eagle3_raw.run.plan.Rollout` takes its worker for all its turns (:mod:`eagle3_raw.run.rollout`),
each turn asking for its slot with a priority; once a worker finds the plan exhausted, the pool
drains (:meth:`~eagle3_raw.run.endpoints.EndpointPool.drain`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from eagle3_raw.errors import (
    ConnectError,
    GenerationAborted,
    JournalFull,
    PromptFormatError,
    RequestRejected,
    RequestTimeout,
    RetriesExhausted,
    RetryableError,
    RowError,
    ServerBusy,
    ServerUnreachable,
)
from eagle3_raw.rows import row_id
from eagle3_raw.run.earlystop import EarlyStop
from eagle3_raw.run.plan import Job, Pending, Planned, Reuse, Rollout, Skip
from eagle3_raw.run.retry import Stopping, retried
from eagle3_raw.run.rollout import RolloutRunner
from eagle3_raw.serving import Engine, Generation

if TYPE_CHECKING:
    import aiohttp

    from eagle3_raw.journal import Journal
    from eagle3_raw.recipe import Recipe
    from eagle3_raw.run.endpoints import Endpoint, EndpointPool
    from eagle3_raw.run.feed import JobFeed
    from eagle3_raw.run.mixture import Choice
    from eagle3_raw.run.plan import Planner
    from eagle3_raw.run.progress import RunStats
    from eagle3_raw.run.render import Renderer
    from eagle3_raw.source.prompts import Conversation

log = logging.getLogger("eagle3_raw")
T = TypeVar("T")

_ENDPOINT_FAULTS = (ConnectError, RequestTimeout, ServerBusy, GenerationAborted)

RENDERS_IN_FLIGHT = 32
"""Prompts the server's chat path renders at once for one run (its tokenizer process does the work)."""


class Dispatcher:
    """Workers over a feed of planned items; see the module docstring. Lives on one event loop."""

    def __init__(
        self, recipe: Recipe, session: aiohttp.ClientSession | None, pool: EndpointPool | None,
        journal: Journal, stats: RunStats, *, vocab_size: int, stop: threading.Event,
        planner: Planner | None = None, renderer: Renderer | None = None, disk_wait: float = 600.0,
        early_stop: int = 0, engine: Engine,
    ) -> None:  # fmt: skip
        self.recipe = recipe
        self.engine = engine
        # a journal that holds rows of the set already: the recipe makes rows, nothing to watch
        self.early = EarlyStop(0 if stats.replayed else early_stop)
        self.disk_wait = disk_wait
        self.session = session
        self.pool = pool
        self.journal = journal
        self.stats = stats
        self.vocab_size = vocab_size
        self.eos_ids = renderer.eos_token_ids if renderer is not None else frozenset()
        self.stop = stop
        self.in_flight: dict[str, str] = {}  # rid -> endpoint URL
        self.affinity: dict[int, Endpoint] = {}  # source index -> endpoint of its last request
        self._tasks: set[asyncio.Task[None]] = set()
        self._rid_prefix = uuid.uuid4().hex[:8]  # unique per run; the counter, per attempt
        self._rid_counter = itertools.count()
        self.planner = planner
        self.renderer = renderer
        self._renders = asyncio.Semaphore(RENDERS_IN_FLIGHT)
        self._siblings: set[asyncio.Task[None]] = set()
        self._keeps_text = recipe.turns == "rollout"  # a rollout's next turn is made of this text

    async def work(self, feed: JobFeed) -> None:
        """One worker: items from ``feed`` until the plan is exhausted."""
        while (item := await feed.next()) is not None:
            await self.handle(item)
        if self.pool is not None:
            self.pool.drain()  # the plan is exhausted: what is left is the drain

    async def handle(self, item: Planned) -> None:
        if isinstance(item, Skip):
            self.record_skip(item)
        elif isinstance(item, Reuse):
            self.reuse(item)
        elif isinstance(item, Pending):
            await self._rendered(item)
        elif isinstance(item, Rollout):
            await RolloutRunner(self).run(item)
        else:
            await self.process(item)

    async def _rendered(self, pending: Pending) -> None:
        """Render ``pending`` by the server, then its rows: the first here, its siblings beside it."""
        items = await self._render(pending)
        for item in items[1:]:
            task = asyncio.get_running_loop().create_task(self.handle(item))
            self._siblings.add(task)
            task.add_done_callback(self._siblings.discard)
        if items:
            await self.handle(items[0])

    async def _render(self, pending: Pending) -> list[Planned]:
        assert self.planner is not None and self.renderer is not None
        body = self.renderer.chat_request(pending.conv, pending.turn, choice=pending.choice)
        try:
            ids = await self._tokenize(pending.conv.index, body)
        except RequestRejected as exc:  # the chat path refuses this conversation: its rows are skipped
            return self.planner.refuse(pending, str(exc))
        except RetriesExhausted as exc:
            reason = f"rendering the prompt failed: {exc}"
            conv = pending.conv
            return [
                Skip.from_error(
                    key, RetriesExhausted(reason, row_id=row_id(conv.source_id, key.turn, key.sample))
                )
                for key, _ in pending.keys
            ]
        except Stopping:
            return []
        return self.planner.resolve(pending, ids)

    async def _tokenize(self, index: int, body: Mapping[str, Any]) -> list[int]:
        """The server's chat-path render of ``body`` (at most :data:`RENDERS_IN_FLIGHT` at once)."""
        timeout = self.recipe.server.request_timeout

        async def render(session: aiohttp.ClientSession, url: str) -> list[int]:
            async with self._renders:
                return await self.engine.tokenize_chat(session, url, body, timeout)

        return await self.ask(index, render)

    async def ask(self, index: int, call: Callable[[aiohttp.ClientSession, str], Awaitable[T]]) -> T:
        """``call(session, url)`` on source row ``index``'s endpoint (its generations follow there:
        the prefix cache), retried with backoff on transient errors. Raises
        :class:`RetriesExhausted` after the last attempt, :class:`Stopping` when the run stops."""
        if self.session is None or self.pool is None:
            raise ServerUnreachable(
                f"source row {index} needs the server (its prompt or its previous turn's message), but no "
                "endpoint answers; everything made so far is journaled: start the server and run again"
            )

        session = self.session

        async def attempt(_: int) -> T:
            endpoint = self._endpoint_for(index)
            try:
                return await call(session, endpoint.url)
            except RetryableError:
                self._forget_endpoint(index, endpoint)
                raise

        return await retried(attempt, retries=self.recipe.server.max_retries, stop=self.stop)

    def _endpoint_for(self, index: int) -> Endpoint:
        assert self.pool is not None
        endpoint = self.pool.pick(self.affinity.get(index))
        if endpoint is None:
            raise ConnectError("no endpoint is up")
        self._remember_endpoint(index, endpoint)
        return endpoint

    async def render_history(
        self, conv: Conversation, turn: int, history: list[dict[str, Any]], choice: Choice | None
    ) -> list[int]:
        """The prompt ids of a rollout turn whose history is ``history``: by the server's chat path,
        or here (off the event loop) when the target renders locally. Raises a RowError: the chat
        path refused it (skipped) or the server never answered (failed)."""
        assert self.renderer is not None and self.planner is not None
        if self.planner.render_here:
            return await asyncio.to_thread(
                self.renderer.prompt_ids, conv, turn, choice=choice, history=history
            )
        body = self.renderer.chat_request(conv, turn, choice=choice, history=history)
        try:
            return await self._tokenize(conv.index, body)
        except RequestRejected as exc:
            message = f"row {conv.source_id!r} turn {turn}: the server's chat path refused it ({exc})"
            raise PromptFormatError(message) from exc

    async def drain(self) -> None:
        """Wait for the rows of rendered prompts still running beside the workers (their errors raised)."""
        while self._siblings:
            await asyncio.gather(*list(self._siblings))

    def reuse(self, item: Reuse, extra: Mapping[str, Any] | None = None) -> None:
        """Journal ``item`` as a row made of its journaled generation (``extra``: more row facts)."""
        row = {"source_id": item.source_id, "sampling_seed": item.sampling_seed, "attempts": 0,
               **_mixture(item.mixture), **(extra or {})}  # fmt: skip
        self.journal.add_reused(item.key, digest=item.digest, row=row, alias=item.alias)
        self.stats.reused += 1
        self.settle_watch()

    def record_skip(self, skip: Skip) -> None:
        """Journal ``skip`` (held while the run's first outcomes are watched: :mod:`.earlystop`)."""
        for outcome in self.early.failed(skip):
            self._record_skip(outcome)

    def settle_watch(self) -> None:
        """End the watch over the first outcomes (a row was made, or the plan is done), journaling
        what it held."""
        for outcome in self.early.settled():
            self._record_skip(outcome)

    def _record_skip(self, skip: Skip) -> None:
        self.journal.add_failure(skip.key, skip.row_id, skip.kind, skip.reason)
        if skip.kind == "failed":
            self.stats.failed += 1
        elif skip.kind == "ended":
            self.stats.ended += 1
        else:
            self.stats.skipped += 1

    async def process(self, job: Job) -> None:
        result = await self.generate(job)
        if isinstance(result, tuple):
            self.journal_row(job, *result)

    async def generate(
        self, job: Job, *, priority: int = 0, drain_priority: int | None = None
    ) -> tuple[Generation, int] | Skip | None:
        """``job``'s generation and the attempts it took; else the failure recorded for it (a
        :class:`Skip`), or None when the run is stopping (nothing recorded). The priorities: its
        place in line for a slot (:meth:`~eagle3_raw.run.endpoints.EndpointPool.acquire`)."""
        if self.pool is None:
            raise ServerUnreachable(
                f"row {job.row_id} has to be generated, but no endpoint answers; every row reused so far "
                "is journaled: start the server and run again"
            )
        try:
            await room_in_journal(self.journal, self.disk_wait, self.stop)
        except Stopping:
            return None
        except JournalFull:
            await self._in_flight_done()
            raise
        async with self.early.slot():
            return await self._attempts(job, (priority, drain_priority))

    async def _in_flight_done(self) -> None:
        """Wait (a request timeout at most) until no request is in flight. The run is about to stop
        for a full journal disk: the answers already on their way are held and spilled with the
        rest, instead of being cut off and asked for again by the rerun."""
        assert self.pool is not None
        deadline = time.monotonic() + self.recipe.server.request_timeout
        while any(e.in_flight for e in self.pool.endpoints) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    async def _attempts(
        self, job: Job, priority: tuple[int, int | None]
    ) -> tuple[Generation, int] | Skip | None:
        def counted(_: int) -> None:
            self.stats.retries += 1

        def logged(number: int, exc: RetryableError) -> None:
            log.debug("%s attempt %d: %s", job.row_id, number, exc)

        async def attempt(number: int) -> tuple[Generation, int]:
            return await self._attempt(job, number, priority), number + 1

        try:
            return await retried(
                attempt, retries=self.recipe.server.max_retries, stop=self.stop, on_retry=counted,
                on_failure=logged,
            )  # fmt: skip
        except Stopping:
            return None  # stopping: aborted on purpose, not a failure of this row
        except RowError as exc:  # refused for good, or every attempt failed (RetriesExhausted)
            exc.row_id = job.row_id
            skip = Skip.from_error(job.key, exc)
            self.record_skip(skip)
            return skip

    async def _attempt(self, job: Job, attempt: int, priority: tuple[int, int | None]) -> Generation:
        assert self.pool is not None and self.session is not None
        endpoint = await self.pool.acquire(
            self.affinity.get(job.key.index), priority=priority[0], drain_priority=priority[1]
        )
        # Remembered before the reply: siblings sent meanwhile follow, so the prefix cache hits.
        self._remember_endpoint(job.key.index, endpoint)
        rid = f"{job.row_id}#{attempt}-{self._rid_prefix}{next(self._rid_counter):x}"
        self.in_flight[rid] = endpoint.url
        try:
            generation = await self.engine.generate(
                self.session, endpoint.url, rid=rid, input_ids=job.prompt_ids,
                sampling_params=job.sampling_params, vocab_size=self.vocab_size,
                timeout=self.recipe.server.request_timeout, eos_ids=self.eos_ids,
            )  # fmt: skip
        except BaseException as exc:
            fault = isinstance(exc, _ENDPOINT_FAULTS) and not self.stop.is_set()  # not our own aborts
            await self.pool.release(endpoint, ok=False, endpoint_fault=fault)
            self._forget_endpoint(job.key.index, endpoint)
            if isinstance(exc, RequestTimeout):
                self._background(self.engine.abort(self.session, endpoint.url, rid))
            raise
        finally:
            self.in_flight.pop(rid, None)
        await self.pool.release(endpoint, ok=True)
        # rows name the endpoint by its index: its URL is a host name that a published set must not carry
        return dataclasses.replace(generation, meta={**generation.meta, "endpoint": endpoint.name})

    def journal_row(
        self, job: Job, generation: Generation, attempts: int, extra: Mapping[str, Any] | None = None
    ) -> None:
        """Journal ``job``'s new generation and its row (``extra``: more row facts). A rollout's
        generations keep the server's text: the next turn's history is made of it."""
        info: dict[str, Any] = {
            "finish_reason": generation.finish_reason,
            "sampling_params": job.sampling_params,
            "meta": dict(generation.meta),
        }
        if self._keeps_text and generation.text is not None:
            info["text"] = generation.text
        row = {"source_id": job.source_id, "sampling_seed": job.sampling_seed, "attempts": attempts,
               **_mixture(job.mixture), **(extra or {})}  # fmt: skip
        self.journal.add_generation(
            job.key, digest=job.digest, input_key=job.input_key, prompt_ids=job.prompt_ids,
            output_ids=generation.output_ids, generation=info, row=row,
        )  # fmt: skip
        self.stats.rows += 1
        self.stats.generated_tokens += len(generation.output_ids)
        self.settle_watch()

    def _background(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _forget_endpoint(self, index: int, endpoint: Endpoint) -> None:
        """After a failed request to ``endpoint``: the retry goes to the least loaded endpoint."""
        if self.affinity.get(index) is endpoint:
            del self.affinity[index]

    def _remember_endpoint(self, index: int, endpoint: Endpoint) -> None:
        assert self.pool is not None
        self.affinity[index] = endpoint
        if len(self.affinity) > 4 * self.pool.capacity + 1024:
            for stale in list(self.affinity)[: len(self.affinity) // 2]:
                del self.affinity[stale]

    async def abort(self, pending: Sequence[tuple[str, str]]) -> None:
        """Tell the servers to stop what we will not wait for (Ctrl-C, fatal error), while the
        requests' connections are still open: SGLang drops an abort for a rid it no longer has."""
        if pending and self.session is not None:
            log.warning("aborting %d in-flight requests on the server(s)", len(pending))
            await asyncio.gather(*(self.engine.abort(self.session, url, rid) for rid, url in pending))
            await asyncio.sleep(0.2)  # let the aborted responses arrive before the workers go

    async def settle(self) -> None:
        """Wait for background aborts (each bounded by its own timeout)."""
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def room_in_journal(journal: Journal, limit: float, stop: threading.Event | None = None) -> None:
    """Return once the journal's disk has room (at once when it has). Raises
    :class:`~eagle3_raw.errors.JournalFull` once it has had none for ``limit`` seconds, and
    :class:`Stopping` when ``stop`` is set meanwhile."""
    while (since := journal.full_since) is not None:
        if stop is not None and stop.is_set():
            raise Stopping
        if time.monotonic() - since >= limit:
            raise JournalFull(
                f"the journal's disk has had no space for {limit:,.0f} s (--disk-wait): stopping"
            )
        await asyncio.sleep(0.25)


def _mixture(mixture: Mapping[str, Any] | None) -> dict[str, Any]:
    return {"mixture": dict(mixture)} if mixture is not None else {}
