"""Orchestration of a build: connect, check, plan, dispatch, journal, summarize.

Order of a run: load the tokenizer, start the reference server if the recipe asks for it, read
every endpoint's identity and check its tokenizer (all before any data is generated), open the
journal (refusing a resume against a different server), then plan jobs in a worker thread while
workers send them through the endpoint pool. Finished rows go to the journal as they come; the
journal is what the builder reads, in canonical order, once every job has an outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import signal
import threading
import uuid
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3_raw import sglang
from eagle3_raw.endpoints import Endpoint, EndpointPool
from eagle3_raw.errors import (
    ConnectError,
    FatalError,
    GenerationAborted,
    Interrupted,
    RecipeError,
    RequestTimeout,
    RetriesExhausted,
    RetryableError,
    RowError,
    ServerBusy,
    ServerMismatch,
    ServerUnreachable,
)
from eagle3_raw.plan import Job, Limits, Shard, Skip, plan_jobs
from eagle3_raw.progress import ProgressDisplay, ProgressMode, RunStats, Summary
from eagle3_raw.recipe import MANAGED_SAMPLING_KEYS
from eagle3_raw.redact import scrub
from eagle3_raw.rows import Row
from eagle3_raw.shards import mark_complete

if TYPE_CHECKING:
    from eagle3_raw.journal import Journal
    from eagle3_raw.recipe import Recipe
    from eagle3_raw.render import Renderer

log = logging.getLogger("eagle3_raw")

DEFAULT_IN_FLIGHT = 128
"""Per-endpoint in-flight limit when the server does not report ``max_running_requests``."""

MAX_DEFAULT_IN_FLIGHT = 1024
"""Cap of the derived per-endpoint limit (set ``server.max_in_flight`` to go past it)."""

_CHUNK = 64
_TOKENIZE_ATTEMPTS = 3
# Preferred sampling params that cannot change a row: every job sends its own sampling_seed, and
# stream_interval only paces streamed replies.
_HARMLESS_PREFERRED = frozenset({"sampling_seed", "stream_interval"})
_ENDPOINT_FAULTS = (ConnectError, RequestTimeout, ServerBusy, GenerationAborted)


@dataclass(frozen=True)
class RunOptions:
    """How to run a recipe (none of it changes the data)."""

    journal_dir: Path | None = None
    shard: Shard = field(default_factory=Shard)
    allow_server_change: bool = False
    retry_failed: bool = False
    progress: ProgressMode = "bar"
    log_interval: float = 30.0
    generate: bool = True
    """False: send nothing; the set is assembled from what the journal holds (``eagle3-raw merge``)."""

    def __post_init__(self) -> None:
        if self.progress not in ("bar", "log", "none"):
            raise RecipeError("progress", self.progress, "expected one of: bar, log, none")
        if self.log_interval <= 0:
            raise RecipeError("log_interval", self.log_interval, "expected a positive number of seconds")


@dataclass(frozen=True)
class RunResult:
    """Where the rows are, and what the run did."""

    journal_dir: Path
    summary: Summary


def journal_dir_for(recipe: Recipe, journal_dir: Path | None = None) -> Path:
    """The journal folder of ``recipe``: ``<root>/<name>-<fingerprint>``."""
    from eagle3_raw.journal import journal_root

    return (journal_dir or journal_root()) / recipe.config_id


def run(recipe: Recipe, options: RunOptions | None = None) -> RunResult:
    """Generate every missing row of ``recipe`` into its journal; see the module docstring.

    Raises a :class:`~eagle3_raw.errors.FatalError` when the run cannot go on (the journal keeps
    everything finished), and :class:`~eagle3_raw.errors.Interrupted` on Ctrl-C or SIGTERM.
    """
    from eagle3_raw.render import Renderer

    options = options or RunOptions()
    if not options.generate:
        return assemble(recipe, options)
    renderer = Renderer(recipe)
    with launched_endpoints(recipe) as endpoints:
        build = _Run(recipe, options, renderer, endpoints)
        try:
            return asyncio.run(build.main())
        except (KeyboardInterrupt, asyncio.CancelledError) as exc:
            raise Interrupted(build.interrupted_message()) from exc


def launched_endpoints(recipe: Recipe) -> contextlib.AbstractContextManager[tuple[str, ...]]:
    """The recipe's endpoints, plus a reference server started for the run if it asks for one."""
    from eagle3_raw.reference.launch import recipe_endpoints

    return recipe_endpoints(recipe, _api_key(recipe))


