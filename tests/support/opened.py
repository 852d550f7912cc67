"""Which files this process opens, for tests: ``with opened_under(folder) as seen: ...``.

A Python audit hook (``sys.addaudithook``) sees every ``open`` this process makes, by Python code
or by C code that goes through Python's ``open`` (``io``, ``pathlib``, ``os.open``, ``tokenizers``
loading through Python); hooks cannot be removed, so one is installed once and records only while a
watch is active. Child processes are not watched.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_watches: list[tuple[str, list[str]]] = []
_installed = False


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if event != "open" or not _watches or not args or not isinstance(args[0], str | bytes | os.PathLike):
        return
    path = os.path.abspath(os.fsdecode(args[0]))
    for root, seen in _watches:
        if path == root or path.startswith(root + os.sep):
            seen.append(path)


@contextlib.contextmanager
def opened_under(folder: Path) -> Iterator[list[str]]:
    """The paths opened below ``folder`` (resolved) while the block runs."""
    global _installed
    if not _installed:
        sys.addaudithook(_hook)
        _installed = True
    seen: list[str] = []
    watch = (str(folder.resolve()), seen)
    _watches.append(watch)
    try:
        yield seen
    finally:
        _watches.remove(watch)
