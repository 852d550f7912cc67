"""The endpoint pool: per-endpoint limits, least-loaded choice, taking out and putting back."""

from __future__ import annotations

import asyncio

import pytest

from eagle3_raw.endpoints import Endpoint, EndpointPool
from eagle3_raw.errors import ServerUnreachable
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
