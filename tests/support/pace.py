"""The machine's actual pace, for the tests' hang-catchers (issue 21, finding 10).

A test waits for conditions, not for seconds; but every wait needs a limit that only catches a hang,
and a limit that is generous on an idle machine is not on one whose cores run 7-13 processes each.
:func:`pace` says how much slower than an idle machine this one runs now: the 1-minute load
average per core, at least 1. :func:`scaled` stretches a limit by it. The per-test timeout of
pytest-timeout is stretched the same way (``tests/conftest.py``), at the start of each test.
"""

from __future__ import annotations

import os


def pace() -> float:
    """Runnable processes per core over the last minute, at least 1 (1: an idle machine)."""
    try:
        load = os.getloadavg()[0]
    except OSError:  # no load average on this system: assume it is idle
        return 1.0
    return max(1.0, load / _cores())


def _cores() -> int:
    """The cores this process may run on (the machine's count where that cannot be asked)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def scaled(seconds: float) -> float:
    """``seconds`` (a limit that is generous on an idle machine) at the machine's pace now."""
    return seconds * pace()
