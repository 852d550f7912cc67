"""Package facades that load their modules on first use (PEP 562).

``eagle3_raw.hub`` and ``eagle3_raw.export`` offer their public names from the package, as users
import them; loading every module of the package for that would run whenever any one module of it
is imported (Python runs the package first), so two packages whose modules use each other
(pushing publishes export files, exporting reads a built set) would import in a circle. A facade
built here imports the module that defines a name when the name is first asked for.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def facade(package: str, exports: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: ``exports`` maps each public name to the
    module (under ``package``, or absolute when it contains a dot) that defines it."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module if "." in module else f"{package}.{module}"), name)
        importlib.import_module(package).__dict__[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(exports)

    return __getattr__, __dir__
