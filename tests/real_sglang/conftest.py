"""The real-SGLang tier: every test here runs against PyPI's sglang 0.5.23 on the CPU.

Selected with ``-m real_sglang`` and left out with ``-m "not real_sglang"`` (the marker is put on
every test of this folder). The tests share one real server per test run: the README's command
runs the tier in a pytest process of its own, without pytest-xdist (each xdist worker would start
its own server: with ``-n 3`` three were seen, their schedulers busy on both cores). They are also
one ``xdist_group``, for a ``--dist loadgroup`` run. The first test also waits for the venv build
(``tests/real_sglang/venv.py``, minutes on a fresh machine) and the server's start: the tier's
per-test timeout is generous, and longer when the venv is still to be built; the waits inside the
tests come from the server's measured pace (:class:`Pace`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.real_sglang import venv
from tests.real_sglang.server import RealSGLang, launch_real, model_folder, post

_HERE = Path(__file__).resolve().parent
GROUP = "real_sglang"
TEST_SECONDS = 900  # one test, the server started (a launch test starts its own: 30-130 s each)
BUILD_SECONDS = 1800  # the venv built first (about 130-270 s here; a slow mirror takes longer)
TIMES = "real_sglang_times.json"
MAX_RUNNING = 24  # the shared server's --max-running-requests: the in-flight default is derived from it
# The shared server's flags after the CPU ones; the reference server takes them too (test_conformance.py).
SERVER_FLAGS = (
    "--reasoning-parser", "qwen3", "--tool-call-parser", "qwen25", "--enable-deterministic-inference",
    "--max-running-requests", str(MAX_RUNNING),
)  # fmt: skip


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's, which reads xdist_group
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    seconds = TEST_SECONDS + (0 if venv.is_complete(venv.venv_dir()) else BUILD_SECONDS)
    for item in items:
        if _HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.real_sglang)
            item.add_marker(pytest.mark.xdist_group(GROUP))
            item.add_marker(pytest.mark.timeout(seconds))


@dataclass(frozen=True)
class Pace:
    """How fast this machine runs the real server, measured once: waits are multiples of it."""

    startup_seconds: float
    tokens_per_second: float

    def seconds_for(self, tokens: int, *, margin: float = 10.0) -> float:
        """A generous bound for generating ``tokens`` tokens (one request at a time), plus a minute."""
        return 60.0 + margin * tokens / self.tokens_per_second


@pytest.fixture(scope="session")
def real_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("real-sglang-logs")


@pytest.fixture(scope="session")
def real_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The model folder the real servers serve: the reference model's tokenizer and template with a
    config naming the model class (``tests/real_sglang/server.py::model_folder``)."""
    return model_folder(tmp_path_factory.mktemp("real-sglang-model"))


@pytest.fixture(scope="session")
def real_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    started = time.monotonic()
    built = not venv.is_complete(venv.venv_dir())
    path = venv.ensure_venv()
    _record(tmp_path_factory, venv_seconds=round(time.monotonic() - started, 1), venv_built=built)
    return path


@pytest.fixture(scope="session")
def real_server(
    real_venv: Path, real_model: Path, real_logs: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RealSGLang]:
    """One real SGLang for the tier: the reference model, Qwen3-style parsers, deterministic
    inference (as the bundled recipes launch it), a batch of :data:`MAX_RUNNING`, its request log on."""
    with launch_real(real_model, *SERVER_FLAGS, log_dir=real_logs) as server:
        _record(tmp_path_factory, server_start_seconds=round(server.started_seconds, 1))
        yield server


@pytest.fixture(scope="session")
def pace(real_server: RealSGLang, tmp_path_factory: pytest.TempPathFactory) -> Pace:
    """The server's start-up time and its speed on one 64-token greedy generation."""
    started = time.monotonic()
    body = {"text": "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", "sampling_params": {
        "max_new_tokens": 64, "temperature": 0, "ignore_eos": True}}  # fmt: skip
    tokens = post(real_server.url, "/generate", body)["meta_info"]["completion_tokens"]
    measured = Pace(real_server.started_seconds, tokens / max(time.monotonic() - started, 1e-3))
    _record(tmp_path_factory, tokens_per_second=round(measured.tokens_per_second, 1))
    return measured


def _record(factory: pytest.TempPathFactory, **values: object) -> None:
    """Keep the tier's measured times where ``tests/conftest.py`` prints them at the end (the
    run's temporary folder; a pytest-xdist worker's is one below it)."""
    base = factory.getbasetemp()
    path = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / TIMES
    recorded = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps({**recorded, **values}))
