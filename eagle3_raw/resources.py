"""Where the files shipped with eagle3_raw live, in a source checkout and in an installed wheel.

The wheel maps the repository's top-level ``builder_scripts/`` and ``dataset_cards/`` into the
package (``eagle3_raw/builder_scripts``, ``eagle3_raw/dataset_cards``); a source checkout has them
next to the package.
"""

from __future__ import annotations

from pathlib import Path

from eagle3_raw.reference import model_files as reference_model_files

_PACKAGE = Path(__file__).resolve().parent


def _shipped(name: str) -> Path:
    for candidate in (_PACKAGE / name, _PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"eagle3_raw's {name}/ folder is missing from {_PACKAGE} (broken install?)")


def builder_scripts_dir() -> Path:
    """The bundled recipes (``demo.yaml``, ...)."""
    return _shipped("builder_scripts")


def dataset_cards_dir() -> Path:
    """The dataset card templates."""
    return _shipped("dataset_cards")


def reference_model_dir() -> Path:
    """The reference server's tiny model: tokenizer files, chat template, config."""
    return reference_model_files.reference_model_dir()
