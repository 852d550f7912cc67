"""``ServerConfig``: everything ``eagle3-raw serve-reference`` can set, frozen and validated in one place."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from eagle3_raw.reference.capacity import Timing
from eagle3_raw.reference.faults import FaultSpec


@dataclass(frozen=True)
class ServerConfig:
    """Everything ``eagle3-raw serve-reference`` can set; validated here, in one place."""

    host: str = "127.0.0.1"
    port: int = 30000
    api_key: str | None = None
    model_path: Path | None = None
    served_model_name: str | None = None
    context_length: int | None = None
    skip_tokenizer_init: bool = False
    max_running_requests: int | None = None
    max_queued_requests: int | None = None
    disable_radix_cache: bool = False
    stream_interval: int = 1
    faults: FaultSpec | None = None
    slots: int | None = None
    timing: Timing | None = None
    ledger: Path | None = None
    launch_command: str = ""

    def __post_init__(self) -> None:
        if (self.slots is None) != (self.timing is None):
            raise ValueError("--slots and --ms-per-token go together (capacity mode needs both)")
        if self.slots is not None and self.slots < 1:
            raise ValueError(f"--slots must be at least 1, got {self.slots}")
        if self.timing is not None and min(self.timing.ms_per_token, self.timing.prefill_ms_per_token) < 0:
            raise ValueError("--ms-per-token and --prefill-ms-per-token must be >= 0")
        if self.context_length is not None and self.context_length < 8:
            raise ValueError(f"--context-length must be at least 8, got {self.context_length}")
        if self.stream_interval < 1:
            raise ValueError(f"--stream-interval must be at least 1, got {self.stream_interval}")
        if self.max_queued_requests is not None and self.slots is None:
            raise ValueError("--max-queued-requests needs capacity mode (--slots, --ms-per-token)")
