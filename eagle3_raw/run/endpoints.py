"""A pool of SGLang endpoints: in-flight limits, least-loaded choice, health, waiting for recovery.

Each endpoint has its own in-flight limit. A request goes to the healthy endpoint with the most
spare room, equally loaded ones in turn (a conversation's earlier endpoint when it has room, so the
server's prefix cache hits).
While every slot is taken, requests wait in line by priority, then in the order they came: a freed
slot goes to the first in line. A request may give a second priority for the drain, the end of a
run when no new work comes (:meth:`EndpointPool.drain`): the line is then ordered by it. Rollouts
use both (:mod:`eagle3_raw.run.rollout`); everything else has one priority, so first come first served.
An endpoint that fails ``failure_threshold`` times in a row is taken out and probed with
``/health`` until it answers; the run goes on as long as one endpoint lives. When none does,
:meth:`EndpointPool.acquire` waits, up to ``wait_for_server`` seconds, then raises
:class:`~eagle3_raw.errors.ServerUnreachable`.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from eagle3_raw.errors import ServerUnreachable

log = logging.getLogger(__name__)

HealthCheck = Callable[[str], Awaitable[bool]]


@dataclass
class Endpoint:
    """One server URL and its live accounting (mutated only by the pool, on the event loop)."""

    url: str
    limit: int
    name: str = ""
    """What rows record as ``meta.endpoint``: the endpoint's index in the run's list ("0", "1", ...),
    never its URL (a published set must not name a cluster's hosts)."""
    in_flight: int = 0
    healthy: bool = True
    consecutive_failures: int = 0
    chosen: int = 0
    """Times picked as the least loaded: equally loaded endpoints take turns (a render that sets a
    conversation's endpoint before any generation is in flight must not always pick the first)."""

    @property
    def room(self) -> int:
        return self.limit - self.in_flight if self.healthy else 0


def _least_loaded(endpoints: Sequence[Endpoint]) -> Endpoint:
    """The endpoint with the most room (fewest in flight, then the one chosen least often)."""
    best = max(endpoints, key=lambda e: (e.room, -e.in_flight, -e.chosen))
    best.chosen += 1
    return best


@dataclass(order=True)
class _Waiter:
    """One :meth:`EndpointPool.acquire` in line: ordered by ``rank`` (higher priority, then earlier)."""

    rank: tuple[int, int]
    preferred: Endpoint | None = field(compare=False)
    drain_priority: int = field(compare=False)
    endpoint: Endpoint | None = field(default=None, compare=False)
    """The slot handed to it (its in-flight count already taken)."""
    wake: asyncio.Future[None] | None = field(default=None, compare=False)


class EndpointPool:
    """Hands out endpoint slots; see the module docstring for the policy. Lives on one event loop:
    its state changes only between awaits, so it needs no lock."""

    def __init__(
        self,
        endpoints: Sequence[Endpoint],
        health_check: HealthCheck,
        *,
        wait_for_server: float,
        failure_threshold: int = 3,
        probe_interval: float = 1.0,
    ) -> None:
        self.endpoints = list(endpoints)
        self._health_check = health_check
        self._wait_for_server = wait_for_server
        self._failure_threshold = failure_threshold
        self._probe_interval = probe_interval
        self._line: list[_Waiter] = []  # a heap
        self._arrivals = itertools.count()
        self._draining = False
        self._probes: dict[str, asyncio.Task[None]] = {}
        self._all_down_since: float | None = None

    @property
    def capacity(self) -> int:
        """Total in-flight limit over all endpoints."""
        return sum(e.limit for e in self.endpoints)

    async def acquire(
        self, preferred: Endpoint | None = None, *, priority: int = 0, drain_priority: int | None = None
    ) -> Endpoint:
        """A slot on an endpoint (``preferred`` if it has room); waits in line while every healthy
        one is full: higher ``priority`` first, equal ones in arrival order; once the pool drains,
        ``drain_priority`` instead (default: ``priority``)."""
        drain = priority if drain_priority is None else drain_priority
        waiter = _Waiter((-(drain if self._draining else priority), next(self._arrivals)), preferred, drain)
        heapq.heappush(self._line, waiter)
        try:
            while True:
                self._hand_out()
                if waiter.endpoint is not None:
                    return waiter.endpoint
                await self._wait(waiter)
        except BaseException:
            # Cancelled (or gave up) while in line, or after a slot was handed over but before
            # this task ran again: the slot goes back, or the waiter leaves the line.
            if waiter.endpoint is not None:
                waiter.endpoint.in_flight -= 1
                self._hand_out()
            else:
                self._line.remove(waiter)
                heapq.heapify(self._line)
            raise

    def drain(self) -> None:
        """No new work will come (the plan is exhausted): from now on the line is ordered by each
        request's drain priority, those waiting now included. Idempotent."""
        if self._draining:
            return
        self._draining = True
        for waiter in self._line:
            waiter.rank = (-waiter.drain_priority, waiter.rank[1])
        heapq.heapify(self._line)

    def pick(self, preferred: Endpoint | None = None) -> Endpoint | None:
        """A healthy endpoint for a request that takes no generation slot (rendering a prompt):
        ``preferred`` when healthy, else the one with the most room; None when all are down."""
        if preferred is not None and preferred.healthy:
            return preferred
        healthy = [e for e in self.endpoints if e.healthy]
        return _least_loaded(healthy) if healthy else None

    def _choose(self, preferred: Endpoint | None) -> Endpoint | None:
        if preferred is not None and preferred.room > 0:
            return preferred
        return _least_loaded(self.endpoints) if any(e.room > 0 for e in self.endpoints) else None

    def _hand_out(self) -> None:
        """Free slots to the waiters first in line, as long as there is room."""
        while self._line:
            first = self._line[0]
            chosen = self._choose(first.preferred)
            if chosen is None:
                return
            heapq.heappop(self._line)
            chosen.in_flight += 1
            first.endpoint = chosen
            _wake(first)

    def _wake_all(self) -> None:
        """Every waiter looks again."""
        for waiter in self._line:
            _wake(waiter)

    async def _wait(self, waiter: _Waiter) -> None:
        waiter.wake = asyncio.get_running_loop().create_future()
        if any(e.healthy for e in self.endpoints):
            self._all_down_since = None
            await waiter.wake
            return
        self._all_down_since = self._all_down_since or time.monotonic()
        remaining = self._all_down_since + self._wait_for_server - time.monotonic()
        if remaining <= 0:
            urls = ", ".join(e.url for e in self.endpoints)
            raise ServerUnreachable(f"no endpoint answered for {self._wait_for_server:g} s: {urls}")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(remaining):
                await waiter.wake

    async def release(self, endpoint: Endpoint, *, ok: bool, endpoint_fault: bool = False) -> None:
        """Return a slot. ``endpoint_fault`` counts towards taking the endpoint out."""
        endpoint.in_flight -= 1
        if ok:
            endpoint.consecutive_failures = 0
        elif endpoint_fault:
            self._count_failure(endpoint)
        self._hand_out()

    def _count_failure(self, endpoint: Endpoint) -> None:
        endpoint.consecutive_failures += 1
        if endpoint.healthy and endpoint.consecutive_failures >= self._failure_threshold:
            endpoint.healthy = False
            down = sum(not e.healthy for e in self.endpoints)
            log.warning("endpoint %s taken out after %d failures in a row (%d of %d down); probing /health",
                        endpoint.url, endpoint.consecutive_failures, down, len(self.endpoints))  # fmt: skip
            if down == len(self.endpoints):
                log.warning(
                    "every endpoint is down; waiting up to %g s for one to answer", self._wait_for_server
                )
            self.start_probe(endpoint)

    def start_probe(self, endpoint: Endpoint) -> None:
        """Mark ``endpoint`` down and probe ``/health`` until it answers, then put it back."""
        endpoint.healthy = False
        if not any(e.healthy for e in self.endpoints):
            self._wake_all()  # their wait for a server starts now
        if endpoint.url not in self._probes:
            self._probes[endpoint.url] = asyncio.get_running_loop().create_task(self._probe(endpoint))

    async def _probe(self, endpoint: Endpoint) -> None:
        delay = self._probe_interval
        while not await self._health_check(endpoint.url):
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 10.0)
        endpoint.healthy = True
        endpoint.consecutive_failures = 0
        self._probes.pop(endpoint.url, None)
        log.warning("endpoint %s answers /health again; back in the pool", endpoint.url)
        self._hand_out()

    async def close(self) -> None:
        """Stop the health probes."""
        for task in self._probes.values():
            task.cancel()
        await asyncio.gather(*self._probes.values(), return_exceptions=True)
        self._probes.clear()


def _wake(waiter: _Waiter) -> None:
    if waiter.wake is not None and not waiter.wake.done():
        waiter.wake.set_result(None)
