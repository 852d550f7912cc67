"""A set's manifest: what the set is, where its rows come from, and how it was run.

``sets/<config id>/manifest.json`` is replaced atomically (write temp, fsync, rename, fsync the
directory) while holding ``manifest.lock``, so shards in other processes (or on other hosts of a
shared folder) read-modify-write it one at a time. It holds::

    format, config_id, name, fingerprint, code     what the set is (fixed at creation)
    recipe                                         the recipe, secrets scrubbed
    target                                         the model and limits the rows come from
    server                                         facts about the server(s) (versions, flags, tokenizer)
    source                                         a Hub prompt source's resolved commit, if any
    retry_epoch                                    bumped by --retry-failed; older failures do not count
    created, updated, history, pushed              when, and what happened to it

Nothing in it orders events across hosts by their clocks: times are for people; ``retry_epoch``
is a counter.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import orjson

from eagle3_raw.errors import JournalError
from eagle3_raw.journal.files import describe, locked, read_bytes, remove_own_temporaries, replace_durably

FORMAT_VERSION = 2
MANIFEST = "manifest.json"
_LOCK = "manifest.lock"


def now() -> str:
    """The time in UTC, as the manifest records it (``2025-01-31T12:00:00Z``)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def read_manifest(directory: Path) -> dict[str, Any] | None:
    """The manifest of ``directory``, or None if it has none; JournalError if it cannot be read."""
    path = directory / MANIFEST
    try:
        data = read_bytes(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise JournalError(f"cannot read {path}: {describe(exc)}") from exc
    try:
        manifest = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise JournalError(f"cannot read {path}: not valid JSON ({exc})") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_VERSION:
        raise JournalError(
            f"{path} is not a set manifest this version of eagle3_raw can read (format "
            f"{manifest.get('format') if isinstance(manifest, dict) else '?'}, expected {FORMAT_VERSION}); "
            "move the folder aside to build the set again"
        )
    return manifest


def new_manifest(
    *,
    config_id: str,
    name: str,
    fingerprint: str,
    code: str,
    recipe: Mapping[str, Any],
    target: Mapping[str, Any],
) -> dict[str, Any]:
    """The manifest of a set that has no rows yet."""
    return {
        "format": FORMAT_VERSION,
        "config_id": config_id,
        "name": name,
        "fingerprint": fingerprint,
        "code": code,
        "recipe": dict(recipe),
        "target": dict(target),
        "server": None,
        "source": None,
        "retry_epoch": 0,
        "created": now(),
        "updated": now(),
        "history": [],
        "pushed": [],
    }


def open_manifest(directory: Path, fresh: Mapping[str, Any]) -> dict[str, Any]:
    """The directory's manifest, created from ``fresh`` if missing, checked against it, stamped."""

    def check(manifest: dict[str, Any]) -> None:
        for key in ("config_id", "fingerprint", "target"):
            if manifest.get(key) != fresh[key]:
                raise JournalError(
                    f"the set journal {directory} records {key} {manifest.get(key)!r}, not {fresh[key]!r}: "
                    "it belongs to another set; move it aside"
                )

    with locked(directory / _LOCK):
        remove_own_temporaries(directory)  # left by a crash of this host mid-write; we hold the lock
        manifest = read_manifest(directory)
        if manifest is None:
            if any(directory.glob("out-*.bin")):
                raise JournalError(f"{directory} holds outcome files but no {MANIFEST}; refusing to adopt it")
            manifest = dict(fresh)
        check(manifest)
        manifest["updated"] = now()
        _write(directory, manifest)
    return manifest


def update_manifest(directory: Path, change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Apply ``change`` to the manifest under its lock and write it back; returns the new manifest."""
    with locked(directory / _LOCK):
        manifest = read_manifest(directory)
        if manifest is None:
            raise JournalError(f"no set journal at {directory}: {MANIFEST} is missing")
        change(manifest)
        manifest["updated"] = now()
        _write(directory, manifest)
    return manifest


def _write(directory: Path, manifest: Mapping[str, Any]) -> None:
    data = orjson.dumps(manifest, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS, default=str)
    replace_durably(directory / MANIFEST, data)
