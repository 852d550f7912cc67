"""The recipe as a push publishes it, and the check that nothing uploaded holds a credential.

Layout in the dataset repo, per config ``<name>``::

    recipes/<name>.yaml                      the resolved recipe, secrets scrubbed
    recipes/<name>/prompts/<source name>     a local prompt source (the file, or the data files of a
                                             folder that the build reads: its top-level .jsonl,
                                             .json and .parquet files, not hidden)
    recipes/<name>/chat_template/<its name>  a local chat template override
    recipes/<name>.manifest.json             :func:`eagle3_raw.hub.build_manifest`
    recipes/<name>.lengths.svg               the length histograms
    recipes/<name>/vocab/...                 token frequencies, d2t/t2d (:mod:`eagle3_raw.export.published`)

The published recipe points at its files relatively, so it loads from a download of the repo with
the same fingerprint; :func:`publish_recipe` checks that before anything is uploaded.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from eagle3_raw.errors import HubError
from eagle3_raw.recipe import (
    REFERENCE_TOKENIZER,
    Recipe,
    digested_files,
    load_recipe,
    prompt_source_files,
    tokenizer_path,
)
from eagle3_raw.redact import is_secret_name, scrub


@dataclass(frozen=True)
class PublishedRecipe:
    """The recipe as uploaded: scrubbed, local files rewritten to paths beside it, and those files."""

    name: str
    data: Mapping[str, Any]
    files: Mapping[str, Path]
    prompt_source: Literal["local", "hub"]
    unpublished: Mapping[str, Path] = field(default_factory=dict)
    """Local folders the recipe points at beside it but that are not uploaded (a tokenizer)."""

    @property
    def path(self) -> str:
        return f"recipes/{self.name}.yaml"

    def to_yaml(self) -> str:
        header = "# Published by eagle3_raw; local paths resolve relative to this file.\n"
        return header + yaml.safe_dump(dict(self.data), sort_keys=False, allow_unicode=True)


def publish_recipe(recipe: Recipe) -> PublishedRecipe:
    """What :func:`~eagle3_raw.hub.push` uploads for ``recipe``; the published recipe keeps its fingerprint.

    A local prompt source (file or folder) goes to ``recipes/<name>/prompts/<its name>``, a chat
    template override to ``recipes/<name>/chat_template/<its name>``; the recipe points at them
    relatively. A local tokenizer folder is not uploaded (a warning says how to reproduce) and its
    path is not published either: the recipe names it ``<name>/tokenizer/<folder name>``.
    """
    check_publishable(recipe)
    data = recipe.to_dict()
    data["server"] = _public_server(data["server"])
    files: dict[str, Path] = {}
    source = recipe.resolve_path(recipe.prompts.source)
    if source.exists():  # exactly the files the build reads: a folder's top-level data files
        data["prompts"]["source"] = _ship(files, source, f"{recipe.name}/prompts", prompt_source_files)
    if recipe.model.chat_template is not None:
        template = recipe.resolve_path(recipe.model.chat_template)
        data["model"]["chat_template"] = _ship(files, template, f"{recipe.name}/chat_template")
    kind: Literal["local", "hub"] = "local" if source.exists() else "hub"
    published = PublishedRecipe(recipe.name, data, files, kind, _unpublished_tokenizer(recipe, data))
    _check_fingerprint(recipe, published)
    return published


def _unpublished_tokenizer(recipe: Recipe, data: dict[str, Any]) -> dict[str, Path]:
    """A local tokenizer folder renamed ``<name>/tokenizer/<folder name>`` in ``data`` (its content,
    not its path, is in the fingerprint), and linked there for the fingerprint check."""
    folder = tokenizer_path(recipe)
    if recipe.model.tokenizer == REFERENCE_TOKENIZER or folder is None:
        return {}
    relative = f"{recipe.name}/tokenizer/{folder.absolute().name}"
    data["model"]["tokenizer"] = relative
    return {f"recipes/{relative}": folder.absolute()}


def check_publishable(recipe: Recipe) -> None:
    """HubError when a local file the recipe would upload (prompt source, template override) is
    outside the recipe's folder."""
    source = recipe.resolve_path(recipe.prompts.source)
    if source.exists():
        _check_inside(recipe, "prompts.source", source)
    if recipe.model.chat_template is not None:
        _check_inside(recipe, "model.chat_template", recipe.resolve_path(recipe.model.chat_template))


