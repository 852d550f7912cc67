"""The real SGLang 0.5.23 for the CPU, in a venv of its own, built once and cached.

``python -m tests.real_sglang.venv`` builds it by hand; the real-SGLang tests build it on first use
(:func:`ensure_venv`). What it takes (``shared/sglang-on-cpu.md``): sglang pins ``torch==2.14.1``,
a multi-GB CUDA build here, so the machine's CPU ``torch==2.13.0`` goes in first, then
``sglang==0.5.23`` without its dependencies, then the wheel's own ``Requires-Dist`` minus
:data:`LEFT_OUT` (CUDA-only kernels and media libraries a text model on the CPU never imports),
with torch held to the CPU build by a constraint, plus :data:`UNDECLARED`; then eagle3_raw's own
dependencies, so that the client runs in the same environment (eagle3_raw itself is not
installed: its checkout goes on ``PYTHONPATH``).

The venv lives under ``~/.cache/eagle3_raw/sglang-0.5.23-cpu`` (``$EAGLE3_RAW_SGLANG_VENV``
overrides it). It is built under a file lock (pytest-xdist workers wait for the one building), and
marked complete only at the very end, with a digest of what went in: a venv without the mark (a
build that was killed halfway) or with another digest (this file or eagle3_raw's dependencies
changed) is removed and built again. Nothing of the project is installed into it: the stand-ins
the CPU engine needs are put on the server's ``PYTHONPATH`` from ``tests/real_sglang/site`` at
launch, so they are always the checkout's own.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
from importlib.metadata import PathDistribution
from pathlib import Path
from typing import IO

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.support.fetch_lock import fetch_lock

SGLANG_VERSION = "0.5.23"
TORCH_VERSION = "2.13.0"  # the machine's CPU wheel; sglang's own pin (2.14.1) is a CUDA build
# Requirements of the sglang wheel left out, by canonical name (or name prefix ending in "-").
LEFT_OUT = {
    # CUDA-only kernels and libraries (no CPU build; a dense text model on the CPU engine never
    # imports them once sgl_kernel's two CPU helpers are stood in for: tests/real_sglang/site)
    "flashinfer-python": "CUDA kernels",
    "sglang-kernel": "CUDA libraries only (stand-in: tests/real_sglang/site/sgl_kernel)",
    "flash-attn-4": "CUDA kernels",
    "nvidia-": "CUDA libraries",
    "quack-kernels": "CUDA kernels",
    "sgl-deep-ep": "CUDA kernels",
    "sgl-deep-gemm": "CUDA kernels",
    "sgl-flash-mla": "CUDA kernels",
    "tilelang": "CUDA kernels",
    "humming-kernels": "CUDA kernels",
    "torch-memory-saver": "CUDA memory",
    "cuda-python": "CUDA bindings",
    "nvshmem4py-cu13": "CUDA bindings",
    # media: audio, video and vision models only
    "torchaudio": "audio models; pins a torch of its own",
    "torchcodec": "video models",
    "timm": "vision models",
    # not imported to serve a model
    "datasets": "benchmarks only",
    "modelscope": "a model hub client",
    # installed first from the machine's CPU wheel, and held there by a constraint
    "torch": "CPU build installed first",
}
_PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
UNDECLARED = ("dill",)  # imported by sglang/srt/sampling/custom_logit_processor.py, not declared


def venv_dir() -> Path:
    default = Path.home() / ".cache" / "eagle3_raw" / f"sglang-{SGLANG_VERSION}-cpu"
    return Path(os.environ.get("EAGLE3_RAW_SGLANG_VENV", default))


def python(venv: Path) -> Path:
    return venv / "bin" / "python"


def client_requirements() -> list[str]:
    """eagle3_raw's own dependencies (``pyproject.toml``): the client runs in the same venv, as
    on a GPU node where ``server.launch: sglang`` starts this Python's ``-m sglang.launch_server``."""
    with _PYPROJECT.open("rb") as file:
        dependencies: list[str] = tomllib.load(file)["project"]["dependencies"]
    return dependencies


def _recipe_digest() -> str:
    """What the venv is built from; a different one (this file or eagle3_raw's dependencies
    edited) rebuilds it."""
    recipe = Path(__file__).read_bytes() + json.dumps(client_requirements()).encode()
    return hashlib.sha256(recipe).hexdigest()[:16]


def _mark(venv: Path) -> Path:
    return venv / "eagle3_raw-complete.json"


def is_complete(venv: Path) -> bool:
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


def left_out(requirement: Requirement) -> bool:
    name = canonicalize_name(requirement.name)
    return any(name == key or (key.endswith("-") and name.startswith(key)) for key in LEFT_OUT)


def requirements(venv: Path) -> list[str]:
    """The installed sglang wheel's ``Requires-Dist`` for this platform, less :data:`LEFT_OUT`."""
    site = next((venv / "lib").glob("python3.*/site-packages"))
    dist = PathDistribution(site / f"sglang-{SGLANG_VERSION}.dist-info")
    kept = []
    for line in dist.requires or []:
        requirement = Requirement(line)
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue  # another platform, or an extra
        if not left_out(requirement):
            kept.append(str(requirement))
    return [*kept, *UNDECLARED]


def build(venv: Path, log: Path) -> None:
    """Build ``venv`` from scratch, logging pip's output to ``log``; marked complete at the end."""
    started = time.monotonic()
    shutil.rmtree(venv, ignore_errors=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        _run([sys.executable, "-m", "venv", str(venv)], out)
        pip = [str(python(venv)), "-m", "pip", "install", "--disable-pip-version-check"]
        _run([*pip, f"torch=={TORCH_VERSION}"], out)
        _run([*pip, "--no-deps", f"sglang=={SGLANG_VERSION}"], out)
        constraints = venv / "eagle3_raw-constraints.txt"
        constraints.write_text(f"torch=={TORCH_VERSION}\n")
        _run([*pip, "-c", str(constraints), *requirements(venv)], out)
        # beside sglang's resolution, every installed version held: pip refuses a conflict
        # (eagle3_raw needing a transformers other than the one sglang pins) instead of upgrading
        frozen = subprocess.run(
            [str(python(venv)), "-m", "pip", "freeze"], capture_output=True, text=True, check=True
        ).stdout
        constraints.write_text(f"{frozen}torch=={TORCH_VERSION}\n")
        _run([*pip, "-c", str(constraints), *client_requirements()], out)
        _check_torch(venv, out)
    seconds = round(time.monotonic() - started, 1)
    mark = {"recipe": _recipe_digest(), "sglang": SGLANG_VERSION, "torch": TORCH_VERSION, "seconds": seconds}
    _mark(venv).write_text(json.dumps(mark))


def _check_torch(venv: Path, out: IO[str]) -> None:
    done = subprocess.run(
        [str(python(venv)), "-c", "import torch; print(torch.__version__, torch.version.cuda)"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    version, cuda = done.stdout.split()
    if not version.startswith(TORCH_VERSION) or cuda != "None":
        raise RuntimeError(f"the SGLang venv got torch {version} (CUDA {cuda}), not the CPU {TORCH_VERSION}")


def _run(command: list[str], out: IO[str]) -> None:
    print("+", " ".join(command), file=out, flush=True)
    done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"building the SGLang venv failed ({' '.join(command[:6])} ...): see {out.name}")


if __name__ == "__main__":
    started = time.monotonic()
    path = ensure_venv()
    print(f"{path} ready in {time.monotonic() - started:.0f} s")
