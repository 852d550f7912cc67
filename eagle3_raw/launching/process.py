"""One launched server process: started through the guard, waited for, stopped.

``start_server(command_for_port, ...)`` picks a free port, starts ``python -m
eagle3_raw.launching.guard -- COMMAND`` with a pipe as its stdin (see :mod:`.guard`: the server
stops when the pipe closes, so however this process ends the server ends too), and waits until
``GET /health`` answers 200. A server that exits first, or does not answer within the startup
timeout, is an error with the tail of its log (stdout and stderr), and is stopped. A port another
process took in the meantime ("address already in use") is retried on a new port.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from eagle3_raw.errors import ServerUnreachable
from eagle3_raw.journal.files import host_name
from eagle3_raw.launching.reference import free_port, healthy

log = logging.getLogger("eagle3_raw")

_POLL_SECONDS = 0.1
_NOTICE_SECONDS = 30.0
_ATTEMPTS = 3
_TAIL_LINES = 30


@dataclass(frozen=True)
class LaunchSpec:
    """How to start one server: its command for a port, where it listens, and the patience."""

    command: Callable[[int], list[str]]
    """The command line for a port."""
    name: str
    """What it is, for messages (``SGLang``, ``vLLM``)."""
    section: str
    """The recipe section it comes from, for messages (``server.sglang``)."""
    env: Mapping[str, str]
    startup_timeout: float
    stop_timeout: float
    log_dir: Path | None = None
    shown: Callable[[Sequence[str]], str] = " ".join
    """The command as messages and the manifest show it (secrets redacted)."""


class LaunchedServer:
    """A running server on ``127.0.0.1:port`` behind its guard; :meth:`stop` ends both."""

    def __init__(self, spec: LaunchSpec, port: int) -> None:
        self.spec = spec
        self.port = port
        self.command = spec.command(port)
        self.log_path = _log_path(spec, port)
        self.guard = self._spawn()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def shown_command(self) -> str:
        return self.spec.shown(self.command)

    @property
    def alive(self) -> bool:
        return self.guard.poll() is None

    def _spawn(self) -> subprocess.Popen[bytes]:
        guard = [sys.executable, "-m", "eagle3_raw.launching.guard", "--stop-timeout",
                 str(self.spec.stop_timeout), "--", *self.command]  # fmt: skip
        with self.log_path.open("ab") as out:
            return subprocess.Popen(
                guard, stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT,
                env={**os.environ, **self.spec.env}, start_new_session=True,
            )  # fmt: skip

    def wait_ready(self) -> None:
        """Block until ``/health`` answers 200; ServerUnreachable (with the log's tail) if the
        server exits first or does not answer within the startup timeout (it is then stopped)."""
        started = time.monotonic()
        deadline, notice = started + self.spec.startup_timeout, started + _NOTICE_SECONDS
        while time.monotonic() < deadline:
            if not self.alive:
                self.stop()
                raise ServerUnreachable(
                    f"the {self.spec.name} server exited with code {self.guard.returncode} before it "
                    f"answered /health: {self.shown_command}{self.tail()}"
                )
            if healthy(self.url, timeout=5.0):
                return
            if time.monotonic() > notice:
                log.info("waiting for the %s server at %s (%.0f s so far; log %s)",
                         self.spec.name, self.url, time.monotonic() - started, self.log_path)  # fmt: skip
                notice += _NOTICE_SECONDS
            time.sleep(_POLL_SECONDS)
        self.stop()
        raise ServerUnreachable(
            f"the {self.spec.name} server did not answer /health within {self.spec.startup_timeout:g} s "
            f"({self.spec.section}.startup_timeout): {self.shown_command}{self.tail()}"
        )

    def tail(self, lines: int = _TAIL_LINES) -> str:
        """The last ``lines`` lines of the server's log, for errors."""
        try:
            text = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            text = []
        return f"\nlog {self.log_path}:\n" + "\n".join(text) if text else f" (empty log {self.log_path})"

    def stop(self) -> None:
        """Close the guard's stdin (it stops the server: SIGTERM, then SIGKILL after the stop
        timeout) and wait for it; SIGKILL the guard if it does not exit in time."""
        if self.guard.stdin is not None:
            with contextlib.suppress(OSError):
                self.guard.stdin.close()
        try:
            self.guard.wait(self.spec.stop_timeout + 10)
        except subprocess.TimeoutExpired:
            self.guard.kill()  # the server then dies of its parent-death signal
            self.guard.wait()

    def discard_log(self) -> None:
        """Remove a temporary log (after a clean stop); a log in ``log_dir`` is kept."""
        if self.spec.log_dir is None:
            with contextlib.suppress(OSError):
                self.log_path.unlink()


def start_server(spec: LaunchSpec, *, port: int | None = None) -> LaunchedServer:
    """Start ``spec`` on a free port (or ``port``) and wait until it is healthy (see module doc)."""
    for attempt in range(_ATTEMPTS):
        server = LaunchedServer(spec, port or free_port())
        log.info("starting the %s server: %s (log %s)", spec.name, server.shown_command, server.log_path)
        try:
            server.wait_ready()
            return server
        except ServerUnreachable:
            clash = "address already in use" in server.tail(200).lower()
            if port is not None or not clash or attempt == _ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


def _log_path(spec: LaunchSpec, port: int) -> Path:
    if spec.log_dir is not None:
        spec.log_dir.mkdir(parents=True, exist_ok=True)

        return spec.log_dir / f"{spec.name.lower()}-{host_name()}-{os.getpid()}-{port}.log"
    fd, name = tempfile.mkstemp(prefix=f"eagle3-raw-{spec.name.lower()}-{port}-", suffix=".log")
    os.close(fd)
    return Path(name)
