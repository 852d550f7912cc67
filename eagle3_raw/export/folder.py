"""The output folder of an export: eagle3_raw writes only its own files there, and deletes only them.

An export writes into a folder that is new, empty, or one an earlier export made: that export left
:data:`MARK` listing the files it wrote, and the folder holds nothing else. Anything else (a
folder of the user's, a file added to an export's folder) is refused before anything is written,
naming what is there: speculators reads every JSON file below ``data/``, so a file that is not the
export's would join the training rows, and a folder that is not the export's is not its to clear.
The earlier export's files are removed first (only them, by name), so a renamed config leaves no
stale rows behind.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import orjson

from eagle3_raw.errors import ExportError
from eagle3_raw.printable import printable

MARK = ".eagle3_raw-export.json"
"""The list of files the last export into a folder wrote (relative paths), in that folder."""

_MARK_BYTES = 1 << 20
_ENTRIES = 10_000


def claim(folder: Path, files: Iterable[str]) -> None:
    """Make ``folder`` ready for an export that writes ``files`` (paths relative to it): the
    earlier export's files removed, the new list written; ExportError as :func:`check`."""
    owned = check(folder)
    for name in sorted(owned - {MARK}):
        _remove(folder, name)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)  # a folder it makes: the user's only
    listed = sorted({*files, *(_partial(name) for name in files)})
    (folder / MARK).write_bytes(orjson.dumps({"files": listed}, option=orjson.OPT_INDENT_2) + b"\n")
    (folder / MARK).chmod(0o600)


def check(folder: Path) -> set[str]:
    """ExportError naming ``folder`` and one entry in it that no earlier export wrote (see the
    module docstring); else the files the earlier export wrote (with :data:`MARK`). Changes nothing."""
    if folder.exists() and not folder.is_dir():
        raise ExportError(f"--output {printable(folder)} is not a folder")
    entries = set(_entries(folder)) if folder.is_dir() else set()
    earlier = _earlier(folder)
    if entries and earlier is None:
        shown = printable(sorted(entries)[0])
        raise ExportError(
            f"--output {printable(folder)} is not empty and was not made by eagle3-raw export (it holds "
            f"{shown}); an export writes only into a new or empty folder, or one an earlier export made: "
            "give another folder"
        )
    owned = set(earlier or ()) | {MARK}
    foreign = sorted(e for e in entries if e not in owned and not _holds(folder, e, owned))
    if foreign:
        raise ExportError(
            f"--output {printable(folder)} holds {printable(foreign[0])}, which the earlier export there did "
            "not write (a trainer reading the folder would take it too); move it away or give another folder"
        )
    return owned


def _remove(folder: Path, name: str) -> None:
    """Remove an earlier export's file (a link itself, never what it points to), then the folders
    it leaves empty below ``folder``."""
    path = folder / name
    if path.is_symlink() or path.is_file():
        path.unlink()
    for parent in path.parents:
        if parent == folder or not parent.is_relative_to(folder):
            break
        try:
            parent.rmdir()
        except OSError:
            break  # not empty (or gone): keep it


def _partial(name: str) -> str:
    """The temporary name the rows writer uses for ``name`` (left behind by an export that died)."""
    path = Path(name)
    return (path.parent / f".{path.name}.partial").as_posix()


def _entries(folder: Path) -> Iterable[str]:
    """Every file and folder below ``folder`` (relative), without following links; bounded."""
    for count, (root, dirs, names) in enumerate(os.walk(folder), start=1):
        if count > _ENTRIES:
            raise ExportError(f"--output {printable(folder)} has more than {_ENTRIES:,} folders below it")
        for name in (*dirs, *names):
            relative = Path(root, name).relative_to(folder).as_posix()
            if relative != MARK:
                yield relative


def _holds(folder: Path, entry: str, owned: set[str]) -> bool:
    """Whether ``entry`` is a folder (not a link) some owned file is in (``data`` for ``data/x.jsonl``)."""
    path = folder / entry
    return path.is_dir() and not path.is_symlink() and any(name.startswith(f"{entry}/") for name in owned)


def _earlier(folder: Path) -> list[str] | None:
    """The files an earlier export's :data:`MARK` lists, or None when there is no mark."""
    mark = folder / MARK
    if mark.is_symlink() or not mark.is_file() or mark.stat().st_size > _MARK_BYTES:
        return None
    try:
        files = orjson.loads(mark.read_bytes()).get("files")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        return None
    return [f for f in files if ".." not in Path(f).parts and not Path(f).is_absolute()]
