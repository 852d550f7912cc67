"""Orchestration of a build: target, journal, checks, planning, dispatch, summary.

Order of a run: the target is known (:mod:`eagle3_raw.run.target`, usually by the builder already), so
the set's config id and journal folder are. A set whose journal is whole is read back as it is,
with no server and no tokenizer. Otherwise: the tokenizer loads, a reference server starts if the
recipe asks for one, every endpoint is checked against the target and the recipe (all before any
data is generated), and a planner thread plans rows in canonical order (reusing every generation
the journal already holds) while workers send the rest through the endpoint pool. Outcomes go to
the journal as they come; the journal is what the builder reads, in canonical order.

The parts: :mod:`.checks` (start-up and re-admission), :mod:`.plan` (rows, reuse, requests),
:mod:`.dispatch` (workers, retries), :mod:`.feed` (planner to workers), :mod:`.runtime` (event
loop, signals and file descriptors inside a host program), :mod:`.journal`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3_raw.credentials import server_api_key
from eagle3_raw.engines import engine_named
from eagle3_raw.errors import (
    FatalError,
    Interrupted,
    JournalError,
    JournalFull,
    RecipeError,
    ServerUnreachable,
    SourceError,
)
from eagle3_raw.identity import Target, code_digest, set_config_id
from eagle3_raw.journal import Journal, journal_root, set_dir
from eagle3_raw.journal.manifest import new_manifest
from eagle3_raw.journal.plans import pass_over
from eagle3_raw.journal.sets import union_keys
from eagle3_raw.journal.spill import spill_root
from eagle3_raw.journal.unmade import summarize_unmade
from eagle3_raw.launching.held import held, release, serving
from eagle3_raw.launching.records import record_launch as record
from eagle3_raw.launching.reference import recipe_endpoints
from eagle3_raw.launching.sections import launch_section
from eagle3_raw.launching.target import launched_target
from eagle3_raw.redact import scrub
from eagle3_raw.run.checks import ServerChecks, sample_conversations
from eagle3_raw.run.dispatch import RENDERS_IN_FLIGHT, Dispatcher, room_in_journal
from eagle3_raw.run.earlystop import DEFAULT_EARLY_STOP
from eagle3_raw.run.endpoints import Endpoint, EndpointPool
from eagle3_raw.run.feed import JobFeed, gather_or_fail
from eagle3_raw.run.plan import KeySet, Planner, Shard, planned_rows
from eagle3_raw.run.preflight import check_before_launch
from eagle3_raw.run.progress import ProgressDisplay, ProgressMode, RunStats, Summary
from eagle3_raw.run.render import Renderer
from eagle3_raw.run.runtime import open_file_budget, run_sync, signals_cancel
from eagle3_raw.run.shards import check_whole, mark_complete, missing, whole_count
from eagle3_raw.run.target import (
    ask_identities,
    choose_render,
    recorded_target,
    reference_identity,
    target_of,
    with_rollout_parsers,
)
from eagle3_raw.run.template_limits import interruptible
from eagle3_raw.serving import ServerIdentity
from eagle3_raw.source.prompts import count_source_rows, is_hub_source, iter_conversations, resolve_hub_commit
from eagle3_raw.transport import new_session

if TYPE_CHECKING:
    from eagle3_raw.journal import Journal
    from eagle3_raw.journal.store import Spilled
    from eagle3_raw.recipe import Recipe
    from eagle3_raw.run.render import Renderer


log = logging.getLogger("eagle3_raw")

DEFAULT_IN_FLIGHT = 128
"""Per-endpoint in-flight limit when the server does not report ``max_running_requests``."""

MAX_DEFAULT_IN_FLIGHT = 1024
"""Cap of the derived per-endpoint limit (set ``server.max_in_flight`` to go past it)."""

_CHUNK = 64


@dataclass(frozen=True)
class RunOptions:
    """How to run a recipe (none of it changes the data)."""

    journal_dir: Path | None = None
    """The journal root (default :func:`eagle3_raw.journal.journal_root`)."""
    shard: Shard = field(default_factory=Shard)
    retry_failed: bool = False
    progress: ProgressMode = "bar"
    log_interval: float = 30.0
    generate: bool = True
    """False: send nothing; the set is assembled from what the journal holds (``eagle3-raw merge``)."""
    partial: bool = False
    """With ``generate=False``: assemble even if some shard has not finished (the set is partial)."""
    disk_wait: float = 600.0
    """Seconds a full journal disk is waited for (no new request meanwhile) before the run stops,
    keeping what it holds in the spill folder (:mod:`eagle3_raw.journal.spill`)."""
    early_stop: int = DEFAULT_EARLY_STOP
    """Stop when the first this many outcomes all fail for one reason and no row was made
    (:mod:`eagle3_raw.run.earlystop`); 0: never."""

    def __post_init__(self) -> None:
        if self.progress not in ("bar", "log", "none"):
            raise RecipeError("progress", self.progress, "expected one of: bar, log, none")
        if self.log_interval <= 0:
            raise RecipeError("log_interval", self.log_interval, "expected a positive number of seconds")
        if not 0 <= self.disk_wait <= 7 * 24 * 3600:
            raise RecipeError("disk_wait", self.disk_wait, "expected seconds, from 0 to a week (604800)")
        if isinstance(self.early_stop, bool) or not isinstance(self.early_stop, int) or self.early_stop < 0:
            raise RecipeError("early_stop", self.early_stop, "expected a whole number of rows (0: off)")

    @property
    def root(self) -> Path:
        return self.journal_dir or journal_root()


@dataclass(frozen=True)
class RunResult:
    """Where the rows are, and what the run did."""

    journal_dir: Path
    """The set's journal folder."""
    summary: Summary
    config_id: str
    target: Target
    partial: str | None = None
    """What is missing when the set was assembled partial (``merge --force``), else None."""


