"""SGLang's own JSON contract (``sglang/api/v1/api_types.py`` of the sglang 0.5.23 wheel), for tests.

The file is never committed: it is fetched once with ``pip download sglang==0.5.23 --no-deps``
(about 39 MB from PyPI), extracted, and cached under ``~/.cache/eagle3_raw/sglang-0.5.23/``
(``$EAGLE3_RAW_CONTRACT_CACHE`` overrides the folder; ``$EAGLE3_RAW_SGLANG_WHEEL`` names a wheel
already on disk). It is loaded by file path with ``msgspec`` installed, without importing ``sglang``.
:func:`source_root` extracts other members the same way (``tests/support/sglang_oracle.py``).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from tests.support.fetch_lock import fetch_lock
from tests.support.pace import scaled

SGLANG_VERSION = "0.5.23"
MEMBER = "sglang/api/v1/api_types.py"


def cache_dir() -> Path:
    default = Path.home() / ".cache" / "eagle3_raw" / f"sglang-{SGLANG_VERSION}"
    return Path(os.environ.get("EAGLE3_RAW_CONTRACT_CACHE", default))


def api_types_path() -> Path:
    """The cached ``api_types.py``, fetching the wheel first if needed."""
    target = cache_dir() / "api_types.py"
    if not target.exists():
        with fetch_lock(cache_dir(), "wheel"):
            if not target.exists():  # another worker may have fetched it meanwhile
                source = _extract(_wheel())
                partial = target.with_suffix(".partial")
                partial.write_bytes(source)
                partial.replace(target)
    return target


def source_root(members: Sequence[str]) -> Path:
    """A folder holding ``members`` (paths inside the wheel, e.g. ``sglang/srt/.../protocol.py``),
    extracted from the wheel once and cached under :func:`cache_dir` ``/src``; fetches the wheel
    only when one is missing."""
    root = cache_dir() / "src"
    if any(not (root / m).exists() for m in members):
        with fetch_lock(cache_dir(), "wheel"):
            _extract_members(root, [m for m in members if not (root / m).exists()])
    return root


def _extract_members(root: Path, missing: Sequence[str]) -> None:
    if missing:
        with zipfile.ZipFile(_wheel()) as archive:
            for member in missing:
                target = root / member
                target.parent.mkdir(parents=True, exist_ok=True)
                partial = target.with_name(target.name + ".partial")
                partial.write_bytes(archive.read(member))
                partial.replace(target)


def _wheel() -> Path:
    local = os.environ.get("EAGLE3_RAW_SGLANG_WHEEL")
    if local:
        return Path(local)
    folder = Path(tempfile.mkdtemp(prefix="sglang-wheel-"))
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        f"sglang=={SGLANG_VERSION}",
        "--no-deps",
        "-d",
        str(folder),
    ]
    subprocess.run([*command, "--quiet", "--disable-pip-version-check"], check=True, timeout=scaled(600))
    return next(folder.glob("sglang-*.whl"))


def _extract(wheel: Path) -> bytes:
    with zipfile.ZipFile(wheel) as archive:
        return archive.read(MEMBER)


def load_contract() -> ModuleType:
    """The contract module (``GenerateRequest``, ``GenerateResponse``, ``JsonContractError``, ...)."""
    name = "sglang_api_v1_api_types"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, api_types_path())
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def contract_error(contract: ModuleType, body: Any) -> str | None:
    """The contract's refusal text for a ``/generate`` body, or None when it accepts it."""
    try:
        contract.GenerateRequest.from_json_value(body)
    except contract.JsonContractError as exc:
        return str(exc)
    return None
