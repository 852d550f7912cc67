"""Running a build's event loop safely inside someone else's program.

Training code and notebooks call ``load_dataset``: eagle3_raw must work when an event loop is
already running in the caller's thread (Jupyter), leave the host's signal handlers as it found
them, let Ctrl-C reach the caller as a ``KeyboardInterrupt`` (:class:`~eagle3_raw.errors.Interrupted`
is one), and not run out of file descriptors when many requests are in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import signal
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

log = logging.getLogger("eagle3_raw")

FDS_RESERVED = 64
"""Descriptors kept for everything but in-flight requests (journal files, logs, the servers' info)."""

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def run_sync(factory: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run the coroutine ``factory()`` makes to completion and return its result.

    On a thread without a running loop, it runs there (``asyncio.run``). Inside a running loop
    (a notebook cell) it runs on a new thread with its own loop while this one waits; a Ctrl-C
    during the wait cancels it, and :class:`KeyboardInterrupt` is raised once it has stopped.
    """
    try:
        asyncio.get_running_loop()
        running = True
    except RuntimeError:
        running = False  # not asyncio.run() in here: its errors would carry this one as their context
    return _run_in_thread(factory) if running else asyncio.run(factory())


def _run_in_thread(factory: Callable[[], Coroutine[Any, Any, T]]) -> T:
    loop = asyncio.new_event_loop()
    outcome: dict[str, Any] = {}
    main: list[asyncio.Task[T]] = []

    async def body() -> T:
        main.append(asyncio.current_task())  # type: ignore[arg-type]
        return await factory()

    def target() -> None:
        try:
            outcome["value"] = loop.run_until_complete(body())
        except BaseException as exc:  # handed to the waiting thread as is
            outcome["error"] = exc
        finally:
            loop.close()

    thread = threading.Thread(target=target, name="eagle3_raw-run", daemon=True)
    thread.start()
    interrupted = False
    while thread.is_alive():
        try:
            thread.join(0.2)
        except KeyboardInterrupt:
            interrupted = True
            if main:
                loop.call_soon_threadsafe(main[0].cancel)
    if "error" in outcome:
        raise outcome["error"]
    if interrupted:
        raise KeyboardInterrupt
    return outcome["value"]  # type: ignore[no-any-return]


@contextlib.contextmanager
def signals_cancel(task: asyncio.Task[Any], on_repeat: Callable[[], None]) -> Iterator[None]:
    """While the block runs, SIGINT and SIGTERM cancel ``task`` (a repeat calls ``on_repeat``
    instead); afterwards the handlers the host had are back. A no-op off the main thread, where
    signals cannot be handled (the caller's Ctrl-C reaches :func:`run_sync` instead)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    loop = asyncio.get_running_loop()
    previous = {sig: signal.getsignal(sig) for sig in _SIGNALS}
    fired = [False]

    def handler() -> None:
        if fired[0]:
            on_repeat()
            return
        fired[0] = True
        task.cancel()

    for sig in _SIGNALS:
        loop.add_signal_handler(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            loop.remove_signal_handler(sig)
            # remove_signal_handler installs SIG_DFL (default_int_handler for SIGINT): put the host's back
            signal.signal(sig, old if old is not None else signal.SIG_DFL)


def open_file_budget() -> int:
    """Raise the soft open-file limit to the hard one; returns how many descriptors in-flight
    requests may use (the limit less :data:`FDS_RESERVED` and those already open)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    return max(8, soft - FDS_RESERVED - _open_descriptors())


def _open_descriptors() -> int:
    import os

    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0
