"""A pool of SGLang endpoints: in-flight limits, least-loaded choice, health, waiting for recovery.

Each endpoint has its own in-flight limit. A request goes to the healthy endpoint with the most
spare room, equally loaded ones in turn (a conversation's earlier endpoint when it has room, so the
server's prefix cache hits).
An endpoint that fails ``failure_threshold`` times in a row is taken out and probed with
``/health`` until it answers; the run goes on as long as one endpoint lives. When none does,
:meth:`EndpointPool.acquire` waits, up to ``wait_for_server`` seconds, then raises
:class:`~eagle3_raw.errors.ServerUnreachable`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

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


class EndpointPool:
    """Hands out endpoint slots; see the module docstring for the policy."""

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
        self._changed = asyncio.Condition()
        self._probes: dict[str, asyncio.Task[None]] = {}
        self._all_down_since: float | None = None

    @property
    def capacity(self) -> int:
        """Total in-flight limit over all endpoints."""
        return sum(e.limit for e in self.endpoints)

    async def acquire(self, preferred: Endpoint | None = None) -> Endpoint:
        """A slot on an endpoint (``preferred`` if it has room); waits while every healthy one is full."""
        async with self._changed:
            while True:
                chosen = self._choose(preferred)
                if chosen is not None:
                    chosen.in_flight += 1
                    return chosen
                await self._wait()

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

    async def _wait(self) -> None:
        if any(e.healthy for e in self.endpoints):
            self._all_down_since = None
            await self._changed.wait()
            return
        self._all_down_since = self._all_down_since or time.monotonic()
        remaining = self._all_down_since + self._wait_for_server - time.monotonic()
        if remaining <= 0:
            urls = ", ".join(e.url for e in self.endpoints)
            raise ServerUnreachable(f"no endpoint answered for {self._wait_for_server:g} s: {urls}")
        # asyncio.timeout, not wait_for: wait_for runs wait() as a separate task, and a second
        # cancel (the run's cleanup) can leave that task to reacquire the lock after we left,
        # holding it forever (Python 3.11), which deadlocks every other waiter.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(remaining):
                await self._changed.wait()

    async def release(self, endpoint: Endpoint, *, ok: bool, endpoint_fault: bool = False) -> None:
        """Return a slot. ``endpoint_fault`` counts towards taking the endpoint out."""
        async with self._changed:
            endpoint.in_flight -= 1
            if ok:
                endpoint.consecutive_failures = 0
            elif endpoint_fault:
                self._count_failure(endpoint)
            self._changed.notify_all()

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
        if endpoint.url not in self._probes:
            self._probes[endpoint.url] = asyncio.get_running_loop().create_task(self._probe(endpoint))

    async def _probe(self, endpoint: Endpoint) -> None:
        delay = self._probe_interval
        while not await self._health_check(endpoint.url):
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 10.0)
        async with self._changed:
            endpoint.healthy = True
            endpoint.consecutive_failures = 0
            self._probes.pop(endpoint.url, None)
            log.warning("endpoint %s answers /health again; back in the pool", endpoint.url)
            self._changed.notify_all()

    async def close(self) -> None:
        """Stop the health probes."""
        for task in self._probes.values():
            task.cancel()
        await asyncio.gather(*self._probes.values(), return_exceptions=True)
        self._probes.clear()
