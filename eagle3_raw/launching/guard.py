"""``python -m eagle3_raw.launching.guard --stop-timeout S -- COMMAND...``: a server that cannot
outlive the process that launched it.

The launcher starts this guard with a pipe as its stdin and keeps the other end; the guard starts
COMMAND in a new session (its own process group, out of reach of the terminal's Ctrl-C) and stops
that whole group, SIGTERM then SIGKILL after S seconds, as soon as any of these happens:

- its stdin reaches end of file: the launcher closed it, or died (even by SIGKILL: the kernel
  closes the pipe with the process);
- it gets SIGTERM, SIGINT or SIGHUP;
- the server exits by itself (what is left of its group is killed; the guard exits with its code).

The server also gets ``PR_SET_PDEATHSIG`` (SIGKILL) from the guard, so it dies with a guard that is
itself killed with SIGKILL. SGLang's own worker processes die with the server the same way
(``kill_itself_when_parent_died``, ``sglang/srt/utils/common.py:3432``).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

_PR_SET_PDEATHSIG = 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eagle3_raw.launching.guard", allow_abbrev=False)
    parser.add_argument("--stop-timeout", type=float, default=30.0)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command after --")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    server = _start(command)
    print(f"eagle3-raw guard {os.getpid()}: server pid {server.pid}", file=sys.stderr, flush=True)
    threading.Thread(target=_wait_for_eof, args=(stop,), daemon=True).start()
    while server.poll() is None and not stop.wait(0.1):
        pass
    if server.poll() is None:
        _stop_group(server, args.stop_timeout)
        return 0
    _kill_group(server.pid)  # whatever the server left behind in its group
    return server.returncode if server.returncode >= 0 else 128 - server.returncode


def _start(command: list[str]) -> subprocess.Popen[bytes]:
    """COMMAND in a new session (process group = its pid), killed if this guard dies."""
    return subprocess.Popen(
        command, stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_die_with_parent
    )


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _wait_for_eof(stop: threading.Event) -> None:
    try:
        while os.read(0, 65536):
            pass
    except OSError:
        pass  # no usable stdin counts as end of file
    stop.set()


def _stop_group(server: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGTERM to the server's group; SIGKILL to it if the server has not exited in ``timeout`` s."""
    _signal_group(server.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while server.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    _kill_group(server.pid)
    server.wait()


def _kill_group(pgid: int) -> None:
    _signal_group(pgid, signal.SIGKILL)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


if __name__ == "__main__":
    sys.exit(main())
