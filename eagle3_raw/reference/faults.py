"""Faults on demand for ``/generate``, e.g. ``--faults "http500=0.05,http503=0.02,reset=0.02,abort=0.02"``.

Each ``/generate`` request draws at most one fault, on arrival, from a generator seeded with
``--fault-seed``: with a seed, the n-th request always gets the same fault (or none). What each
fault does (the server carries it out):

- ``http500``: HTTP 500 ``Internal Server Error`` (plain text, like an uncaught exception in SGLang);
- ``http503``: HTTP 503 ``{"object": "error", ..., "code": 503}`` (SGLang's full-queue refusal);
- ``reset``: headers and part of the body are sent, then the connection is aborted;
- ``abort``: HTTP 200 where one generation ends early with ``finish_reason.type == "abort"``;
- ``hang``: no reply at all, until the client gives up.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

KINDS = ("http500", "http503", "reset", "abort", "hang")


@dataclass(frozen=True)
class FaultSpec:
    """Fault rates (probability per ``/generate`` request) and the seed of their sequence."""

    rates: tuple[tuple[str, float], ...]
    seed: int | None = None

    @classmethod
    def parse(cls, spec: str, seed: int | None = None) -> FaultSpec:
        """Parse ``"kind=rate,..."``; raises ``ValueError`` naming the bad part."""
        rates: dict[str, float] = {}
        for part in filter(None, (p.strip() for p in spec.split(","))):
            kind, sep, value = part.partition("=")
            kind = kind.strip()
            if kind not in KINDS or not sep:
                raise ValueError(f"fault {part!r}: expected kind=rate with kind one of {', '.join(KINDS)}")
            rates[kind] = _rate(part, value)
        if sum(rates.values()) > 1.0 + 1e-9:
            raise ValueError(f"fault rates add up to {sum(rates.values()):g}, more than 1")
        return cls(tuple(rates.items()), seed)


def _rate(part: str, value: str) -> float:
    try:
        rate = float(value)
    except ValueError:
        rate = -1.0
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"fault {part!r}: the rate must be a number in [0, 1]")
    return rate


class FaultInjector:
    """Draws the fault of each ``/generate`` request, and where a partial fault cuts."""

    def __init__(self, spec: FaultSpec) -> None:
        self.spec = spec
        self._draws = random.Random(spec.seed)
        # A second generator for cut points, so a cut never shifts the sequence of faults.
        self._cuts = random.Random(None if spec.seed is None else spec.seed + 1)

    def draw(self) -> str | None:
        """The fault of the next request, or None."""
        u = self._draws.random()
        for kind, rate in self.spec.rates:
            if u < rate:
                return kind
            u -= rate
        return None

    def cut(self, length: int) -> int:
        """A cut point in ``[0, length)`` (0 when ``length`` is 0)."""
        return self._cuts.randrange(length) if length > 0 else 0