def resolve(recipe: Recipe, options: RunOptions) -> Target:
    """The target of ``recipe`` (see :func:`eagle3_raw.run.target.resolve_target`)."""
    return resolve_target(recipe, options.root, api_key=api_key(recipe), generate=options.generate)


def journal_dir_for(recipe: Recipe, journal_dir: Path | None = None, target: Target | None = None) -> Path:
    """The journal folder of ``recipe``'s set (``<root>/sets/<config id>``); asks the server for
    the target unless given (never starting one: a ``launch: sglang`` set is found by the journal's
    record of its launch)."""
    options = RunOptions(journal_dir=journal_dir, generate=False)
    try:
        return set_dir(options.root, set_config_id(recipe, target or resolve(recipe, options)))
    finally:
        release_launched(recipe)


def run(recipe: Recipe, options: RunOptions | None = None, target: Target | None = None) -> RunResult:
    """Generate every missing row of ``recipe`` into its journal; see the module docstring.

    Raises a :class:`~eagle3_raw.errors.FatalError` when the run cannot go on (the journal keeps
    everything finished), and :class:`~eagle3_raw.errors.Interrupted` (a KeyboardInterrupt) on
    Ctrl-C or SIGTERM.
    """
    options = options or RunOptions()
    try:
        return _run(recipe, options, target or resolve(recipe, options))
    finally:
        release_launched(recipe)  # a server started to learn the target, when nothing ran on it


def _run(recipe: Recipe, options: RunOptions, target: Target) -> RunResult:
    directory = set_dir(options.root, set_config_id(recipe, target))
    if not options.generate:
        return assemble(recipe, options, target)
    if whole_count(directory) is not None and not options.retry_failed:
        return assemble(recipe, options, target)  # whole: read back, no server, no tokenizer
    build = _Build(recipe, options, target)
    try:
        with launched_endpoints(recipe) as urls:
            return run_sync(lambda: build.main(urls))
    except (KeyboardInterrupt, asyncio.CancelledError) as exc:
        raise Interrupted(build.interrupted_message()) from exc


