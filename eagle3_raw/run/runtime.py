"""Running a build's event loop safely inside someone else's program.

Training code and notebooks call ``load_dataset``: eagle3_raw must work when an event loop is
already running in the caller's thread (Jupyter), leave the host's signal handlers (and its signal
wakeup fd) as it found them, let Ctrl-C reach the caller as a ``KeyboardInterrupt``
(:class:`~eagle3_raw.errors.Interrupted` is one), and not run out of file descriptors when many
requests are in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import signal
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")

log = logging.getLogger("eagle3_raw")

FDS_RESERVED = 64
"""Descriptors kept for everything but in-flight requests (journal files, logs, the servers' info)."""

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def run_sync(factory: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run the coroutine ``factory()`` makes to completion and return its result.

    On a thread without a running loop, it runs there (``asyncio.run``). Inside a running loop
    (a notebook cell) it runs on a new thread with its own loop while this one waits; a Ctrl-C or
    SIGTERM during the wait (on the main thread: handled here, whatever handler the host has, and
    the host's put back after) cancels it, and :class:`KeyboardInterrupt` is raised once it has
    stopped.
    """
    try:
        asyncio.get_running_loop()
        running = True
    except RuntimeError:
        running = False  # not asyncio.run() in here: its errors would carry this one as their context
    return _LoopThread(factory).run() if running else asyncio.run(factory())


class _LoopThread(Generic[T]):
    """The thread path of :func:`run_sync`: a loop of its own on a new thread, cancelled at most once."""

    def __init__(self, factory: Callable[[], Coroutine[Any, Any, T]]) -> None:
        self._factory = factory
        self._loop = asyncio.new_event_loop()
        self._task: asyncio.Task[T] | None = None
        self._lock = threading.Lock()  # the task, against a cancel from the waiting thread
        self._cancelled = threading.Event()
        self._outcome: dict[str, Any] = {}

    def run(self) -> T:
        thread = threading.Thread(target=self._target, name="eagle3_raw-run", daemon=True)
        thread.start()
        with _signals_call(self.cancel):
            while thread.is_alive():
                try:
                    thread.join(0.2)
                except KeyboardInterrupt:  # off the main thread, or a handler that raises it
                    self.cancel()
        return self._result()

    def cancel(self) -> None:
        """Stop the coroutine (from any thread); a repeat only says so."""
        if self._cancelled.is_set():
            log.warning("already stopping: aborting in-flight requests and flushing the journal")
            return
        self._cancelled.set()
        with self._lock, contextlib.suppress(RuntimeError):  # the loop closed: nothing to stop
            if self._task is not None:
                self._loop.call_soon_threadsafe(self._task.cancel)

    async def _body(self) -> T:
        with self._lock:
            self._task = asyncio.current_task()
        if self._cancelled.is_set():  # interrupted before the task existed
            raise asyncio.CancelledError
        return await self._factory()

    def _target(self) -> None:
        try:
            self._outcome["value"] = self._loop.run_until_complete(self._body())
        except BaseException as exc:  # handed to the waiting thread as is
            self._outcome["error"] = exc
        finally:
            self._loop.close()

    def _result(self) -> T:
        error = self._outcome.get("error")
        if self._cancelled.is_set() and (error is None or isinstance(error, asyncio.CancelledError)):
            raise KeyboardInterrupt from error
        if error is not None:
            raise error
        return self._outcome["value"]  # type: ignore[no-any-return]


@contextlib.contextmanager
def _signals_call(handler: Callable[[], None]) -> Iterator[None]:
    """While the block runs on the main thread, SIGINT and SIGTERM call ``handler``; the host's
    handlers are back afterwards. A no-op on another thread (signals go to the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in _SIGNALS}
    for sig in _SIGNALS:
        signal.signal(sig, lambda signum, frame: handler())
    try:
        yield
    finally:
        _restore(previous)


@contextlib.contextmanager
def signals_cancel(task: asyncio.Task[Any], on_repeat: Callable[[], None]) -> Iterator[None]:
    """While the block runs, SIGINT and SIGTERM cancel ``task`` (a repeat calls ``on_repeat``
    instead); afterwards the handlers and the signal wakeup fd the host had are back. A no-op off
    the main thread, where signals cannot be handled (the caller's Ctrl-C reaches :func:`run_sync`
    instead)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    loop = asyncio.get_running_loop()
    previous = {sig: signal.getsignal(sig) for sig in _SIGNALS}
    wakeup_fd = signal.set_wakeup_fd(-1)  # the host's (trio, Qt...): add_signal_handler replaces it
    signal.set_wakeup_fd(wakeup_fd)
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
        for sig in _SIGNALS:
            loop.remove_signal_handler(sig)  # sets the wakeup fd to -1 once none is left
        _restore(previous)
        if wakeup_fd != -1:
            with contextlib.suppress(ValueError, OSError):
                signal.set_wakeup_fd(wakeup_fd)


def _restore(previous: dict[signal.Signals, Any]) -> None:
    for sig, old in previous.items():
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
