"""Start the real SGLang 0.5.23 on the CPU with the reference model, for the real-SGLang tests.

::

    with launch_real(model_folder(tmp), "--reasoning-parser", "qwen3") as server:
        ...  # server.url, server.log_path, server.requests()

The command is the venv's ``python -m sglang.launch_server --model-path M --host 127.0.0.1 --port
N`` with :data:`CPU_FLAGS`, in the environment :func:`server_env` gives (SGLang's CPU engine, the
reference model class, the stand-ins of ``tests/real_sglang/site`` on ``PYTHONPATH``). Recipes
that launch SGLang themselves (``server.launch: sglang``) use the same flags and environment
(:func:`launch_section`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3_raw.launching.reference import free_port, healthy
from eagle3_raw.resources import reference_model_dir
from tests.real_sglang.venv import ensure_venv, python

REPO = Path(__file__).resolve().parents[2]
SITE = Path(__file__).resolve().parent / "site"
ARCHITECTURE = "Eagle3RawReferenceForCausalLM"  # tests/real_sglang/site/eagle3_raw_reference_model
# The flags SGLang 0.5.23 needs on this CPU (shared/sglang-on-cpu.md), after --model-path/--host/--port.
CPU_FLAGS = (
    "--device", "cpu", "--load-format", "dummy", "--attention-backend", "torch_native",
    "--sampling-backend", "pytorch", "--disable-cuda-graph", "--skip-server-warmup",
    "--mem-fraction-static", "0.1", "--max-total-tokens", "16384",
)  # fmt: skip
MODEL_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "segments.json")


def server_env(marker: str | None = None) -> dict[str, str]:
    """What the server's processes need in their environment (``marker``: a value of
    ``E3_REAL_SGLANG`` to find every process of one server by, see :func:`processes_marked`)."""
    env = {
        # without it --device cpu still takes CUDA code paths (sglang/srt/utils/common.py::is_cpu)
        "SGLANG_USE_CPU_ENGINE": "1",
        # the reference model class (sglang/srt/models/registry.py)
        "SGLANG_EXTERNAL_MODEL_PACKAGE": "eagle3_raw_reference_model",
        # the stand-ins, and eagle3_raw's reference engine for the model class
        "PYTHONPATH": os.pathsep.join([str(SITE), str(REPO)]),
    }
    if marker is not None:
        env["E3_REAL_SGLANG"] = marker
    return env


def model_folder(parent: Path) -> Path:
    """``parent/reference-model``: the reference model's tokenizer, template and segments, with a
    ``config.json`` naming the model class the real SGLang runs it with."""
    folder = parent / "reference-model"
    if (folder / "config.json").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    source = reference_model_dir()
    for name in MODEL_FILES:
        shutil.copyfile(source / name, folder / name)
    config = json.loads((source / "config.json").read_text())
    config["architectures"] = [ARCHITECTURE]
    partial = folder / "config.json.partial"
    partial.write_text(json.dumps(config, indent=2))
    partial.replace(folder / "config.json")
    return folder


def launch_section(model: Path, *extra_args: str, marker: str, **fields: Any) -> dict[str, Any]:
    """A recipe's ``server`` section that launches the real SGLang with the default executable
    (the client must then run on the venv's Python: :func:`client_command`)."""
    sglang = {
        "model_path": str(model), "extra_args": [*CPU_FLAGS, *extra_args], "env": server_env(marker),
        "startup_timeout": 900, "stop_timeout": 20, **fields,
    }  # fmt: skip
    return {"endpoints": None, "launch": "sglang", "sglang": sglang}


def client_command(*args: str) -> list[str]:
    """``eagle3-raw ARGS`` on the venv's Python, where ``python -m sglang.launch_server`` runs."""
    return [str(python(ensure_venv())), "-m", "eagle3_raw.cli", *args]


def client_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of :func:`client_command`: this checkout's eagle3_raw on the path."""
    return {**os.environ, "PYTHONPATH": str(REPO), **(extra or {})}


@dataclass
class RealSGLang:
    """A running real SGLang server (its own process group) and where its logs are."""

    url: str
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path
    requests_dir: Path
    started_seconds: float

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def requests(self) -> list[dict[str, Any]]:
        """The server's own request log (``--log-requests-format json``): one event per line,
        ``request.received`` and ``request.finished``, each with its ``rid``."""
        events = []
        for file in sorted(self.requests_dir.glob("*.log*")):
            for line in file.read_text(errors="replace").splitlines():
                start = line.find("{")
                if start >= 0:
                    with contextlib.suppress(ValueError):
                        events.append(json.loads(line[start:]))
        return events

    def received_rids(self) -> list[str]:
        """The rids of the ``/generate`` requests eagle3_raw sent (``<row id>#<attempt>-<hex>``), in
        the order the server received them (not its own ``/health`` generations, nor others)."""
        return [
            str(e["rid"]) for e in self.requests()
            if e.get("event") == "request.received" and "#" in str(e.get("rid"))
        ]  # fmt: skip

    def stop(self, timeout: float = 30) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout)
        with contextlib.suppress(ProcessLookupError):  # a guard that did not stop in time
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(10)


