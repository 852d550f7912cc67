"""Start the reference server in a subprocess (for tests, demos and benchmarks).

::

    with launch_reference(args=["--slots", "4", "--ms-per-token", "2"]) as server:
        ...  # server.url, server.port, server.kill(), server.restart()

The child is ``python -m eagle3_raw.reference --host 127.0.0.1 --port N --exit-with-stdin [args]``;
its stdout and stderr go to a log file whose tail is in the error when it fails to start. An API key
reaches it through its environment (``--api-key-env``), never its command line, which every local
user can read (``ps``, ``/proc/<pid>/cmdline``).

A recipe's ``server.launch_args`` may hold only the options in :data:`RECIPE_OPTIONS`
(:func:`check_launch_args`, applied when the recipe is validated): the ones that shape the
simulated server. Where it listens, its key and the files it reads or writes are eagle3_raw's
choice, never a recipe's. Its stdin is
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
from collections.abc import Iterator, Mapping, Sequence
from http import HTTPStatus
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from eagle3_raw.errors import RecipeError, ServerUnreachable
from eagle3_raw.limits import REFERENCE_STARTUP_TIMEOUT
from eagle3_raw.reference import READY

if TYPE_CHECKING:
    from eagle3_raw.recipe import Recipe

_POLL_SECONDS = 0.05

KEY_VARIABLE = "EAGLE3_RAW_REFERENCE_API_KEY"
"""The child's environment variable that carries the API key (``--api-key-env``)."""

#: serve-reference options a recipe's ``server.launch_args`` may give, and whether they take a value.
RECIPE_OPTIONS: Mapping[str, bool] = {
    "--slots": True, "--ms-per-token": True, "--prefill-ms-per-token": True, "--faults": True,
    "--fault-seed": True, "--context-length": True, "--max-running-requests": True,
    "--max-queued-requests": True, "--stream-interval": True, "--served-model-name": True,
    "--preferred-sampling-params": True, "--speculative-algorithm": True,
    "--speculative-num-steps": True, "--speculative-eagle-topk": True,
    "--speculative-num-draft-tokens": True, "--speculative-draft-model-path": True,
    "--speculative-draft-model-revision": True, "--draft-acceptance": True, "--disable-radix-cache": False,
    "--skip-tokenizer-init": False,
    "--weight-version": True, "--reasoning-parser": True, "--tool-call-parser": True,
}  # fmt: skip

_REFUSED: Mapping[str, str] = {
    "--host": "the launched server listens on 127.0.0.1 only",
    "--port": "a free port is chosen for it",
    "--api-key": "its key comes from server.api_key_env, through the environment",
    "--api-key-env": "its key comes from server.api_key_env",
    "--ledger": "it writes a file; to keep a ledger, run `eagle3-raw serve-reference --ledger FILE` yourself "
    "and list its URL in server.endpoints",
    "--model-path": "it reads a local folder; run `eagle3-raw serve-reference` yourself for another model",
    "--exit-with-stdin": "eagle3_raw sets it",
}


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
        self._log_start = self.log_path.stat().st_size  # where this process's lines begin
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
            # Its own "ready" line first: another process that took the free port in between
            # would answer /health for it, and this one then fails to bind.
            if self._said_ready() and healthy(self.url):
                return
            time.sleep(_POLL_SECONDS)
        self.kill()
        raise ServerUnreachable(
            f"the reference server did not answer within {self.startup_timeout:g} s (server.startup_timeout)"
            f"{self._tail()}"
        )

    def _said_ready(self) -> bool:
        """Whether the current process has logged that it is serving (it holds the port)."""
        with self.log_path.open("rb") as log:
            log.seek(self._log_start)
            return READY.encode() in log.read()

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
    startup_timeout: float = REFERENCE_STARTUP_TIMEOUT,
    api_key: str | None = None,
) -> ReferenceProcess:
    """Start ``python -m eagle3_raw.reference`` on ``127.0.0.1`` (a free port unless ``port`` is given)
    and wait until ``/health`` answers. ``env`` is added to this process's environment; ``api_key``
    goes into it too (as :data:`KEY_VARIABLE`), never into the command line."""
    if api_key:
        env = {**(env or {}), KEY_VARIABLE: api_key}
        args = [*args, "--api-key-env", KEY_VARIABLE]
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


def healthy(url: str, timeout: float = 1.0) -> bool:
    """Whether ``url``'s ``/health`` answers 200 within ``timeout`` seconds (a start-up poll)."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout) as response:
            return bool(response.status == HTTPStatus.OK)
    except (urllib.error.URLError, OSError):
        return False


@contextlib.contextmanager
def recipe_endpoints(recipe: Recipe, api_key: str | None) -> Iterator[tuple[str, ...]]:
    """The recipe's endpoints, plus a reference server started for the run if it asks for one
    (with the recipe's ``launch_args``, checked by :func:`check_launch_args`, and ``api_key``)."""
    if recipe.server.launch != "reference":
        yield recipe.server.endpoints
        return
    check_launch_args(recipe.server.launch_args)
    with launch_reference(
        args=recipe.server.launch_args, api_key=api_key, startup_timeout=recipe.server.startup_timeout
    ) as server:
        yield (*recipe.server.endpoints, server.url)


def check_launch_args(args: Sequence[str]) -> None:
    """RecipeError unless every option in ``args`` is one of :data:`RECIPE_OPTIONS`, spelt in full
    (argparse would take ``--led`` for ``--ledger``), each with a value if it takes one."""
    expects_value = False
    for arg in args:
        if expects_value:
            expects_value = False
            continue
        name, has_value, _ = arg.partition("=")
        if name not in RECIPE_OPTIONS:
            raise RecipeError("server.launch_args", list(args), _refusal(name))
        expects_value = RECIPE_OPTIONS[name] and not has_value
    if expects_value:
        raise RecipeError("server.launch_args", list(args), f"{args[-1]} needs a value after it")


def _refusal(name: str) -> str:
    allowed = ", ".join(sorted(RECIPE_OPTIONS))
    if name in _REFUSED:
        return f"{name} is not allowed in a recipe: {_REFUSED[name]}; allowed: {allowed}"
    what = f"{name!r} is not a serve-reference option" if name.startswith("-") else f"{name!r} is no option"
    return f"{what} a recipe may give (spell options in full); allowed: {allowed}"
