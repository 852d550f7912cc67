"""Test-wide isolation: every cache and journal in a temporary folder, nothing from the real Hub.

The environment is set before ``datasets``/``huggingface_hub`` are imported (both read it at import).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
import pytest_timeout

from tests.support.pace import scaled

_ROOT = Path(tempfile.mkdtemp(prefix="eagle3_raw-tests-"))
os.environ["HF_HOME"] = str(_ROOT / "hf_home")
os.environ["HF_DATASETS_CACHE"] = str(_ROOT / "datasets_cache")
os.environ["EAGLE3_RAW_JOURNAL_DIR"] = str(_ROOT / "journals")
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
os.environ["HF_HUB_DISABLE_XET"] = "1"
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.pop("HF_TOKEN", None)

pytest_plugins = ["tests.support.hub_server"]


def pytest_terminal_summary(terminalreporter: Any, config: Any) -> None:
    """The real-server tiers' measured times (venv build, server start, pace), when they ran
    (written by ``tests/real_sglang/conftest.py`` and ``tests/real_vllm/conftest.py``)."""
    factory = getattr(config, "_tmp_path_factory", None)
    for name, tier in (("real_sglang_times.json", "SGLang"), ("real_vllm_times.json", "vLLM")):
        times = factory.getbasetemp() / name if factory is not None else None
        if times is not None and times.exists():
            terminalreporter.write_line(f"real {tier} tier: {times.read_text()}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The real-server tiers count as slow too, so ``pytest -m "not slow"`` (the quick loop) leaves
    them out. Their ``real_sglang`` and ``real_vllm`` markers are put on by their folders' conftest
    hooks, which run first (``tryfirst``); ``-m`` deselects after every conftest's hook (pytest's
    own runs last)."""
    for item in items:
        if any(item.get_closest_marker(tier) is not None for tier in ("real_sglang", "real_vllm")):
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> object:
    """pytest-timeout's own timer, its limit (``timeout`` in pyproject.toml, or a test's mark)
    stretched by the machine's pace when the test starts (:mod:`tests.support.pace`)."""
    stretched = settings._replace(timeout=scaled(settings.timeout))
    return pytest_timeout.pytest_timeout_set_timer(item=item, settings=stretched)
