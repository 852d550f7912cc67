"""The endpoint pool: per-endpoint limits, least-loaded choice, taking out and putting back."""

from __future__ import annotations

import asyncio

import pytest

from eagle3_raw.errors import ServerUnreachable
from eagle3_raw.run.endpoints import Endpoint, EndpointPool
from tests.support.pace import scaled


def _pool(*limits: int, healthy: dict[str, bool] | None = None, wait: float = 5.0) -> EndpointPool:
    answers = healthy if healthy is not None else {}

    async def health(url: str) -> bool:
        return answers.get(url, True)

    endpoints = [Endpoint(f"http://e{i}", limit) for i, limit in enumerate(limits)]
    return EndpointPool(endpoints, health, wait_for_server=wait, failure_threshold=2, probe_interval=0.01)


async def test_requests_go_to_the_endpoint_with_most_room_within_limits() -> None:
    pool = _pool(2, 3)
    chosen = [(await pool.acquire()).url for _ in range(5)]
    assert sorted(chosen) == ["http://e0"] * 2 + ["http://e1"] * 3
    assert [e.in_flight for e in pool.endpoints] == [2, 3]
    waiter = asyncio.ensure_future(pool.acquire())
    await asyncio.sleep(0.01)
    assert not waiter.done()  # every slot taken: wait
    await pool.release(pool.endpoints[1], ok=True)
    assert (await waiter).url == "http://e1"


async def test_equally_loaded_endpoints_take_turns() -> None:
    """Renders pick an endpoint with nothing in flight yet (a conversation's endpoint is set then):
    ties alternate instead of all going to the first endpoint."""
    pool = _pool(4, 4, 4)
    assert [pool.pick().url for _ in range(6)] == [f"http://e{i % 3}" for i in range(6)]  # type: ignore[union-attr]
    acquired = [(await pool.acquire()).url for _ in range(3)]
    assert sorted(acquired) == ["http://e0", "http://e1", "http://e2"]


async def test_a_conversation_sticks_to_its_endpoint_while_it_has_room() -> None:
    pool = _pool(4, 4)
    first = await pool.acquire()
    assert await pool.acquire(preferred=first) is first
    await pool.acquire(preferred=first)
    await pool.acquire(preferred=first)
    assert (await pool.acquire(preferred=first)).url != first.url  # full: the other one


async def test_a_failing_endpoint_is_taken_out_and_put_back_when_healthy() -> None:
    answers = {"http://e0": False}
    pool = _pool(1, 1, healthy=answers)
    bad = pool.endpoints[0]
    for _ in range(2):
        await pool.acquire(preferred=bad)
        await pool.release(bad, ok=False, endpoint_fault=True)
    assert not bad.healthy
    assert (await pool.acquire()).url == "http://e1"
    answers["http://e0"] = True
    async with asyncio.timeout(scaled(10)):  # the probe's next try puts it back
        while not bad.healthy:
            await asyncio.sleep(0.01)
    assert bad.healthy and (await pool.acquire()).url == "http://e0"
    await pool.close()


async def test_with_every_endpoint_down_acquire_waits_then_gives_up_naming_them() -> None:
    pool = _pool(1, healthy={"http://e0": False}, wait=0.2)
    endpoint = pool.endpoints[0]
    for _ in range(2):
        await pool.acquire()
        await pool.release(endpoint, ok=False, endpoint_fault=True)
    with pytest.raises(ServerUnreachable, match=r"no endpoint answered for 0\.2 s: http://e0"):
        await pool.acquire()
    await pool.close()


async def test_a_row_error_does_not_count_against_the_endpoint() -> None:
    pool = _pool(1)
    for _ in range(5):
        endpoint = await pool.acquire()
        await pool.release(endpoint, ok=False, endpoint_fault=False)
    assert pool.endpoints[0].healthy


async def test_a_freed_slot_goes_to_the_highest_priority_waiting_then_to_the_first_come() -> None:
    """Rollouts ask with the turns they still have to go: the longest chain gets the next slot;
    equal priorities (every single-turn build) are served first come, first served."""
    pool = _pool(1)
    held = await pool.acquire()
    served: list[str] = []

    async def wait(name: str, priority: int) -> None:
        endpoint = await pool.acquire(priority=priority)
        served.append(name)
        await pool.release(endpoint, ok=True)

    line = [("a1", 1), ("b3", 3), ("c2", 2), ("d3", 3), ("e1", 1)]
    waiters = [asyncio.ensure_future(wait(name, priority)) for name, priority in line]
    await asyncio.sleep(0)  # every waiter is in line
    assert served == []
    await pool.release(held, ok=True)
    await asyncio.gather(*waiters)
    assert served == ["b3", "d3", "c2", "a1", "e1"]
    assert pool.endpoints[0].in_flight == 0


async def test_a_cancelled_waiter_leaves_the_line_and_never_keeps_a_slot() -> None:
    pool = _pool(1)
    held = await pool.acquire()
    gone = asyncio.ensure_future(pool.acquire(priority=5))
    handed = asyncio.ensure_future(pool.acquire(priority=4))
    last = asyncio.ensure_future(pool.acquire())
    await asyncio.sleep(0)
    gone.cancel()  # cancelled while in line
    await asyncio.sleep(0)  # ...and gone from it
    await pool.release(held, ok=True)  # the slot is handed to `handed`, which has not run yet...
    handed.cancel()  # ...and is cancelled before it does: the slot goes on to the next in line
    assert (await last) is pool.endpoints[0]
    assert gone.cancelled() and handed.cancelled()
    assert pool.endpoints[0].in_flight == 1


async def test_once_the_pool_drains_the_line_follows_the_drain_priorities_of_those_waiting_too() -> None:
    pool = _pool(1)
    held = await pool.acquire()
    served: list[str] = []

    async def wait(name: str, priority: int, drain: int) -> None:
        endpoint = await pool.acquire(priority=priority, drain_priority=drain)
        served.append(name)
        await pool.release(endpoint, ok=True)

    early = [asyncio.ensure_future(wait(n, p, d)) for n, p, d in [("a", 2, 0), ("b", 0, 5), ("c", 1, 3)]]
    await asyncio.sleep(0)
    pool.drain()  # the plan is exhausted: those in line are reordered
    late = asyncio.ensure_future(wait("d", 9, 4))
    await asyncio.sleep(0)
    await pool.release(held, ok=True)
    await asyncio.gather(*early, late)
    assert served == ["b", "d", "c", "a"]
