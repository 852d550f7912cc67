"""One fetch at a time across test processes (pytest-xdist workers share the download caches)."""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def fetch_lock(folder: Path, name: str) -> Iterator[None]:
    """Hold an exclusive lock on ``folder/.<name>.lock`` for the block: a worker that finds another
    one fetching waits for it, then sees the finished files instead of a half-written ``.partial``."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f".{name}.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file closes
        yield