def _check_inside(recipe: Recipe, field: str, path: Path) -> None:
    """HubError unless ``path`` is inside the recipe's folder as written (a link placed there is
    the author's choice; ``~/.aws/credentials`` or ``../../etc/passwd`` is not published)."""
    folder = os.path.normpath(recipe.base_dir.absolute())
    where = os.path.normpath(path.absolute())
    if os.path.commonpath([folder, where]) != folder:
        raise HubError(
            f"{field} {where} is outside the recipe's folder {folder}; push uploads only files inside "
            "it: copy the file next to the recipe (or into a folder beside it) and point the recipe there"
        )


STAND_IN_PORT = 30000
"""A published recipe's endpoints are ``http://127.0.0.1:30000``, ``...:30001``, ...: as many as
the build had, none of its hosts (a reproduce sends only where ``--set server.endpoints`` says)."""


def _public_server(server: dict[str, Any]) -> dict[str, Any]:
    """The server section without secrets; ``api_key_env`` stays (a variable's name, not its value).
    Endpoints are replaced by stand-ins on 127.0.0.1 (``STAND_IN_PORT``): a cluster's host names
    and ports are not published."""
    kept = {"api_key_env"}
    public = {
        k: v if k in kept else scrub(v) for k, v in server.items() if k in kept or not is_secret_name(k)
    }
    count = len(server.get("endpoints") or [])
    public["endpoints"] = [f"http://127.0.0.1:{STAND_IN_PORT + i}" for i in range(count)]
    return public


def _ship(
    files: dict[str, Path], local: Path, folder: str, read: Callable[[Path], list[Path]] = digested_files
) -> str:
    """Add ``local`` (a file, or the files ``read`` says a folder's reader reads) under
    ``recipes/<folder>/``; the relative path."""
    # the name as the recipe gives it (a symlink keeps its own name): digest_path hashes file names
    name = local.name if local.name not in ("", ".", "..") else local.resolve().name
    local = local.absolute()
    relative = f"{folder}/{name}"
    if local.is_file():
        files[f"recipes/{relative}"] = local
    for path in read(local) if local.is_dir() else ():
        files[f"recipes/{relative}/{path.relative_to(local).as_posix()}"] = path
    return relative


def _check_fingerprint(recipe: Recipe, published: PublishedRecipe) -> None:
    """Lay the published files out as on the Hub (links) and check the recipe's fingerprint holds."""
    with tempfile.TemporaryDirectory(prefix="eagle3_raw-publish-") as tmp:
        root = Path(tmp)
        path = root / published.path
        path.parent.mkdir(parents=True)
        path.write_text(published.to_yaml(), encoding="utf-8")
        for repo_path, local in {**published.files, **published.unpublished}.items():
            (root / repo_path).parent.mkdir(parents=True, exist_ok=True)
            (root / repo_path).symlink_to(local)
        fingerprint = load_recipe(path).fingerprint
    if fingerprint != recipe.fingerprint:
        raise HubError(
            f"the published recipe {published.path} would have fingerprint {fingerprint}, not "
            f"{recipe.fingerprint}: its prompt files would not reproduce the set (please report this)"
        )


def local_tokenizer_warning(recipe: Recipe) -> list[str]:
    """A warning when the recipe's tokenizer is a local folder (not uploaded), else nothing."""
    if recipe.model.tokenizer == "reference" or tokenizer_path(recipe) is None:
        return []
    return [
        f"model.tokenizer {recipe.model.tokenizer!r} is a local folder and is not uploaded; reproducing "
        "needs --set model.tokenizer=<the same tokenizer> (the fingerprint follows its content)"
    ]


# --- secrets -----------------------------------------------------------------------------------------


def check_no_secrets(payloads: Mapping[str, bytes | Path], secrets: Sequence[str]) -> None:
    """HubError when a payload (repo path -> bytes or local file) contains one of ``secrets``."""
    needles = [s.encode() for s in secrets if s and len(s) >= 4]
    for path, payload in payloads.items():
        data = payload.read_bytes() if isinstance(payload, Path) else payload
        if any(needle in data for needle in needles):
            raise HubError(f"refusing to upload {path}: it contains a credential (the Hub token or API key)")


def upload_secrets(token: str, recipe: Recipe) -> list[str]:
    """What no upload may contain: the Hub token and the value of the recipe's API key variable."""
    name = recipe.server.api_key_env
    return [token, os.environ.get(name, "") if name else ""]
