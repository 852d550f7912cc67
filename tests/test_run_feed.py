"""The hand-over from the planning thread to the workers (feed.JobFeed)."""

from __future__ import annotations

import asyncio
import threading

from eagle3_raw.rows import RowKey
from eagle3_raw.run.feed import JobFeed
from eagle3_raw.run.plan import Skip
from tests.support.pace import scaled


def _items(count: int) -> list[Skip]:
    return [Skip(RowKey(i, 0, 0), f"r{i}", "skipped", "x") for i in range(count)]


async def test_every_idle_worker_gets_an_item_from_one_chunk() -> None:
    feed = JobFeed(threading.Event(), maxsize=64)
    loop = asyncio.get_running_loop()
    waiting = [asyncio.ensure_future(feed.next()) for _ in range(10)]
    await asyncio.sleep(0)
    assert feed.hungry.is_set()
    await asyncio.to_thread(feed.put_threadsafe, _items(10), loop)
    got = await asyncio.wait_for(asyncio.gather(*waiting), timeout=scaled(2))
    assert [item.row_id for item in got if item is not None] == [f"r{i}" for i in range(10)]


async def test_the_end_reaches_every_worker_and_a_stopped_run_unblocks_the_producer() -> None:
    stop = threading.Event()
    feed = JobFeed(stop, maxsize=2)
    loop = asyncio.get_running_loop()
    await asyncio.to_thread(feed.put_threadsafe, None, loop)
    assert [await feed.next() for _ in range(3)] == [None, None, None]
    blocked = JobFeed(stop, maxsize=1)
    producer = asyncio.ensure_future(asyncio.to_thread(blocked.put_threadsafe, _items(5), loop))
    await asyncio.sleep(0.3)
    assert not producer.done()  # backpressure: the queue is full
    stop.set()
    assert await asyncio.wait_for(producer, timeout=scaled(2)) is False
