"""Registering the ``"eagle3_raw"`` name with ``datasets``.

``datasets`` 4+ loads no scripts, so ``load_dataset("eagle3_raw")`` needs the name registered.
Adding it to ``_PACKAGED_DATASETS_MODULES`` would make ``datasets`` scan the working directory for
data files (wrong split, a cache key that changes with unrelated files); wrapping
``datasets.load.dataset_module_factory`` for this one name does not. Both are private API: the
``datasets`` major version is pinned and ``tests/test_registry.py`` guards the seam.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

NAME = "eagle3_raw"
MODULE_HASH = "eagle3_raw-rows-v1"
"""Part of the cache path ``datasets`` derives; constant so one recipe maps to one cache folder."""


def register() -> None:
    """Make ``load_dataset("eagle3_raw", ...)`` work; idempotent.

    Patches ``datasets.load`` now if it is imported, or right after it gets imported otherwise, so
    ``import eagle3_raw`` does not pay for importing ``datasets``.
    """
    module = sys.modules.get("datasets.load")
    if module is not None:
        _patch(module)
    elif not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())


def _patch(load_module: ModuleType) -> None:
    factory = load_module.__dict__["dataset_module_factory"]
    if getattr(factory, "_eagle3_raw", False):
        return

    def dataset_module_factory(path: str, *args: Any, **kwargs: Any) -> Any:
        if path == NAME:
            return _dataset_module(load_module)
        return factory(path, *args, **kwargs)

    dataset_module_factory._eagle3_raw = True  # type: ignore[attr-defined]
    load_module.__dict__["dataset_module_factory"] = dataset_module_factory


def _dataset_module(load_module: ModuleType) -> Any:
    return load_module.DatasetModule("eagle3_raw.builder", MODULE_HASH, {"dataset_name": NAME})


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patches ``datasets.load`` as soon as it has been executed."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "datasets.load":
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader.exec_module = _then_patch(spec.loader.exec_module)  # type: ignore[method-assign,assignment]
        return spec


def _then_patch(exec_module: Callable[[ModuleType], None]) -> Callable[[ModuleType], None]:
    def run(module: ModuleType) -> None:
        exec_module(module)
        _patch(module)

    return run
