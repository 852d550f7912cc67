"""vLLM 0.33.0's own request and response models, for checking the reference server's vLLM mode.

The stock ``vllm==0.33.0`` wheel (a CUDA build, about 340 MB) is fetched once with
``pip download vllm==0.33.0 --no-deps`` (pip's cache answers a second fetch), and its Python
members (no compiled kernels, no ``third_party``) are extracted under
``~/.cache/eagle3_raw/vllm-0.33.0/src`` (``$EAGLE3_RAW_VLLM_CONTRACT_CACHE`` overrides the folder;
``$EAGLE3_RAW_VLLM_WHEEL`` names a wheel already on disk), marked complete only at the end; never
committed. Importing the models needs torch: :func:`validate` runs ``tests/real_vllm/validate.py``
with the real-vLLM tier's venv python (torch 2.13 CPU, :mod:`tests.real_vllm.venv`) and the
extracted 0.33.0 package first on ``sys.path`` (about 9 s of imports).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.real_vllm.venv import python
from tests.support.fetch_lock import fetch_lock
from tests.support.pace import scaled

CONTRACT_VERSION = "0.33.0"
_VALIDATOR = Path(__file__).resolve().parent / "validate.py"
_DONE = "eagle3_raw-complete"


def cache_dir() -> Path:
    default = Path.home() / ".cache" / "eagle3_raw" / f"vllm-{CONTRACT_VERSION}"
    return Path(os.environ.get("EAGLE3_RAW_VLLM_CONTRACT_CACHE", default))


def source_root() -> Path:
    """The folder holding the wheel's ``vllm`` package (Python members only), extracted once."""
    root = cache_dir() / "src"
    if not (root / _DONE).exists():
        with fetch_lock(cache_dir(), "wheel"):
            if not (root / _DONE).exists():  # another worker may have extracted it meanwhile
                _extract(_wheel(), root)
    return root


def _extract(wheel: Path, root: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.namelist():
            if member.startswith("vllm/") and not member.endswith(".so") and "/third_party/" not in member:
                archive.extract(member, root)
    (root / _DONE).write_text(wheel.name)


def _wheel() -> Path:
    local = os.environ.get("EAGLE3_RAW_VLLM_WHEEL")
    if local:
        return Path(local)
    folder = Path(tempfile.mkdtemp(prefix="vllm-wheel-"))
    command = [sys.executable, "-m", "pip", "download", f"vllm=={CONTRACT_VERSION}", "--no-deps",
               "-d", str(folder), "--quiet", "--disable-pip-version-check"]  # fmt: skip
    subprocess.run(command, check=True, timeout=scaled(1200))
    return next(folder.glob("vllm-*.whl"))


def validate(venv: Path, checks: Sequence[tuple[str, Any]]) -> list[str | None]:
    """For each ``(model name, body)``: None when vLLM 0.33.0's model takes the body, else why not
    (pydantic's error, or the keys the body has that the model does not). One subprocess for all."""
    env = {**os.environ, "PYTHONPATH": str(source_root()), "VLLM_TARGET_DEVICE": "cpu",
           "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}  # fmt: skip
    payload = json.dumps([[name, body] for name, body in checks])
    done = subprocess.run(
        [str(python(venv)), str(_VALIDATOR)], input=payload, capture_output=True, text=True,
        env=env, timeout=scaled(300), check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    verdicts: list[str | None] = json.loads(done.stdout.splitlines()[-1])
    return verdicts
