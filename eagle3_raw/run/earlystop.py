"""Stopping a build early when its first outcomes all fail for one reason (``--early-stop N``).

A recipe-wide mistake (a ``logit_bias`` the server refuses, a ``reasoning_effort`` its chat path
refuses) fails every row the same way; repeating it for every row says nothing new and sends
every request. So until a run has made a row, it watches its outcomes (:class:`EarlyStop`):

- at most ``N`` generation requests are out (:meth:`EarlyStop.slot`), so a recipe that fails
  every request sends ``N``, not the whole set;
- a failed or skipped row is held, not journaled yet (:meth:`EarlyStop.failed`);
- the first row generated or reused, or a second reason, ends the watch: the held outcomes are
  journaled and the run goes on as usual, at full width;
- ``N`` held outcomes with one reason stop the run (:class:`StoppedEarly`, a fatal error naming
  the reason once and the count). The held outcomes are dropped: nothing was generated, and a
  rerun after the fix tries those rows again rather than counting them failed for good.

A run whose journal already holds rows of the set is not watched (the recipe has made rows).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from eagle3_raw.errors import FatalError

if TYPE_CHECKING:
    from eagle3_raw.run.plan import Skip

DEFAULT_EARLY_STOP = 8
"""Outcomes a build watches before it trusts the recipe (``--early-stop``; 0: not watched)."""


class StoppedEarly(FatalError):
    """The first outcomes of a run all failed (or were all skipped) for one reason; nothing was made."""


class EarlyStop:
    """The watch over a run's first ``first`` outcomes (see the module docstring); one event loop."""

    def __init__(self, first: int) -> None:
        self.first = first
        self.watching = first > 0
        self.held: list[Skip] = []
        self._reason: str | None = None
        self._stopped: str | None = None
        self._sent = 0
        self._changed: asyncio.Condition | None = None

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one of the ``first`` request slots while watching (at once when not watching)."""
        if self.watching:
            changed = self._condition()
            async with changed:
                await changed.wait_for(lambda: not self.watching or self._sent < self.first)
                self._sent += 1
        if self._stopped is not None:  # every worker stops, not only the one that saw it
            raise StoppedEarly(self._stopped)
        yield

    def failed(self, skip: Skip) -> list[Skip]:
        """Note ``skip``; the outcomes to journal now (none while they are held). Raises
        :class:`StoppedEarly` once ``first`` of them share one reason. ``ended`` rollouts are not
        failures: the turns before them were made."""
        if self._stopped is not None:
            raise StoppedEarly(self._stopped)
        if not self.watching or skip.kind == "ended":
            return [skip]
        reason = common_reason(skip)
        if self._reason is not None and reason != self._reason:
            return self.settled(skip)
        self._reason = reason
        self.held.append(skip)
        if len(self.held) >= self.first:
            self._stopped = self._message(skip)
            self.watching = False  # wakes the workers waiting for a slot: they raise it too
            self._wake()
            raise StoppedEarly(self._stopped)
        return []

    def settled(self, *more: Skip) -> list[Skip]:
        """End the watch (a row was made, or a second reason came); the held outcomes and ``more``,
        to journal now."""
        if self._stopped is not None:  # stopping: the held outcomes stay unrecorded
            return list(more)
        released, self.held = [*self.held, *more], []
        if self.watching:
            self.watching = False
            self._wake()
        return released

    def _message(self, skip: Skip) -> str:
        rows = len(self.held)
        verb = "all failed" if skip.kind == "failed" else "were all skipped"
        reason = (self._reason or "").rstrip(".")
        return (
            f"stopped early: the first {rows} rows {verb} for the same reason and no row was generated "
            f"(nothing is recorded for them: a rerun tries them again): {reason}. Fix it (eagle3-raw "
            "validate RECIPE checks a recipe without generating) and run again; --early-stop 0 "
            "(early_stop=0) turns this check off"
        )

    def _condition(self) -> asyncio.Condition:
        if self._changed is None:
            self._changed = asyncio.Condition()
        return self._changed

    def _wake(self) -> None:
        changed = self._changed
        if changed is None:
            return

        async def wake() -> None:
            async with changed:
                changed.notify_all()

        task = asyncio.get_running_loop().create_task(wake())
        _WAKING.add(task)
        task.add_done_callback(_WAKING.discard)


_WAKING: set[asyncio.Task[None]] = set()


def common_reason(skip: Skip) -> str:
    """``skip``'s reason without what names its row (``row 'id' turn N: ``, its row id), so the
    same mistake on two rows reads as one reason."""
    reason = re.sub(r"^row '[^']*'( turn \d+)?: ", "", skip.reason)
    return reason.replace(skip.row_id, "<row>") if skip.row_id else reason
