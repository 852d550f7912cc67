"""Retrying a request: how long to wait before the next attempt, and the run stopping meanwhile."""

from __future__ import annotations

import random


def backoff(attempt: int) -> float:
    """Seconds to wait before attempt ``attempt`` (1, 2, ...): exponential, capped, jittered."""
    return float(min(30.0, 0.2 * 2 ** (attempt - 1)) * random.uniform(0.5, 1.5))


class Stopping(Exception):
    """The run is stopping: a request that failed meanwhile is nobody's failure."""