@contextlib.contextmanager
def launch_real(model: Path, *args: str, log_dir: Path, startup_timeout: float = 900) -> Iterator[RealSGLang]:
    """The real SGLang serving ``model`` (CPU flags, request log on), stopped on exit.

    Fails with the log's tail if the server exits before ``/health`` answers or does not answer
    within ``startup_timeout`` seconds (a generous bound: start-up is 30-130 s here).
    """
    venv = ensure_venv()
    port = free_port()
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path, requests_dir = log_dir / f"sglang-{port}.log", log_dir / f"requests-{port}"
    command = [
        str(python(venv)), "-m", "sglang.launch_server", "--model-path", str(model),
        "--host", "127.0.0.1", "--port", str(port), *CPU_FLAGS,
        "--log-requests", "--log-requests-level", "0", "--log-requests-format", "json",
        "--log-requests-target", str(requests_dir), *args,
    ]  # fmt: skip
    started = time.monotonic()
    # Under the project's own guard (eagle3_raw.launching.guard): this process holds the guard's
    # stdin, so a pytest killed by a timeout or SIGKILL takes the server down with it instead of
    # leaving a scheduler spinning on the machine's cores for the rest of the run.
    guarded = [sys.executable, "-m", "eagle3_raw.launching.guard", "--stop-timeout", "20", "--", *command]
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            guarded, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.PIPE,
            env={**os.environ, **server_env(f"shared-{port}")}, start_new_session=True,
        )  # fmt: skip
    server = RealSGLang(f"http://127.0.0.1:{port}", port, process, log_path, requests_dir, 0.0)
    try:
        _wait_healthy(server, startup_timeout, started)
        server.started_seconds = time.monotonic() - started
        yield server
    finally:
        server.stop()


def _wait_healthy(server: RealSGLang, timeout: float, started: float) -> None:
    while not healthy(server.url, timeout=5):
        code = server.process.poll()
        if code is not None or time.monotonic() - started > timeout:
            tail = server.log()[-4000:]
            why = f"exited with code {code}" if code is not None else f"did not answer within {timeout} s"
            raise RuntimeError(f"the real SGLang {why}; the end of its log:\n{tail}")
        time.sleep(0.5)


def processes_marked(marker: str) -> list[int]:
    """Pids of live processes whose environment has ``E3_REAL_SGLANG=marker`` (a server's
    launcher, scheduler, detokenizer, ... all inherit it; their command lines are rewritten)."""
    wanted = f"E3_REAL_SGLANG={marker}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and wanted in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def post(
    url: str, path: str, body: Any, *, timeout: float = 300, headers: Mapping[str, str] | None = None
) -> Any:
    """POST JSON, the parsed 200 answer (an HTTPError for any other status)."""
    sent = {"Content-Type": "application/json", **(headers or {})}
    request = urllib.request.Request(url + path, data=json.dumps(body).encode(), headers=sent)
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def get(url: str, path: str, *, timeout: float = 60) -> Any:
    with urllib.request.urlopen(url + path, timeout=timeout) as response:
        return json.loads(response.read())


def tokenize_chat(url: str, messages: Sequence[Any], **fields: Any) -> list[int]:
    """The real server's chat-path render of ``messages`` (``/tokenize`` with ``messages``)."""
    answer = post(url, "/tokenize", {"messages": list(messages), "add_generation_prompt": True, **fields})
    ids: list[int] = answer["tokens"]
    return ids