def launched_endpoints(recipe: Recipe) -> contextlib.AbstractContextManager[tuple[str, ...]]:
    """The recipe's endpoints, or the server started for the run if it asks for one: the reference
    server (its key through the environment), or SGLang or vLLM (:mod:`eagle3_raw.launching`: the
    one started to learn the target if there is one; SGLang's key in a private file, vLLM's in its
    environment). Each is stopped when the block ends, however it ends; none outlives this process.
    What would fail every row (a missing prompt source, a bad template) is raised before a server
    starts."""
    if recipe.server.launch == "reference" or (recipe.server.launch is not None and not _held(recipe)):
        check_before_launch(recipe)
    if launch_section(recipe) is not None:
        return serving(recipe, api_key(recipe))

    return recipe_endpoints(recipe, api_key(recipe))


def _held(recipe: Recipe) -> bool:
    section = launch_section(recipe)
    return section is not None and held(section) is not None


def release_launched(recipe: Recipe) -> None:
    """Stop the SGLang or vLLM server held for ``recipe`` since its target was resolved, if any (a
    build that found its set whole, or read it from the ``datasets`` cache, sends it nothing)."""
    release(launch_section(recipe))


def api_key(recipe: Recipe) -> str | None:
    """The server's API key, from the environment variable ``server.api_key_env`` names."""
    return server_api_key(recipe)


