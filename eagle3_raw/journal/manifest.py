"""The journal's manifest: fingerprint, recipe, server identity and history, shared by all shards.

``manifest.json`` is replaced atomically (write temp, fsync, rename, fsync the directory) while
holding ``manifest.lock``, so shards in other processes read-modify-write it one at a time. The
server identity recorded in it is compared on every resume (:data:`IDENTITY_KEYS`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import orjson

from eagle3_raw.errors import JournalError, ServerMismatch
from eagle3_raw.journal.files import describe, guard, replace_durably

#: Server identity keys compared on resume (those the journal recorded); other keys are kept as facts.
IDENTITY_KEYS = (
    "model_path",
    "served_model_name",
    "tokenizer_path",
    "tokenizer_hash",
    "weight_version",
    "version",
)
FORMAT_VERSION = 1
MANIFEST = "manifest.json"


def now() -> str:
    """The time in UTC, as the manifest records it (``2025-01-31T12:00:00Z``)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def read_manifest(directory: Path) -> dict[str, Any] | None:
    """The manifest of ``directory``, or None if it has none; JournalError if it cannot be read."""
    path = directory / MANIFEST
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise JournalError(f"cannot read {path}: {describe(exc)}") from exc
    try:
        manifest = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise JournalError(f"cannot read {path}: not valid JSON ({exc})") from exc
    if not isinstance(manifest, dict) or manifest.get("format", 0) > FORMAT_VERSION:
        raise JournalError(f"{path} is not a manifest this version of eagle3_raw can read")
    return manifest


def open_manifest(directory: Path, fingerprint: str, recipe: Mapping[str, Any]) -> dict[str, Any]:
    """The directory's manifest, created if missing, checked against ``fingerprint``, stamped."""
    with _manifest_lock(directory):
        for stale in directory.glob(f".{MANIFEST}.*.tmp"):  # left by a crash mid-write; we hold the lock
            with guard("remove", stale):
                stale.unlink()
        manifest = read_manifest(directory) or _new_manifest(directory, fingerprint, recipe)
        check_fingerprint(directory, manifest, fingerprint)
        manifest["updated"] = now()
        _write_manifest(directory, manifest)
    return manifest


def _new_manifest(directory: Path, fingerprint: str, recipe: Mapping[str, Any]) -> dict[str, Any]:
    if any(directory.glob("rows-*.bin")):
        raise JournalError(f"{directory} holds rows files but no {MANIFEST}; refusing to adopt it")
    return {
        "format": FORMAT_VERSION,
        "fingerprint": fingerprint,
        "recipe": dict(recipe),
        "server": None,
        "created": now(),
        "history": [],
    }


def check_fingerprint(directory: Path, manifest: Mapping[str, Any], fingerprint: str) -> None:
    """JournalError, saying where such rows belong, unless ``manifest`` is of ``fingerprint``."""
    if manifest.get("fingerprint") == fingerprint:
        return
    name = (manifest.get("recipe") or {}).get("name", "?")
    raise JournalError(
        f"the journal {directory} holds rows of recipe {name!r} with fingerprint "
        f"{manifest.get('fingerprint')}, not {fingerprint}; a changed recipe gets its own journal "
        "(<name>-<fingerprint>), so use that directory or move this one aside"
    )


def update_identity(
    directory: Path, fallback: dict[str, Any], identity: Mapping[str, Any], *, allow_change: bool
) -> dict[str, Any]:
    """Record or check the server identity in the manifest of ``directory`` (``fallback`` if it has
    none), stamp and write it; the manifest written. See :meth:`Journal.set_server_identity`."""
    with _manifest_lock(directory):
        manifest = read_manifest(directory) or fallback
        _apply_identity(manifest, dict(identity), allow_change, directory / MANIFEST)
        manifest["updated"] = now()
        _write_manifest(directory, manifest)
    return manifest


@contextlib.contextmanager
def _manifest_lock(directory: Path) -> Iterator[None]:
    path = directory / "manifest.lock"
    with guard("open the lock file", path):
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        with guard("lock", path):
            fcntl.flock(fd, fcntl.LOCK_EX)  # held for one read-modify-write: shards share the manifest
        yield
    finally:
        os.close(fd)


def _write_manifest(directory: Path, manifest: Mapping[str, Any]) -> None:
    data = orjson.dumps(manifest, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS, default=str)
    replace_durably(directory / MANIFEST, data)


# --- server identity ---------------------------------------------------------------------------------


def _apply_identity(
    manifest: dict[str, Any], identity: dict[str, Any], allow_change: bool, path: Path
) -> None:
    recorded = manifest.get("server")
    differences = identity_differences(recorded, identity) if recorded else {}
    if differences and not allow_change:
        raise ServerMismatch(_mismatch_message(path, differences))
    if differences:
        changes = {key: {"recorded": old, "now": new} for key, (old, new) in differences.items()}
        manifest.setdefault("history", []).append(
            {"event": "allow-server-change", "time": now(), "changes": changes, "previous": recorded}
        )
    if differences or not recorded:
        manifest["server"] = identity


def identity_differences(
    recorded: Mapping[str, Any], identity: Mapping[str, Any]
) -> dict[str, tuple[Any, Any]]:
    """{key: (recorded, now)} for each :data:`IDENTITY_KEYS` key ``recorded`` has and ``identity``
    does not match (a key missing now counts as a difference)."""
    keys = [key for key in IDENTITY_KEYS if key in recorded]
    return {key: (recorded[key], identity.get(key)) for key in keys if recorded[key] != identity.get(key)}


def _mismatch_message(path: Path, differences: Mapping[str, tuple[Any, Any]]) -> str:
    lines = [
        f"  {key}: journal has {old!r}, server now reports {new!r}" for key, (old, new) in differences.items()
    ]
    return "\n".join(
        [
            f"the server differs from the one that generated the rows journaled in {path.parent}:",
            *lines,
            "Rows from two models or tokenizers would make an inconsistent set. Point the build at the "
            "original server, or rerun with --allow-server-change to go on anyway (the change is recorded "
            f"in the history of {path}).",
        ]
    )
