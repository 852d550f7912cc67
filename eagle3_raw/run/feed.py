"""The hand-over from the planner thread to the workers: canonical order, bounded, with backpressure."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

from eagle3_raw.run.plan import Planned


class JobFeed:
    """Planned items from the producer thread to the workers, in canonical order, with backpressure.

    The producer hands over chunks (one cross-thread call per chunk); the loop side queues their
    items one by one, so every idle worker wakes for the next item, and at most ``maxsize`` items
    wait (the producer blocks beyond that).
    """

    def __init__(self, stop: threading.Event, *, maxsize: int) -> None:
        self._queue: asyncio.Queue[Planned | None] = asyncio.Queue(maxsize)
        self._stop = stop
        self.hungry = threading.Event()

    def put_threadsafe(self, chunk: list[Planned] | None, loop: asyncio.AbstractEventLoop) -> bool:
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

    async def _put_all(self, items: Sequence[Planned | None]) -> None:
        for item in items:
            await self._queue.put(item)

    async def next(self) -> Planned | None:
        """The next item in canonical order, or None when the plan is exhausted."""
        if self._queue.empty():
            self.hungry.set()
        item = await self._queue.get()
        if item is None:
            self._queue.put_nowait(None)  # room: we just took it; the next worker sees the end too
        return item


async def gather_or_fail(tasks: Sequence[asyncio.Future[Any]]) -> None:
    """Wait for every task; the first exception cancels the rest and is raised."""
    done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    for task in done:
        if task.exception() is not None:
            for other in pending:
                other.cancel()
            raise task.exception()  # type: ignore[misc]