class _Build:
    """One build on one event loop: the journal, the checks, the planner thread and the workers."""

    def __init__(self, recipe: Recipe, options: RunOptions, target: Target) -> None:
        self.recipe = recipe
        self.options = options
        self.target = target
        self.config_id = set_config_id(recipe, target)
        self.directory = set_dir(options.root, self.config_id)
        self.stats = RunStats()
        self.display = ProgressDisplay(options.progress, log_interval=options.log_interval)
        self.stop = threading.Event()
        self.spilled: Spilled | None = None

    def interrupted_message(self) -> str:
        return f"interrupted: {self.stats.rows} new rows this run; {self.where_rows_are()}"

    def where_rows_are(self) -> str:
        """Where what this run generated is (the journal, or a spill folder too), and how to go on."""
        if self.spilled is not None:
            return self.spilled.message()
        return f"every finished row is in the journal {self.directory}. Run the same command again to resume."

    async def main(self, urls: Sequence[str]) -> RunResult:
        task = asyncio.current_task()
        assert task is not None
        # a template rendering in a worker thread stops at its next step once self.stop is set
        with signals_cancel(task, on_repeat=_already_stopping), interruptible(self.stop):
            for warning in self.recipe.sampling.warnings():
                log.warning("%s", warning)
            try:
                renderer = await asyncio.to_thread(Renderer, self.recipe, self.target.engine)
                journal = await asyncio.to_thread(self._open_journal)
            except BaseException:
                self.stop.set()
                raise
            try:
                if self.options.retry_failed:
                    await asyncio.to_thread(journal.sets.retry_failed)
                await self._generate(journal, renderer, urls)
                summary = await asyncio.to_thread(summarize, journal, self.recipe, self.stats)
            except FatalError as exc:
                self.stop.set()  # no thread keeps rendering
                await asyncio.to_thread(journal.close)  # spills what a full disk left held
                self.spilled = journal.spilled
                if self.spilled is not None or isinstance(exc, JournalFull):
                    raise JournalFull(f"{exc}; {self.where_rows_are()}") from exc
                raise
            except BaseException:
                self.stop.set()  # Ctrl-C, SIGTERM, an error: no thread keeps rendering
                raise
            finally:
                await asyncio.to_thread(journal.close)  # its last flush and fsync: off the loop too
                self.spilled = journal.spilled  # for the interrupted message
        return RunResult(self.directory, summary, self.config_id, self.target)

    def _open_journal(self) -> Journal:
        journal = Journal.open(self.options.root, fresh_manifest(self.recipe, self.target), self.target,
                               shard=self.options.shard.name)  # fmt: skip
        record_launch(journal, self.recipe)
        return journal

    async def _generate(self, journal: Journal, renderer: Renderer, urls: Sequence[str]) -> None:
        server = self.recipe.server
        async with new_session(connect_timeout=server.connect_timeout, api_key=api_key(self.recipe)) as s:
            checks = ServerChecks(self.recipe, renderer, s, self.target)
            pool = await self._connect(checks, urls, journal, renderer)
            hub_revision = await asyncio.to_thread(self._hub_revision, journal)
            planner = await asyncio.to_thread(self._planner, journal, renderer)
            dispatcher = Dispatcher(
                self.recipe, s if pool else None, pool, journal, self.stats,
                vocab_size=renderer.vocab_size, stop=self.stop, planner=planner, renderer=renderer,
                disk_wait=self.options.disk_wait, early_stop=self.options.early_stop,
                engine=engine_named(self.target.engine),
            )  # fmt: skip
            try:
                await self._dispatch(planner, dispatcher, pool, hub_revision, journal)
                await self._write_held(journal)  # every outcome on disk before the marker
                await asyncio.to_thread(mark_complete, self.directory, self.options.shard, self._counts())
            finally:
                if pool is not None:
                    await pool.close()

    async def _connect(
        self, checks: ServerChecks, urls: Sequence[str], journal: Journal, renderer: Renderer
    ) -> EndpointPool | None:
        """The pool of checked endpoints; None when none answers and the target came from the
        journal (then only rows the journal holds can be made)."""
        try:
            identities, down = await checks.connect(urls)
        except ServerUnreachable:
            if self.target.origin != "journal":
                raise
            log.warning("no endpoint answers: only rows whose generations the journal holds can be made")
            return None
        how = "as the recipe says" if self.recipe.server.engine_name else "asked from the server"
        # debug, not info: the progress display owns the terminal (eagle3-raw validate says it)
        log.debug(
            "%d endpoint(s) of %s (%s): %s", len(identities), identities[0].label, how, self.target.describe()
        )
        await checks.check_tokenizers(identities)
        if self.target.render == "local" and not renderer.prints_date:  # a pinned date is not the server's
            sample = await asyncio.to_thread(sample_conversations, self.recipe)
            await checks.check_rendering(identities[0].url, sample)
        facts = server_facts(identities[0], renderer)
        await asyncio.to_thread(journal.sets.update, lambda m: m.update(server=m.get("server") or facts))
        return _make_pool(self.recipe, identities, down, checks, urls)

    def _hub_revision(self, journal: Journal) -> str | None:
        """The Hub source's commit this set is built from: resolved and recorded at the first run,
        then checked; a source that moved is refused."""
        if not is_hub_source(self.recipe):
            return None
        recorded = (journal.manifest.get("source") or {}).get("commit")
        try:
            commit = resolve_hub_commit(self.recipe.prompts)
        except SourceError as exc:
            if recorded is None:
                raise
            log.warning("%s; using the commit this set was started from, %s", exc, recorded)
            return str(recorded)
        if recorded is None:
            source = {
                "repo": self.recipe.prompts.source,
                "revision": self.recipe.prompts.revision,
                "commit": commit,
            }
            journal.sets.update(lambda m: m.update(source=source))
            return commit
        if recorded != commit:
            raise FatalError(_moved_source(self.recipe, recorded, commit))
        return commit

    def _planner(self, journal: Journal, renderer: Renderer) -> Planner:
        import numpy as np

        index = journal.generation_index()
        done = journal.done_keys(index)
        failed = journal.failed_keys(done)
        ended = journal.failed_keys(done, ("ended",))
        shard = self.options.shard
        self.stats.replayed = int(np.count_nonzero((done >> 24) % shard.count == shard.index))  # this shard's
        excluded = union_keys(done, failed, ended)
        return Planner(
            self.recipe,
            renderer,
            self.target,
            shard=shard,
            exclude=KeySet(excluded),
            index=index,
            failed=KeySet(failed),
            plans=journal.sets.plans,
            passed=pass_over(journal.sets.plan_records(), excluded),
        )

    async def _write_held(self, journal: Journal) -> None:
        """Flush the journal; while its disk has no room, wait for space (up to ``disk_wait`` s of a
        full disk, then JournalFull), saying so."""
        while True:
            self._watch_disk(journal)
            if journal.full_since is not None:
                log.warning(
                    "every row has an outcome, but the journal's disk is full: waiting for space to write "
                    "the %s generated rows held in memory (free space on the disk of %s)",
                    f"{journal.held_rows:,}", self.directory,
                )  # fmt: skip
            await room_in_journal(journal, self.options.disk_wait)
            try:
                await asyncio.to_thread(journal.flush)
            except JournalError:
                if journal.full_since is None:
                    raise
                continue
            self._watch_disk(journal)
            return

    def _watch_disk(self, journal: Journal) -> None:
        """Follow the journal's disk: a warning when it fills up and when space comes back."""
        change = self.stats.note_disk(journal.full_since, journal.held_rows)
        if change == "full":
            log.warning(
                "the journal's disk is full (%s): %s generated rows held in memory; no new request is "
                "sent until space comes back (free space there; after %s s of a full disk the run stops "
                "and keeps what it holds in %s)", self.directory, f"{self.stats.held:,}",
                f"{self.options.disk_wait:,.0f}", spill_root(),
            )  # fmt: skip
        elif change == "back":
            log.warning("space is back on the journal's disk: the rows held in memory are written")

    async def _dispatch(
        self, planner: Planner, dispatcher: Dispatcher, pool: EndpointPool | None, hub_revision: str | None,
        journal: Journal,
    ) -> None:  # fmt: skip
        capacity = pool.capacity if pool is not None else 1
        feed = JobFeed(self.stop, maxsize=max(4 * _CHUNK, 2 * capacity))
        self.display.start(self.recipe.name)
        renders = RENDERS_IN_FLIGHT if self.target.render == "server" else 0  # their workers wait on renders
        if (
            self.recipe.turns == "rollout"
        ):  # a rollout's slot idles while its next prompt is made: more of them
            renders += capacity
        workers = [asyncio.create_task(dispatcher.work(feed)) for _ in range(capacity + renders)]
        ticker = asyncio.create_task(self._tick(pool, journal))
        loop = asyncio.get_running_loop()
        producer = asyncio.create_task(asyncio.to_thread(self._produce, planner, feed, loop, hub_revision))
        try:
            await gather_or_fail([producer, *workers])
            await dispatcher.drain()
            dispatcher.settle_watch()  # fewer rows than --early-stop: what it held is journaled
            self._check_every_row_has_an_outcome()
        except BaseException:
            self.stop.set()
            await dispatcher.abort(list(dispatcher.in_flight.items()))
            raise
        finally:
            await _cancel([*workers, ticker], self.stop)
            await dispatcher.settle()  # aborts after timeouts (<= 2 s)
            self.display.update(self.stats, pool.endpoints if pool else [])
            self.display.stop()

    def _produce(
        self, planner: Planner, feed: JobFeed, loop: asyncio.AbstractEventLoop, hub_revision: str | None
    ) -> None:
        """Producer thread: plan rows in canonical order and hand them to the loop in chunks."""
        chunk: list[Any] = []
        counting = False
        conversations = iter_conversations(self.recipe, hub_revision=hub_revision, passed=planner.passed)
        for item in planner.plan(conversations):
            chunk.append(item)
            self.stats.note_planned(item.key.index, planned_rows(item))
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
        try:
            self.stats.source_rows = count_source_rows(self.recipe)
        except Exception as exc:  # only the estimate depends on it; the planner reports real errors
            log.debug("cannot count the prompt source: %s", exc)

    async def _tick(self, pool: EndpointPool | None, journal: Journal) -> None:
        while True:
            await asyncio.sleep(0.25)
            self._watch_disk(journal)
            self.display.update(self.stats, pool.endpoints if pool else [])

    def _counts(self) -> dict[str, Any]:
        s = self.stats
        return {
            "keys": s.replayed + (s.planned or 0) - s.blocked,
            "planned": s.planned,
            "rows": s.rows,
            "reused": s.reused,
            "failed": s.failed,
            "skipped": s.skipped,
            "ended": s.ended,
            "blocked": s.blocked,
            "replayed": s.replayed,
        }

    def _check_every_row_has_an_outcome(self) -> None:
        s = self.stats
        outcomes = s.rows + s.reused + s.failed + s.skipped + s.ended + s.blocked
        if outcomes != s.planned:
            raise FatalError(
                f"internal error: {s.planned} rows were planned but {outcomes} have an outcome; "
                f"every finished row is in the journal {self.directory}; run again to resume"
            )


