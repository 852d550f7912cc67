"""Runs at the start of every Python process of the real SGLang server in the tests.

This folder (``tests/real_sglang/site``) is on the server's ``PYTHONPATH`` only
(``tests/real_sglang/server.py``); nothing here is part of eagle3_raw.

torchvision op schemas. SGLang imports torchvision at start-up even for a text model
(``sglang/srt/configs/__init__.py`` -> ``sglang/srt/multimodal/internvl_utils.py``). PyPI's
torchvision wheel is linked against a CUDA torch, so beside the CPU torch its ``_C`` library does
not load, no ``torchvision::*`` operator gets defined, and ``torchvision/_meta_registrations.py``
then fails at import with ``operator torchvision::nms does not exist`` (it registers fake kernels
for ``nms`` and ``qnms`` unconditionally). Defining those two schemas before torchvision is
imported lets its Python part import; a text model never calls its operators.
"""

from __future__ import annotations

import importlib.abc
import sys
from typing import Any

_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
_library: Any = None  # kept alive: the schemas live as long as the Library object


def _define_torchvision_schemas() -> None:
    global _library
    if _library is not None:
        return
    import torch

    _library = torch.library.Library("torchvision", "DEF")
    for schema in _SCHEMAS:
        _library.define(schema)


class _BeforeTorchvision(importlib.abc.MetaPathFinder):
    """Defines the schemas when ``torchvision`` is first imported (so other processes need no torch)."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> None:
        if fullname == "torchvision":
            sys.meta_path.remove(self)
            _define_torchvision_schemas()
        return None  # the normal finders import torchvision itself


sys.meta_path.insert(0, _BeforeTorchvision())
