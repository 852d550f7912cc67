"""The recipe's local files within bounds (prompt source, chat template, tokenizer folder), checked
before any of them is read."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from eagle3_raw import limits
from eagle3_raw.errors import RecipeError
from eagle3_raw.limits import check_regular_file
from eagle3_raw.recipe.fingerprint import is_digestible, tokenizer_path

if TYPE_CHECKING:
    from eagle3_raw.recipe.schema import Recipe


def check_local_files(recipe: Recipe) -> None:
    """The local files of ``recipe`` within bounds, before any of them is read."""
    source = recipe.resolve_path(recipe.prompts.source)
    if source.exists() and not (source.is_dir() or source.is_file()):
        raise RecipeError("prompts.source", str(source), "expected a regular file or a folder")
    if recipe.model.chat_template is not None:
        template = recipe.resolve_path(recipe.model.chat_template)
        if template.exists():
            check_regular_file("model.chat_template", template, limits.TEMPLATE_BYTES)
    folder = tokenizer_path(recipe)
    if folder is not None and recipe.model.tokenizer != "reference":
        check_tokenizer_folder(folder)


def check_tokenizer_folder(folder: Path) -> None:
    """RecipeError when the folder has more than :data:`~eagle3_raw.limits.TOKENIZER_FILES` files
    or :data:`~eagle3_raw.limits.TOKENIZER_BYTES` bytes to digest; the walk itself stops after
    :data:`~eagle3_raw.limits.WALK_ENTRIES` (the bounds are read from :mod:`eagle3_raw.limits` at
    each call)."""
    files = size = 0
    for entries, path in enumerate(_walk(folder), start=1):
        if entries > limits.WALK_ENTRIES:
            _too_big(folder, f"more than {limits.WALK_ENTRIES:,} entries below it")
        if not is_digestible(path, folder):
            continue
        files += 1
        size += path.stat().st_size
        if files > limits.TOKENIZER_FILES or size > limits.TOKENIZER_BYTES:
            _too_big(
                folder,
                f"more than {limits.TOKENIZER_FILES:,} files or {limits.TOKENIZER_BYTES:,} bytes to read",
            )


def _walk(folder: Path) -> Iterator[Path]:
    """Every path below ``folder``, lazily, without following links to folders."""
    for root, dirs, names in os.walk(folder):
        for name in (*dirs, *names):
            yield Path(root, name)


def _too_big(folder: Path, what: str) -> None:
    raise RecipeError(
        "model.tokenizer", str(folder),
        f"has {what}; a tokenizer folder holds a few files (tokenizer.json, tokenizer_config.json, "
        "...): point it at the tokenizer's own folder",
    )  # fmt: skip
