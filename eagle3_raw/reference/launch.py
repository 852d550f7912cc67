"""Start the reference server in a subprocess (for tests, demos and benchmarks).

::

    with launch_reference(args=["--slots", "4", "--ms-per-token", "2"]) as server:
        ...  # server.url, server.port, server.kill(), server.restart()

The child is ``python -m eagle3_raw.reference --host 127.0.0.1 --port N --exit-with-stdin [args]``;
its stdout and stderr go to a log file whose tail is in the error when it fails to start. Its stdin is
a pipe this process holds open for the child's life: however this process dies (even SIGKILL), the
kernel closes the pipe and the child shuts down, so no server outlives its launcher (unless a process
forked from the launcher, which inherits the pipe, is still alive).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from eagle3_raw.errors import ServerUnreachable

_POLL_SECONDS = 0.05


class ReferenceProcess:
    """A running reference server on ``127.0.0.1:port``; a context manager that stops it on exit."""

    def __init__(self, port: int, args: Sequence[str], env: Mapping[str, str] | None, startup_timeout: float):
        self.port = port
        self.args = tuple(args)
        self.env = dict(env) if env is not None else None
        self.startup_timeout = startup_timeout
        fd, name = tempfile.mkstemp(prefix=f"eagle3-raw-reference-{port}-", suffix=".log")
        os.close(fd)
        self.log_path = Path(name)
        self.process = self._spawn()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _spawn(self) -> subprocess.Popen[bytes]:
        command = [
            sys.executable,
            "-m",
            "eagle3_raw.reference",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--exit-with-stdin",
        ]
        with self.log_path.open("ab") as log:
            return subprocess.Popen(
                [*command, *self.args],
                stdin=subprocess.PIPE,  # never written; closing it stops the child (see module doc)
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self.env} if self.env is not None else None,
            )

    def wait_ready(self) -> None:
        """Block until ``/health`` answers 200; raise :class:`ServerUnreachable` with the log tail."""
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self._close_stdin()
                raise ServerUnreachable(
                    f"the reference server exited with code {self.process.returncode}{self._tail()}"
                )
            if _healthy(self.url):
                return
            time.sleep(_POLL_SECONDS)
        self.kill()
        raise ServerUnreachable(
            f"the reference server did not answer within {self.startup_timeout:g} s{self._tail()}"
        )

    def _tail(self, lines: int = 20) -> str:
        text = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        return f"; log {self.log_path}:\n" + "\n".join(text) if text else f" (empty log {self.log_path})"

    def kill(self) -> None:
        """SIGKILL: the server dies at once, mid-response if need be."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        self._close_stdin()

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM, then SIGKILL if it has not exited within ``timeout`` seconds."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self._close_stdin()

    def _close_stdin(self) -> None:
        if self.process.stdin is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()

    def restart(self, *, kill: bool = False) -> None:
        """Stop (or kill) the server and start it again on the same port, waiting until it is ready."""
        self.kill() if kill else self.stop()
        self.process = self._spawn()
        self.wait_ready()

    def __enter__(self) -> ReferenceProcess:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()
        if kind is None:
            with contextlib.suppress(OSError):
                self.log_path.unlink()


def launch_reference(
    *,
    port: int | None = None,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    startup_timeout: float = 10.0,
) -> ReferenceProcess:
    """Start ``python -m eagle3_raw.reference`` on ``127.0.0.1`` (a free port unless ``port`` is given)
    and wait until ``/health`` answers. ``env`` is added to this process's environment."""
    for attempt in range(3):
        server = ReferenceProcess(port or free_port(), args, env, startup_timeout)
        try:
            server.wait_ready()
            return server
        except ServerUnreachable:
            in_use = "address already in use" in server.log_path.read_text(errors="replace").lower()
            if port is not None or not in_use or attempt == 2:
                raise
    raise AssertionError("unreachable")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=1.0) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False
