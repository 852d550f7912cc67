"""The reference server's simulated GPU: decode slots behind a FIFO queue, and the prefix cache.

Capacity mode (``--slots S --ms-per-token T``): a generation holds one of ``S`` slots for
``uncached prompt tokens x P + completion tokens x T`` milliseconds (``P`` is
``--prefill-ms-per-token``); generations beyond ``S`` wait in arrival order. :class:`Slots` keeps the
integral of busy slots over time, so a benchmark reads utilization as
``busy_slot_seconds / (slots x wall_seconds)``.

The prefix cache stands for SGLang's radix cache: ``cached_tokens`` is the longest prefix the
prompt shares with any sequence seen before (prompts and their outputs), never the whole prompt
(the last token is always computed).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any


class QueuedAbort(Exception):
    """The generation was aborted while it waited for a slot."""


class QueueFull(Exception):
    """``--max-queued-requests`` generations already wait for a slot."""


@dataclass(eq=False)
class Ticket:
    """One generation's claim on a slot; :meth:`Slots.abort` ends it early."""

    rid: str
    aborted: asyncio.Event = field(default_factory=asyncio.Event)
    waiter: asyncio.Future[None] | None = None
    running: bool = False


class Slots:
    """``slots`` decode slots, handed out first come first served, with busy-time accounting."""

    def __init__(
        self, slots: int, *, max_queued: int | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.slots = slots
        self.max_queued = max_queued
        self._clock = clock
        self._busy = 0
        self._queue: deque[Ticket] = deque()
        self._area = 0.0
        self._since = clock()
        self.max_queue_depth = 0

    @property
    def running(self) -> int:
        return self._busy

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    def busy_slot_seconds(self) -> float:
        """Integral of busy slots over time since the last :meth:`reset_accounting`."""
        self._account()
        return self._area

    def reset_accounting(self) -> None:
        self._account()
        self._area = 0.0
        self.max_queue_depth = len(self._queue)

    def _account(self) -> None:
        now = self._clock()
        self._area += self._busy * (now - self._since)
        self._since = now

    def _take(self, ticket: Ticket) -> None:
        self._account()
        self._busy += 1
        ticket.running = True

    async def acquire(self, ticket: Ticket) -> None:
        """Wait for a slot. Raises :class:`QueueFull` or :class:`QueuedAbort`."""
        if self._busy < self.slots and not self._queue:
            self._take(ticket)
            return
        if self.max_queued is not None and len(self._queue) >= self.max_queued:
            raise QueueFull
        ticket.waiter = asyncio.get_running_loop().create_future()
        self._queue.append(ticket)
        self.max_queue_depth = max(self.max_queue_depth, len(self._queue))
        try:
            await ticket.waiter
        except asyncio.CancelledError:
            self._leave_queue(ticket)
            raise

    def _leave_queue(self, ticket: Ticket) -> None:
        if ticket in self._queue:
            self._queue.remove(ticket)
        elif ticket.running:  # the slot was handed over just as the waiter was cancelled
            self.release(ticket)

    def release(self, ticket: Ticket) -> None:
        """Give the slot back; the longest-waiting generation gets it."""
        if not ticket.running:
            return
        ticket.running = False
        self._account()
        self._busy -= 1
        while self._queue and self._busy < self.slots:
            nxt = self._queue.popleft()
            self._take(nxt)
            if nxt.waiter is not None and not nxt.waiter.done():
                nxt.waiter.set_result(None)

    def abort(self, ticket: Ticket) -> None:
        """Abort a generation: a queued one leaves the queue, a running one stops at its next step."""
        ticket.aborted.set()
        if ticket in self._queue:
            self._queue.remove(ticket)
            if ticket.waiter is not None and not ticket.waiter.done():
                ticket.waiter.set_exception(QueuedAbort())

    def now(self) -> float:
        return self._clock()

    async def hold_until(self, ticket: Ticket, deadline: float) -> bool:
        """Keep the slot busy until ``deadline`` (on :meth:`now`'s clock) unless the ticket is aborted
        first; False if it was. Deadlines are absolute, so timer lateness does not add up over steps."""
        delay = deadline - self._clock()
        if delay > 0 and not ticket.aborted.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ticket.aborted.wait(), delay)
        return not ticket.aborted.is_set()


