"""The seam with datasets' private API (``dataset_module_factory``), guarded.

``datasets`` is pinned to one major version in pyproject.toml; these tests fail first if a new
release moves the seam.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import datasets
import pytest


def _python(code: str) -> str:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return result.stdout.strip()


@pytest.mark.slow
def test_import_is_light_and_registers_when_datasets_is_imported_later() -> None:
    out = _python(
        "import sys, eagle3_raw\n"
        "print('datasets' in sys.modules, 'transformers' in sys.modules, 'aiohttp' in sys.modules)\n"
        "import datasets.load as load\n"
        "print(getattr(load.dataset_module_factory, '_eagle3_raw', False))\n"
    )
    assert out.splitlines() == ["False False False", "True"]


@pytest.mark.slow
def test_registration_after_datasets_was_imported() -> None:
    out = _python(
        "import datasets.load as load, eagle3_raw\n"
        "print(getattr(load.dataset_module_factory, '_eagle3_raw', False))\n"
        "m = load.dataset_module_factory('eagle3_raw')\n"
        "print(m.module_path, m.builder_kwargs)\n"
    )
    assert out.splitlines() == ["True", "eagle3_raw.builder {'dataset_name': 'eagle3_raw'}"]


def test_other_names_still_reach_datasets(tmp_path: Path) -> None:
    import eagle3_raw  # noqa: F401

    (tmp_path / "rows.jsonl").write_text('{"a": 1}\n{"a": 2}\n')
    rows = datasets.load_dataset(
        "json", data_files=str(tmp_path / "rows.jsonl"), split="train", cache_dir=str(tmp_path)
    )
    assert rows["a"] == [1, 2]


def test_recipe_is_required() -> None:
    import pytest

    import eagle3_raw  # noqa: F401

    with pytest.raises(ValueError, match="needs recipe="):
        datasets.load_dataset_builder("eagle3_raw")
