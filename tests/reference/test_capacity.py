"""Capacity mode (``--slots S --ms-per-token T``) and the prefix cache."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest

from eagle3_raw.launching.reference import ReferenceProcess
from eagle3_raw.reference.capacity import PrefixCache, QueuedAbort, QueueFull, Slots, Ticket
from tests.reference.conformance import Conformance, check_outcomes
from tests.reference.test_conformance import PROMPT
from tests.reference.wire import get, post_many, request

Launch = Callable[..., ReferenceProcess]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


# --- Slots, with a fake clock ------------------------------------------------------------------


def test_slots_are_handed_out_first_come_first_served() -> None:
    async def run() -> list[str]:
        slots, order = Slots(2), []
        tickets = [Ticket(str(i)) for i in range(5)]

        async def job(ticket: Ticket) -> None:
            await slots.acquire(ticket)
            order.append(ticket.rid)
            await asyncio.sleep(0)
            slots.release(ticket)

        await asyncio.gather(*(job(t) for t in tickets))
        return order

    assert asyncio.run(run()) == ["0", "1", "2", "3", "4"]


def test_busy_slot_seconds_integrate_busy_slots_over_time() -> None:
    async def run() -> tuple[float, float]:
        clock = Clock()
        slots = Slots(4, clock=clock)
        a, b = Ticket("a"), Ticket("b")
        await slots.acquire(a)
        await slots.acquire(b)
        clock.now = 1.0
        slots.release(a)
        clock.now = 3.0
        slots.release(b)
        clock.now = 10.0
        busy = slots.busy_slot_seconds()
        slots.reset_accounting()
        clock.now = 12.0
        return busy, slots.busy_slot_seconds()

    assert asyncio.run(run()) == (2 * 1.0 + 1 * 2.0, 0.0)


def test_a_ticket_aborted_in_the_queue_never_runs() -> None:
    async def run() -> None:
        slots = Slots(1)
        running, queued = Ticket("r"), Ticket("q")
        await slots.acquire(running)
        waiter = asyncio.ensure_future(slots.acquire(queued))
        await asyncio.sleep(0)
        assert slots.queue_depth == 1
        slots.abort(queued)
        with pytest.raises(QueuedAbort):
            await waiter
        assert slots.queue_depth == 0 and slots.running == 1

    asyncio.run(run())


def test_a_full_queue_refuses_new_tickets() -> None:
    async def run() -> None:
        slots = Slots(1, max_queued=0)
        await slots.acquire(Ticket("r"))
        with pytest.raises(QueueFull):
            await slots.acquire(Ticket("q"))

    asyncio.run(run())


def test_a_cancelled_waiter_leaves_the_queue_and_frees_nothing() -> None:
    async def run() -> None:
        slots = Slots(1)
        running = Ticket("r")
        await slots.acquire(running)
        waiter = asyncio.ensure_future(slots.acquire(Ticket("q")))
        await asyncio.sleep(0)
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        assert (slots.queue_depth, slots.running) == (0, 1)
        slots.release(running)
        assert slots.running == 0

    asyncio.run(run())


# --- the prefix cache --------------------------------------------------------------------------


def test_cached_tokens_are_the_longest_stored_prefix_but_never_the_whole_prompt() -> None:
    cache = PrefixCache(10_000)
    assert cache.cached_tokens([1, 2, 3]) == 0
    cache.insert([1, 2, 3, 4, 5])
    cache.insert([1, 2, 9])
    assert cache.cached_tokens([1, 2, 3, 7]) == 3
    assert cache.cached_tokens([1, 2, 9, 9]) == 3
    assert cache.cached_tokens([1, 2, 3, 4, 5]) == 4
    assert cache.cached_tokens([2]) == 0
    cache.clear()
    assert cache.cached_tokens([1, 2, 3, 4, 5]) == 0


def test_the_prefix_cache_forgets_the_oldest_sequences_first() -> None:
    cache = PrefixCache(10)
    cache.insert([1] * 6)
    cache.insert([2] * 6)
    assert cache.cached_tokens([1] * 7) == 0 and cache.cached_tokens([2] * 7) == 6


# --- the server in capacity mode ---------------------------------------------------------------


def body(tokens: int) -> dict[str, Any]:
    return {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True}}


def run_and_measure(
    server: ReferenceProcess, contract: ModuleType, bodies: list[dict[str, Any]], concurrency: int
) -> dict[str, Any]:
    request(server.url, "/reference/stats/reset")
    outcomes = post_many(server.url, bodies, concurrency=concurrency)
    assert {o.status for o in outcomes} == {200}
    check_outcomes(contract, bodies, outcomes)
    stats: dict[str, Any] = get(server.url, "/reference/stats").json()
    assert stats["utilization"] == pytest.approx(
        stats["busy_slot_seconds"] / (stats["slots"] * stats["wall_seconds"]), rel=0.05
    )
    return stats


@pytest.mark.slow
def test_fully_loaded_slots_give_utilization_near_one(launch: Launch, contract: ModuleType) -> None:
    server = launch("--slots", "4", "--ms-per-token", "10")
    stats = run_and_measure(server, contract, [body(60)] * 8, concurrency=8)  # two waves of 4 x 0.6 s
    assert stats["completed_requests"] == 8 and stats["completed_tokens"] == 480
    assert 8 * 0.6 <= stats["busy_slot_seconds"] <= 8 * 0.6 * 1.25
    assert stats["utilization"] > 0.75


@pytest.mark.slow
def test_half_loaded_slots_give_utilization_near_one_half(launch: Launch, contract: ModuleType) -> None:
    server = launch("--slots", "4", "--ms-per-token", "10")
    # never more than 2 of 4 slots busy
    stats = run_and_measure(server, contract, [body(60)] * 4, concurrency=2)
    assert 4 * 0.6 <= stats["busy_slot_seconds"] <= 4 * 0.6 * 1.25
    assert 0.3 < stats["utilization"] <= 0.51
    assert stats["max_queue_depth"] == 0


@pytest.mark.slow
def test_requests_beyond_the_slots_wait_in_a_queue(launch: Launch, contract: ModuleType) -> None:
    server = launch("--slots", "2", "--ms-per-token", "10")
    request(server.url, "/reference/stats/reset")
    outcomes = post_many(server.url, [body(20)] * 4, concurrency=4)
    check_outcomes(contract, [body(20)] * 4, outcomes)
    latencies = sorted(o.json()["meta_info"]["e2e_latency"] for o in outcomes)
    # the last two waited for a slot: the 0.2 s of a generation, less how much later than the first
    # two they reached the server (a few ms on a busy machine: 0.397 s was seen), then their own 0.2 s
    assert latencies[0] >= 0.2 and latencies[2] >= 0.3
    assert get(server.url, "/reference/stats").json()["max_queue_depth"] == 2


@pytest.mark.slow
def test_prefill_costs_uncached_prompt_tokens_only(launch: Launch, contract: ModuleType) -> None:
    server = launch("--slots", "1", "--ms-per-token", "0", "--prefill-ms-per-token", "1")
    sglang = Conformance(server.url, contract)
    prompt = {"input_ids": list(range(10, 310)), "sampling_params": {"max_new_tokens": 1}}
    request(server.url, "/reference/stats/reset")
    first = sglang.ok(prompt)
    busy_first = get(server.url, "/reference/stats").json()["busy_slot_seconds"]
    second = sglang.ok(prompt)
    busy_second = get(server.url, "/reference/stats").json()["busy_slot_seconds"] - busy_first
    assert (first["meta_info"]["cached_tokens"], second["meta_info"]["cached_tokens"]) == (0, 299)
    assert busy_first >= 0.3 and busy_second < busy_first / 2


def chunk_lengths(events: list[Any]) -> list[int]:
    assert events[-1] == "[DONE]"
    return [len(e["output_ids"]) for e in events[:-1]]


@pytest.mark.slow
def test_capacity_mode_streams_the_same_chunks(
    launch: Launch, contract: ModuleType, sglang: Conformance
) -> None:
    capacity = Conformance(launch("--slots", "1", "--ms-per-token", "2").url, contract)
    streamed = {
        **body(20),
        "stream": True,
        "sampling_params": {**body(20)["sampling_params"], "stream_interval": 5},
    }
    assert chunk_lengths(capacity.ok(streamed)) == [1, 6, 11, 16, 20]
    sampling = {"temperature": 0, "max_new_tokens": 40, "ignore_eos": True, "stop": "e\u2603"}
    held = {"input_ids": PROMPT, "stream": True, "sampling_params": sampling}  # chunks ending in "e" held
    lengths = chunk_lengths(capacity.ok(held))
    assert lengths == chunk_lengths(sglang.ok(held)) and len(lengths) < 40