def _api_key(recipe: Recipe) -> str | None:
    from eagle3_raw.credentials import server_api_key

    return server_api_key(recipe)


class _Run:
    """The state of one build (lives on one event loop)."""

    def __init__(self, recipe: Recipe, options: RunOptions, renderer: Renderer, urls: Sequence[str]) -> None:
        self.recipe = recipe
        self.options = options
        self.renderer = renderer
        self.urls = urls
        self.stats = RunStats()
        self.display = ProgressDisplay(options.progress, log_interval=options.log_interval)
        self.in_flight: dict[str, str] = {}
        self.affinity: dict[int, Endpoint] = {}
        self.journal_dir = journal_dir_for(recipe, options.journal_dir)
        self._stop = threading.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._rid_prefix = uuid.uuid4().hex[:8]  # unique per run; the counter, per attempt
        self._rid_counter = itertools.count()
        self._probe: tuple[str, list[int]] | None = None
        self._signalled = False

    def interrupted_message(self) -> str:
        return (
            f"interrupted: {self.stats.rows} new rows this run; every finished row is in the journal "
            f"{self.journal_dir}. Run the same command again to resume."
        )

    async def main(self) -> RunResult:
        self._handle_signals()
        server = self.recipe.server
        async with sglang.new_session(
            connect_timeout=server.connect_timeout, api_key=_api_key(self.recipe)
        ) as s:
            self.session = s
            identities, down = await self._connect()
            self.identity = identities[0]
            await self._check_tokenizers(identities)
            with self._open_journal(identities[0]) as journal:
                self.journal = journal
                await self._generate_all(identities, down)
                summary = self._summary()
        return RunResult(self.journal_dir, summary)

    def _handle_signals(self) -> None:
        """Ctrl-C or SIGTERM cancels the run, which then aborts its in-flight requests and flushes
        the journal. A repeat while that happens (an impatient second Ctrl-C; ``timeout`` signals
        the process and its group) only says so: asyncio's own handler would raise
        KeyboardInterrupt into the cleanup and leave the aborts unsent."""
        task = asyncio.current_task()
        if task is None or threading.current_thread() is not threading.main_thread():
            return
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._on_signal, task)

    def _on_signal(self, task: asyncio.Task[Any]) -> None:
        if self._signalled:
            log.warning("already stopping: aborting in-flight requests and flushing the journal")
            return
        self._signalled = True
        task.cancel()

    # --- start-up checks ---------------------------------------------------------------------

    async def _connect(self) -> tuple[list[sglang.ServerIdentity], list[str]]:
        timeout = self.recipe.server.connect_timeout
        results = await asyncio.gather(
            *(sglang.server_identity(self.session, url, timeout) for url in self.urls), return_exceptions=True
        )
        identities = [r for r in results if isinstance(r, sglang.ServerIdentity)]
        errors = [(u, r) for u, r in zip(self.urls, results, strict=True) if isinstance(r, BaseException)]
        for _url, error in errors:
            if not isinstance(error, ServerUnreachable):
                raise error
        if not identities:
            raise ServerUnreachable("no endpoint answered: " + "; ".join(str(e) for _, e in errors))
        for url, error in errors:
            log.warning("endpoint %s is not answering (%s); continuing without it until it does", url, error)
        _check_same_model(identities)
        for identity in identities:
            _check_preferred_sampling(identity, self.recipe.sampling.request_params())
        return identities, [url for url, _ in errors]

    async def _check_tokenizers(self, identities: Sequence[sglang.ServerIdentity]) -> None:
        for identity in identities:
            await self._check_tokenizer(identity)

    async def _check_tokenizer(self, identity: sglang.ServerIdentity) -> None:
        """ServerMismatch unless the server's ``/tokenize`` agrees with our tokenizer on a probe text,
        or the check cannot be made at all (``--skip-tokenizer-init``, no ``/tokenize``)."""
        url = identity.url
        if identity.server_info.get("skip_tokenizer_init") is True:
            log.warning("%s runs with --skip-tokenizer-init: its tokenizer cannot be compared with %r; "
                        "make sure they are the same", url, self.recipe.model.tokenizer)  # fmt: skip
            return
        text, ours = self._tokenizer_probe()
        theirs = await self._server_tokenization(url, text)
        if theirs is not None and list(theirs) != list(ours):
            raise ServerMismatch(_tokenizer_mismatch(url, self.recipe.model.tokenizer, ours, theirs))

    def _tokenizer_probe(self) -> tuple[str, list[int]]:
        if self._probe is None:
            text = tokenizer_probe(self.renderer)
            self._probe = (
                text,
                self.renderer.tokenizer.encode(text, add_special_tokens=False, verbose=False),
            )
        return self._probe

    async def _server_tokenization(self, url: str, text: str) -> list[int] | None:
        """``/tokenize`` of ``text``, retried while transient; None when the server has no
        ``/tokenize`` (an HTTP 404, e.g. a router that does not forward it)."""
        timeout, attempts = self.recipe.server.connect_timeout, 0
        while True:
            try:
                return await sglang.tokenize(self.session, url, text, timeout)
            except sglang.EndpointNotFound:
                log.warning("%s has no /tokenize: its tokenizer cannot be compared with %r; make sure "
                            "they are the same", url, self.recipe.model.tokenizer)  # fmt: skip
                return None
            except RetryableError as exc:
                attempts += 1
                if attempts == _TOKENIZE_ATTEMPTS:
                    raise ServerMismatch(_untestable_tokenizer(url, exc)) from exc
                await asyncio.sleep(_backoff(attempts))
            except RowError as exc:
                raise ServerMismatch(_untestable_tokenizer(url, exc)) from exc

    def _open_journal(self, identity: sglang.ServerIdentity) -> Journal:
        from eagle3_raw.journal import Journal

        journal = Journal.open(
            self.journal_dir,
            fingerprint=self.recipe.fingerprint,
            recipe=scrub(self.recipe.to_dict()),
            shard=self.options.shard.name,
        )
        try:
            journal.set_server_identity(
                self._identity_record(identity), allow_change=self.options.allow_server_change
            )
            if self.options.retry_failed:
                journal.clear_failures()
        except BaseException:
            journal.close()
            raise
        return journal

    def _identity_record(self, identity: sglang.ServerIdentity) -> dict[str, Any]:
        tokenizer = self.renderer.identity()
        return {
            **identity.comparable(),
            "tokenizer_path": str(identity.model_info.get("tokenizer_path") or ""),
            "tokenizer_hash": f"{tokenizer['tokenizer_sha256']}:{tokenizer['chat_template_sha256']}",
            "tokenizer": tokenizer,
            "model_info": dict(identity.model_info),
            "server_info": dict(identity.server_info),
        }

    # --- generation --------------------------------------------------------------------------

    async def _generate_all(self, identities: Sequence[sglang.ServerIdentity], down: Sequence[str]) -> None:
        self.pool = self._make_pool(identities, down)
        self.limits = _limits(identities)
        self.vocab_size = self.renderer.vocab_size
        done = self.journal.done()
        self.stats.replayed = len(done)
        exclude = done | {f["key"] for f in self.journal.failures() if f["kind"] == "failed"}
        feed = _JobFeed(self._stop, maxsize=max(4 * _CHUNK, 2 * self.pool.capacity))
        self.display.start(f"{self.recipe.name}")
        workers = [asyncio.create_task(self._worker(feed)) for _ in range(self.pool.capacity)]
        ticker = asyncio.create_task(self._tick())
        producer = asyncio.create_task(
            asyncio.to_thread(self._produce, feed, asyncio.get_running_loop(), exclude)
        )
        try:
            await _gather_or_fail([producer, *workers])
            self._check_every_job_has_an_outcome()
            self.journal.flush()  # every row on disk before the marker says the shard is done
            mark_complete(self.journal_dir, self.options.shard, self._counts())
        except BaseException:
            self._stop.set()
            await self._abort(list(self.in_flight.items()))
            raise
        finally:
            await self._cancel([*workers, ticker])
            await asyncio.gather(*self._tasks, return_exceptions=True)  # aborts after timeouts (<= 2 s)
            await self.pool.close()
            self.display.update(self.stats, self.pool.endpoints)
            self.display.stop()

    def _counts(self) -> dict[str, Any]:
        s = self.stats
        return {
            "planned": s.planned,
            "rows": s.rows,
            "failed": s.failed,
            "skipped": s.skipped,
            "replayed": s.replayed,
        }

    def _check_every_job_has_an_outcome(self) -> None:
        outcomes = self.stats.rows + self.stats.failed + self.stats.skipped
        if outcomes != self.stats.planned:
            raise FatalError(
                f"internal error: {self.stats.planned} rows were planned but {outcomes} have an outcome; "
                f"every finished row is in the journal {self.journal_dir}; run again to resume"
            )

    def _make_pool(self, identities: Sequence[sglang.ServerIdentity], down: Sequence[str]) -> EndpointPool:
        by_url = {identity.url: identity for identity in identities}
        endpoints = [
            Endpoint(url, self._in_flight_limit(by_url.get(url), identities), healthy=url not in down)
            for url in self.urls
        ]
        pool = EndpointPool(endpoints, self._readmit, wait_for_server=self.recipe.server.wait_for_server)
        for endpoint in endpoints:
            if not endpoint.healthy:
                pool.start_probe(endpoint)
        return pool

    def _in_flight_limit(
        self, identity: sglang.ServerIdentity | None, identities: Sequence[sglang.ServerIdentity]
    ) -> int:
        """The recipe's limit, else one from the endpoint's own ``max_running_requests`` (an endpoint
        that was down at the start gets the largest of the others)."""
        return self.recipe.server.max_in_flight or _default_in_flight([identity] if identity else identities)

    async def _readmit(self, url: str) -> bool:
        """Whether an endpoint that was out may take requests: it answers ``/health`` and is the same
        server as the run's (model, weight and SGLang version, tokenizer), checked every time."""
        timeout = self.recipe.server.connect_timeout
        if not await sglang.health(self.session, url, timeout):
            return False
        try:
            identity = await sglang.server_identity(self.session, url, timeout)
            _check_same_model([self.identity, identity])
            _check_preferred_sampling(identity, self.recipe.sampling.request_params())
            await self._check_tokenizer(identity)
        except (ServerUnreachable, ServerMismatch, RetryableError, RowError) as exc:
            log.warning("endpoint %s answers /health but stays out: %s", url, exc)
            return False
        return True

    def _produce(self, feed: _JobFeed, loop: asyncio.AbstractEventLoop, exclude: set[Any]) -> None:
        """Producer thread: plan jobs in canonical order and hand them to the loop in chunks."""
        from eagle3_raw.prompts import iter_conversations

        jobs = plan_jobs(
            iter_conversations(self.recipe), self.renderer, self.recipe,
            shard=self.options.shard, exclude=exclude, limits=self.limits,
        )  # fmt: skip
        chunk, counting = [], False
        for item in jobs:
            chunk.append(item)
            self.stats.note_planned(item.key.index)
            if len(chunk) >= _CHUNK or feed.hungry.is_set():
                if not feed.put_threadsafe(chunk, loop):
                    return
                chunk = []
                if not counting and self.options.progress != "none":  # after the first requests left
                    counting = True
                    threading.Thread(target=self._count_source, name="count-source", daemon=True).start()
        self.stats.planned = self.stats.queued
        feed.put_threadsafe(chunk, loop)
        feed.put_threadsafe(None, loop)

    def _count_source(self) -> None:
        """Background: how many source rows the planner goes through, for the progress estimate."""
        from eagle3_raw.prompts import count_source_rows

        try:
            self.stats.source_rows = count_source_rows(self.recipe)
        except Exception as exc:  # only the estimate depends on it; the planner reports real errors
            log.debug("cannot count the prompt source: %s", exc)

    async def _worker(self, feed: _JobFeed) -> None:
        while (item := await feed.next()) is not None:
            if isinstance(item, Skip):
                self._record_skip(item)
            else:
                await self._process(item)

    def _record_skip(self, skip: Skip) -> None:
        self.journal.record_failure(skip.key, skip.row_id, skip.kind, skip.reason)
        if skip.kind == "failed":
            self.stats.failed += 1
        else:
            self.stats.skipped += 1

    async def _process(self, job: Job) -> None:
        last: RetryableError | None = None
        for attempt in range(self.recipe.server.max_retries + 1):
            if attempt:
                self.stats.retries += 1
                await asyncio.sleep(_backoff(attempt))
            try:
                return self._journal_row(job, await self._attempt(job, attempt), attempt + 1)
            except RetryableError as exc:
                if self._stop.is_set():
                    return  # stopping: aborted on purpose, not a failure of this row
                last = exc
                log.debug("%s attempt %d: %s", job.row_id, attempt, exc)
            except RowError as exc:
                exc.row_id = job.row_id
                return self._record_skip(Skip.from_error(job.key, exc))
        attempts = self.recipe.server.max_retries + 1
        reason = f"{attempts} attempt{'s' if attempts > 1 else ''} failed; last: {last}"
        self._record_skip(Skip.from_error(job.key, RetriesExhausted(reason, row_id=job.row_id)))

    async def _attempt(self, job: Job, attempt: int) -> sglang.Generation:
        endpoint = await self.pool.acquire(self.affinity.get(job.key.index))
        # Remembered before the reply: siblings sent meanwhile follow, so the prefix cache hits.
        self._remember_endpoint(job.key.index, endpoint)
        rid = f"{job.row_id}#{attempt}-{self._rid_prefix}{next(self._rid_counter):x}"
        self.in_flight[rid] = endpoint.url
        try:
            generation = await sglang.generate(
                self.session, endpoint.url, rid=rid, input_ids=job.prompt_ids,
                sampling_params=job.sampling_params, vocab_size=self.vocab_size,
                timeout=self.recipe.server.request_timeout,
            )  # fmt: skip
        except BaseException as exc:
            fault = isinstance(exc, _ENDPOINT_FAULTS) and not self._stop.is_set()  # not our own aborts
            await self.pool.release(endpoint, ok=False, endpoint_fault=fault)
            if self.affinity.get(job.key.index) is endpoint:
                del self.affinity[job.key.index]  # a retry goes to the least loaded endpoint
            if isinstance(exc, RequestTimeout):
                self._background(sglang.abort(self.session, endpoint.url, rid))
            raise
        finally:
            self.in_flight.pop(rid, None)
        await self.pool.release(endpoint, ok=True)
        return generation

    def _background(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _remember_endpoint(self, index: int, endpoint: Endpoint) -> None:
        self.affinity[index] = endpoint
        if len(self.affinity) > 4 * self.pool.capacity + 1024:
            for stale in list(self.affinity)[: len(self.affinity) // 2]:
                del self.affinity[stale]

    def _journal_row(self, job: Job, generation: sglang.Generation, attempts: int) -> None:
        meta = {
            **generation.meta,
            "max_new_tokens": job.sampling_params["max_new_tokens"],
            "attempts": attempts,
        }
        row = Row(job.key, job.source_id, job.prompt_ids, generation.output_ids,
                  generation.finish_reason, job.sampling_seed, meta)  # fmt: skip
        self.journal.append(row)
        self.stats.rows += 1
        self.stats.generated_tokens += len(generation.output_ids)

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(0.25)
            self.display.update(self.stats, self.pool.endpoints)

    async def _cancel(self, tasks: Sequence[asyncio.Task[None]]) -> None:
        self._stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _abort(self, pending: Sequence[tuple[str, str]]) -> None:
        """Tell the servers to stop what we will not wait for (Ctrl-C, fatal error), while the
        requests' connections are still open: SGLang drops an abort for a rid it no longer has."""
        if pending:
            log.warning("aborting %d in-flight requests on the server(s)", len(pending))
            await asyncio.gather(*(sglang.abort(self.session, url, rid) for rid, url in pending))
            await asyncio.sleep(0.2)  # let the aborted responses arrive before the workers go

    def _summary(self) -> Summary:
        return summarize(self.journal, self.recipe, self.stats)


def summarize(journal: Journal, recipe: Recipe, stats: RunStats) -> Summary:
    """The summary of what ``journal`` holds (every run so far) and of this run's ``stats``."""
    totals = journal.stats()
    reasons = dict(totals["finish_reasons"])
    prompt_tokens, generated_tokens = totals["prompt_tokens"], totals["generated_tokens"]
    dropped = reasons.pop("length", 0) if recipe.on_truncation == "drop" else 0
    if dropped:  # the summary describes the set, which holds none of them
        lost = totals["tokens_by_reason"]["length"]
        prompt_tokens -= lost["prompt_tokens"]
        generated_tokens -= lost["generated_tokens"]
    return Summary(
        rows=totals["rows"] - dropped,
        prompt_tokens=prompt_tokens,
        generated_tokens=generated_tokens,
        finish_reasons=reasons,
        dropped=dropped,
        skipped=totals["failures"].get("skipped", {}),
        failed=totals["failures"].get("failed", {}),
        wall_time=stats.elapsed,
        run_generated_tokens=stats.generated_tokens,
        run_rows=stats.rows,
        journal=str(journal.directory),
    )


def assemble(recipe: Recipe, options: RunOptions) -> RunResult:
    """Send nothing: the result of what the journal holds (for ``eagle3-raw merge``)."""
    from eagle3_raw.journal import Journal

    directory = journal_dir_for(recipe, options.journal_dir)
    with Journal.read(directory, fingerprint=recipe.fingerprint) as journal:
        return RunResult(directory, summarize(journal, recipe, RunStats()))


class _JobFeed:
    """Planned items from the producer thread to the workers, in canonical order, with backpressure.

    The producer hands over chunks (one cross-thread call per chunk); the loop side queues their
    items one by one, so every idle worker wakes for the next item, and at most ``maxsize`` items
    wait (the producer blocks beyond that).
    """

    def __init__(self, stop: threading.Event, *, maxsize: int) -> None:
        self._queue: asyncio.Queue[Job | Skip | None] = asyncio.Queue(maxsize)
        self._stop = stop
        self.hungry = threading.Event()

    def put_threadsafe(self, chunk: list[Job | Skip] | None, loop: asyncio.AbstractEventLoop) -> bool:
        """Called from the producer thread; blocks while the queue is full. False once the run stops.

        ``None`` marks the end of the plan.
        """
        future = asyncio.run_coroutine_threadsafe(self._put_all([None] if chunk is None else chunk), loop)
        while not self._stop.is_set():
            try:
                future.result(timeout=0.2)
                self.hungry.clear()
                return True
            except TimeoutError:
                continue
        future.cancel()
        return False

    async def _put_all(self, items: Sequence[Job | Skip | None]) -> None:
        for item in items:
            await self._queue.put(item)

    async def next(self) -> Job | Skip | None:
        """The next item in canonical order, or None when the plan is exhausted."""
        if self._queue.empty():
            self.hungry.set()
        item = await self._queue.get()
        if item is None:
            self._queue.put_nowait(None)  # room: we just took it; the next worker sees the end too
        return item


async def _gather_or_fail(tasks: Sequence[asyncio.Future[Any]]) -> None:
    """Wait for every task; the first exception cancels the rest and is raised."""
    done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    for task in done:
        if task.exception() is not None:
            for other in pending:
                other.cancel()
            raise task.exception()  # type: ignore[misc]


def _untestable_tokenizer(url: str, exc: Exception) -> str:
    return (
        f"cannot check that {url} tokenizes like the recipe's tokenizer: /tokenize failed ({exc}); "
        "without that check every row could be tokenized for another model. Fix the server and run again"
    )


def _backoff(attempt: int) -> float:
    return float(min(30.0, 0.2 * 2 ** (attempt - 1)) * random.uniform(0.5, 1.5))


def _limits(identities: Sequence[sglang.ServerIdentity]) -> Limits:
    inputs = [i.input_limit for i in identities if i.input_limit is not None]
    contexts = [i.token_budget for i in identities if i.token_budget is not None]
    return Limits(min(inputs, default=None), min(contexts, default=None))


def _default_in_flight(identities: Sequence[sglang.ServerIdentity]) -> int:
    """Enough to keep SGLang's batch full: its ``max_running_requests`` plus headroom."""
    running = [i.max_running_requests for i in identities if i.max_running_requests]
    return min(int(max(running) * 1.25) + 8, MAX_DEFAULT_IN_FLIGHT) if running else DEFAULT_IN_FLIGHT


def _check_preferred_sampling(identity: sglang.ServerIdentity, sent: Mapping[str, Any]) -> None:
    """ServerMismatch if the server's ``--preferred-sampling-params`` would fill in keys our requests
    leave out: the rows would change without the recipe (or its fingerprint) changing."""
    preferred = identity.preferred_sampling_params
    taken = sorted(k for k in preferred if k not in sent and k not in _HARMLESS_PREFERRED)
    if not taken:
        return
    settable = [f"sampling.{k}" for k in taken if k not in MANAGED_SAMPLING_KEYS]
    advice = f"set {', '.join(settable)} in the recipe, or restart" if settable else "restart"
    given = ", ".join(f"{k}={preferred[k]!r}" for k in taken)
    raise ServerMismatch(
        f"{identity.url} was started with --preferred-sampling-params that SGLang applies to every "
        f"request leaving them out ({given}); the rows would change without the recipe changing: "
        f"{advice} the server without them"
    )


def _check_same_model(identities: Sequence[sglang.ServerIdentity]) -> None:
    first = identities[0]
    for other in identities[1:]:
        if other.comparable() != first.comparable():
            raise ServerMismatch(
                f"endpoints serve different models: {first.url} {first.comparable()} vs "
                f"{other.url} {other.comparable()}"
            )


def tokenizer_probe(renderer: Renderer, samples: int = 4096) -> str:
    """A text that exercises the tokenizer: special tokens, common words, code, digits, non-ASCII,
    and the decoded text of ``samples`` ids spread over the whole vocabulary."""
    tokenizer = renderer.tokenizer
    specials = "".join(tokenizer.all_special_tokens[:8])
    step = max(1, renderer.vocab_size // samples)
    spread = tokenizer.decode(list(range(0, renderer.vocab_size, step)), skip_special_tokens=True)
    return (
        f"{specials}Hello, world! The quick brown fox jumps over 13 lazy dogs; the cat and the dog "
        "sat in a box for it was on the mat, as is that with this.\n"
        "def f(x):\n    return x ** 2  # naïve café, 東京, emoji 🙂\n"
        f'{{"name": "get_weather", "arguments": {{"city": "Paris"}}}}\n{spread}'
    )


def _tokenizer_mismatch(url: str, name: str, ours: Sequence[int], theirs: Sequence[int]) -> str:
    first = next(
        (i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), min(len(ours), len(theirs))
    )
    return (
        f"the server at {url} tokenizes differently from model.tokenizer={name!r}: first difference at "
        f"token {first} (ours {list(ours[first : first + 5])}, server {list(theirs[first : first + 5])}). "
        "The rows would not be the model's own tokens; point the recipe at the tokenizer the server runs."
    )