@dataclass(frozen=True)
class Timing:
    """Simulated costs: milliseconds per generated token and per uncached prompt token."""

    ms_per_token: float
    prefill_ms_per_token: float = 0.0

    def prefill_seconds(self, uncached_tokens: int) -> float:
        return uncached_tokens * self.prefill_ms_per_token / 1000.0

    def decode_seconds(self, tokens: int) -> float:
        return tokens * self.ms_per_token / 1000.0

    def tokens_in(self, seconds: float) -> int:
        """How many tokens a decode held for ``seconds`` has produced."""
        return int(seconds * 1000.0 / self.ms_per_token + 1e-9) if self.ms_per_token > 0 else 0


class PrefixCache:
    """Longest previously seen prefix, over at most ``capacity_tokens`` stored tokens (oldest out first).

    Sequences are kept as tuples in sorted order: the stored sequence sharing the longest prefix
    with a query is one of the query's two neighbours in that order.
    """

    def __init__(self, capacity_tokens: int) -> None:
        self.capacity_tokens = capacity_tokens
        self._sorted: list[tuple[int, ...]] = []
        self._fifo: deque[tuple[int, ...]] = deque()
        self._tokens = 0

    def cached_tokens(self, ids: Sequence[int]) -> int:
        """``cached_tokens`` for a prompt: its longest stored prefix, at most ``len(ids) - 1``."""
        if not self._sorted or not ids:
            return 0
        key = tuple(ids)
        i = bisect.bisect_left(self._sorted, key)
        best = max(_common_prefix(key, self._sorted[j]) for j in (i - 1, i) if 0 <= j < len(self._sorted))
        return min(best, len(ids) - 1)

    def insert(self, ids: Sequence[int]) -> None:
        key = tuple(ids)
        if not key or len(key) > self.capacity_tokens:
            return
        i = bisect.bisect_left(self._sorted, key)
        if i < len(self._sorted) and self._sorted[i] == key:
            return
        self._sorted.insert(i, key)
        self._fifo.append(key)
        self._tokens += len(key)
        while self._tokens > self.capacity_tokens:
            self._evict(self._fifo.popleft())

    def _evict(self, key: tuple[int, ...]) -> None:
        i = bisect.bisect_left(self._sorted, key)
        del self._sorted[i]
        self._tokens -= len(key)

    def clear(self) -> None:
        self._sorted.clear()
        self._fifo.clear()
        self._tokens = 0


def _common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """Length of the common prefix, by bisection over C-level slice comparisons."""
    lo, hi = 0, min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass
class Counters:
    """What ``GET /reference/stats`` reports besides the slots (reset by ``POST .../reset``)."""

    started: float = field(default_factory=time.monotonic)
    generate_requests: int = 0
    completed_requests: int = 0
    completed_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    aborted_requests: int = 0
    faults: dict[str, int] = field(default_factory=dict)

    def snapshot(self, slots: Slots | None, timing: Timing | None) -> dict[str, Any]:
        wall = time.monotonic() - self.started
        busy = slots.busy_slot_seconds() if slots else None
        return {
            "wall_seconds": wall,
            "slots": slots.slots if slots else None,
            "ms_per_token": timing.ms_per_token if timing else None,
            "prefill_ms_per_token": timing.prefill_ms_per_token if timing else None,
            "busy_slot_seconds": busy,
            "utilization": busy / (slots.slots * wall) if slots and busy is not None and wall > 0 else None,
            "running": slots.running if slots else 0,
            "queue_depth": slots.queue_depth if slots else 0,
            "max_queue_depth": slots.max_queue_depth if slots else 0,
            "generate_requests": self.generate_requests,
            "completed_requests": self.completed_requests,
            "completed_tokens": self.completed_tokens,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "aborted_requests": self.aborted_requests,
            "faults": dict(self.faults),
        }
