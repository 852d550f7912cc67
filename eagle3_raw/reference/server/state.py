"""The state every handler shares, built once from the :class:`ServerConfig` and the :class:`Model`:
the scheduler's limits, the prefix cache, the capacity slots, the fault injector, the ledger, the
stats counters and the registry of rids in flight.

The server runs on one asyncio event loop, so nothing here takes a lock.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from eagle3_raw.reference.capacity import Counters, PrefixCache, Slots, Ticket
from eagle3_raw.reference.faults import FaultInjector
from eagle3_raw.reference.ledger import Ledger
from eagle3_raw.reference.server.config import ServerConfig
from eagle3_raw.reference.server.model import Model
from eagle3_raw.sglang import protocol as p


class ServerState:
    """What the handlers share; ``inflight`` maps each rid in flight to its slot ticket (or None)."""

    def __init__(self, config: ServerConfig, model: Model) -> None:
        self.config = config
        self.model = model
        self.max_total_num_tokens = model.context_len * 256
        self.limits = p.SchedulerLimits(model.context_len, self.max_total_num_tokens)
        self.cache = None if config.disable_radix_cache else PrefixCache(self.max_total_num_tokens)
        self.slots = Slots(config.slots, max_queued=config.max_queued_requests) if config.slots else None
        self.faults = FaultInjector(config.faults) if config.faults else None
        self.ledger = Ledger(config.ledger, config.port) if config.ledger else None
        self.counters = Counters()
        self.inflight: dict[str, Ticket | None] = {}
        self.started = time.time()
        self.sequence = itertools.count()
        """Sequence numbers of ``/generate`` requests (the ledger's ``request``)."""
        self.encode: Callable[[str], list[int]] | None = model.encode if model.tokenizer is not None else None

    @property
    def max_running_requests(self) -> int:
        return self.config.max_running_requests or self.config.slots or 2048

    @property
    def served_model_name(self) -> str:
        return self.config.served_model_name or self.model.reported_path

    @property
    def running(self) -> int:
        """Generations holding a slot (0 without capacity mode)."""
        return self.slots.running if self.slots else 0

    @property
    def waiting(self) -> int:
        """Generations waiting for a slot (0 without capacity mode)."""
        return self.slots.queue_depth if self.slots else 0

    def register(self, rids: Sequence[str]) -> None:
        """SGLang's ``_init_req_state``: a rid already in flight is refused (``RequestError``)."""
        for rid in rids:
            if rid in self.inflight:
                raise p.RequestError(f"Duplicate request ID detected: {rid}")
        self.inflight.update(dict.fromkeys(rids))

    def unregister(self, rids: Iterable[str]) -> None:
        for rid in rids:
            self.inflight.pop(rid, None)

    def count_fault(self, fault: str | None) -> None:
        if fault is not None:
            self.counters.faults[fault] = self.counters.faults.get(fault, 0) + 1

    def log(self, records: Sequence[Mapping[str, Any]], *, delivered: bool) -> None:
        """Append ledger lines (nothing without ``--ledger``), each marked ``delivered``."""
        if self.ledger is not None and records:
            self.ledger.write([{**record, "delivered": delivered} for record in records])

    def close(self) -> None:
        if self.ledger is not None:
            self.ledger.close()