def _already_stopping() -> None:
    log.warning("already stopping: aborting in-flight requests and flushing the journal")


async def _cancel(tasks: Sequence[asyncio.Task[Any]], stop: threading.Event) -> None:
    stop.set()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _make_pool(
    recipe: Recipe, identities: Sequence[ServerIdentity], down: Sequence[str], checks: ServerChecks,
    urls: Sequence[str],
) -> EndpointPool:  # fmt: skip
    by_url = {identity.url: identity for identity in identities}
    limits = [
        recipe.server.max_in_flight or _default_in_flight([by_url[u]] if u in by_url else identities)
        for u in urls
    ]
    limits = _within_descriptors(limits)
    endpoints = [
        Endpoint(url, limit, name=str(i), healthy=url not in down)
        for i, (url, limit) in enumerate(zip(urls, limits, strict=True))
    ]
    pool = EndpointPool(endpoints, checks.readmit, wait_for_server=recipe.server.wait_for_server)
    for endpoint in endpoints:
        if not endpoint.healthy:
            pool.start_probe(endpoint)
    return pool


def _within_descriptors(limits: list[int]) -> list[int]:
    """``limits`` scaled down so every in-flight request has a file descriptor (one socket each),
    after raising the soft open-file limit to the hard one."""
    budget = open_file_budget()
    if sum(limits) <= budget:
        return limits
    scaled = [max(1, limit * budget // sum(limits)) for limit in limits]
    log.warning(
        "%d requests in flight need as many open files; the open-file limit (ulimit -n) leaves %d: "
        "keeping %d in flight", sum(limits), budget, sum(scaled),
    )  # fmt: skip
    return scaled


def _default_in_flight(identities: Sequence[ServerIdentity]) -> int:
    """Enough to keep the server's batch full: what it runs at once (SGLang's
    ``max_running_requests``, vLLM's ``max_num_seqs``) plus headroom."""
    running = [i.max_running_requests for i in identities if i.max_running_requests]
    return min(int(max(running) * 1.25) + 8, MAX_DEFAULT_IN_FLIGHT) if running else DEFAULT_IN_FLIGHT


def record_launch(journal: Journal, recipe: Recipe) -> None:
    """Record the SGLang or vLLM server this run launched (its command, redacted) in the set's
    manifest."""
    section = launch_section(recipe)
    server = held(section) if section is not None else None
    if section is not None and server is not None:
        record(journal, section, server)


def fresh_manifest(recipe: Recipe, target: Target) -> dict[str, Any]:
    """The manifest of ``recipe``'s set before it has rows."""
    return new_manifest(
        config_id=set_config_id(recipe, target), name=recipe.name, fingerprint=recipe.fingerprint,
        code=code_digest(), recipe=scrub(recipe.to_dict()), target=target.to_dict(),
    )  # fmt: skip


def server_facts(identity: ServerIdentity, renderer: Renderer) -> dict[str, Any]:
    """What the manifest and the card keep about the server and the tokenizer."""
    tokenizer = renderer.identity()
    return {
        **identity.comparable(),
        "tokenizer_path": identity.tokenizer_path,
        "tokenizer_hash": f"{tokenizer['tokenizer_sha256']}:{tokenizer['chat_template_sha256']}",
        "tokenizer": tokenizer,
        "model_info": dict(identity.model_info),
        "server_info": dict(identity.server_info),
    }


def _moved_source(recipe: Recipe, recorded: str, now: str) -> str:
    p = recipe.prompts
    return (
        f"the prompt source {p.source}{f'@{p.revision}' if p.revision else ''} moved since this set was "
        f"started: it was at commit {recorded}, it is at {now} now. Rows from two versions of a source "
        f"would make one inconsistent set. Pin prompts.revision: {recorded} to finish the set as it was "
        f"started, or prompts.revision: {now} to build the new version (rows whose requests are "
        "unchanged are reused, not generated again)"
    )


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
    rollouts = totals.get("rollouts")
    rows = sum(rollouts["rows"].values()) if rollouts is not None else totals["rows"]
    return Summary(
        rows=rows - dropped,
        prompt_tokens=prompt_tokens,
        generated_tokens=generated_tokens,
        finish_reasons=reasons,
        dropped=dropped,
        skipped=totals["failures"].get("skipped", {}),
        failed=totals["failures"].get("failed", {}),
        wall_time=stats.elapsed,
        run_generated_tokens=stats.generated_tokens,
        run_rows=stats.rows,
        run_reused=stats.reused,
        run_replayed=stats.replayed,
        samples_per_prompt=recipe.sampling.samples_per_prompt,
        ended_turns=sum(totals["failures"].get("ended", {}).values()),
        journal=str(journal.directory),
        rollouts=rollouts,
        mixture=totals.get("mixture"),
        disk_full_seconds=stats.disk_full_seconds,
        held_peak=stats.held_peak,
        unmade=summarize_unmade(journal),  # reads the failure records again: row ids, not counts
    )


def assemble(recipe: Recipe, options: RunOptions, target: Target) -> RunResult:
    """Send nothing: the result of what the set's journal holds (a whole set, or with
    ``options.partial`` whatever the shards finished)."""
    config_id = set_config_id(recipe, target)
    directory = set_dir(options.root, config_id)
    partial = None
    if not (directory / "manifest.json").exists():
        check_whole(directory)  # raises, saying how to build the set first
    with Journal.read(options.root, config_id) as journal:
        try:
            check_whole(directory, journal.outcome_keys())
        except FatalError:
            if not options.partial:
                raise
            partial = missing(directory)
        return RunResult(directory, summarize(journal, recipe, RunStats()), config_id, target, partial)


def resolve_target(
    recipe: Recipe, journal_root: Path, *, api_key: str | None, generate: bool = True
) -> Target:
    """The target of ``recipe`` (see the module docstring). ServerUnreachable when no endpoint
    answers and the journal has no set of this recipe; other server errors (a refused key, a
    server that is not SGLang) as they come. ``generate=False`` (a merge) never starts a server."""
    if recipe.server.launch == "reference":
        identity = reference_identity(recipe.server.launch_args)
        cannot = (
            "it runs with --skip-tokenizer-init"
            if "--skip-tokenizer-init" in recipe.server.launch_args
            else ""
        )
        target = choose_render(recipe, target_of([identity], "reference"), cannot)
        return with_rollout_parsers(recipe, target, identity)
    if launch_section(recipe) is not None:  # launch: sglang or vllm
        return launched_target(recipe, journal_root, api_key=api_key, generate=generate)
    identities, errors, cannot = run_sync(lambda: ask_identities(recipe, api_key, recipe.server.endpoints))
    if identities:
        target = choose_render(recipe, target_of(identities), cannot)
        return with_rollout_parsers(recipe, target, identities[0])
    recorded = recorded_target(recipe, journal_root)
    if recorded is None:
        raise ServerUnreachable(
            "no endpoint answered: "
            + "; ".join(str(e) for e in errors)
            + f" (and the journal {journal_root} holds no set of recipe {recipe.name!r} to read without one)"
        )
    log.warning(
        "no endpoint answers (%s); using the target recorded by the last set of %r in the journal: %s",
        "; ".join(str(e) for e in errors), recipe.name, recorded.describe(),
    )  # fmt: skip
    return recorded
