"""Retrying a request: one loop for every request a run sends, with backoff, stopping when the run
stops."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Awaitable, Callable
from typing import TypeVar

from eagle3_raw.errors import RetriesExhausted, RetryableError

T = TypeVar("T")


class Stopping(Exception):
    """The run is stopping: a request that failed meanwhile is nobody's failure."""


def backoff(attempt: int) -> float:
    """Seconds to wait before attempt ``attempt`` (1, 2, ...): exponential, capped, jittered."""
    return float(min(30.0, 0.2 * 2 ** (attempt - 1)) * random.uniform(0.5, 1.5))


async def retried(
    attempt: Callable[[int], Awaitable[T]],
    *,
    retries: int,
    stop: threading.Event,
    on_retry: Callable[[int], None] | None = None,
    on_failure: Callable[[int, RetryableError], None] | None = None,
) -> T:
    """``attempt(n)`` for n = 0, 1, ... ``retries`` until one returns, waiting :func:`backoff` before
    each retry (``on_retry(n)`` first). A :class:`~eagle3_raw.errors.RetryableError` is tried again
    (``on_failure(n, exc)`` first); any other error is raised as it comes. Raises :class:`Stopping`
    when ``stop`` is set as an attempt fails, and
    :class:`~eagle3_raw.errors.RetriesExhausted` (its cause the last failure) after the last."""
    last: RetryableError | None = None
    for number in range(retries + 1):
        if number:
            if on_retry is not None:
                on_retry(number)
            await asyncio.sleep(backoff(number))
        try:
            return await attempt(number)
        except RetryableError as exc:
            if stop.is_set():
                raise Stopping from exc
            if on_failure is not None:
                on_failure(number, exc)
            last = exc
    tried = retries + 1
    raise RetriesExhausted(f"{tried} attempt{'s' if tried > 1 else ''} failed; last: {last}") from last
