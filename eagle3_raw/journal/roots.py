"""Managing a journal root: what its sets hold, and removing what no set needs any more.

A set needs its outcomes and the generations they name; generations are shared, so removing a set
removes its folder, and then :func:`collect_garbage` drops the generation logs (or rewrites them)
that no remaining set names. A set is *kept* by :func:`prune` when it is in the ``datasets`` cache
(its Arrow files could be rebuilt from it), was pushed to the Hub (recorded in its manifest), or
is being written. Everything here holds ``<root>/gc.lock`` exclusively; every writer of the root
holds it shared, so nothing is collected under a running build.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3_raw.errors import JournalError
from eagle3_raw.journal.files import FILE_MODE, describe, guard, replace_durably, try_lock
from eagle3_raw.journal.log import ENTRY, entry_columns, log_files
from eagle3_raw.journal.manifest import read_manifest
from eagle3_raw.journal.records import ROW

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

GC_LOCK = "gc.lock"


@dataclass(frozen=True)
class SetInfo:
    """One set of a journal root, as :func:`list_sets` describes it."""

    config_id: str
    name: str
    target: str
    rows: int
    failed: int
    prompt_tokens: int
    generated_tokens: int
    bytes: int
    """The set's own files plus the generation records it names (shared ones counted in full)."""
    whole: bool
    updated: str
    pushed: tuple[str, ...]
    writing: bool
    """A process holds one of its shard locks now."""
    cached: bool = False

    @property
    def needed(self) -> bool:
        return self.cached or bool(self.pushed) or self.writing


@dataclass
class PruneReport:
    """What :func:`prune` removed (or would remove, with ``dry_run``) and kept."""

    removed: list[SetInfo] = field(default_factory=list)
    kept: list[SetInfo] = field(default_factory=list)
    freed_bytes: int = 0


@contextlib.contextmanager
def shared_use(root: Path) -> Iterator[None]:
    """Held by every writer of ``root`` for its life: collection waits for none of them, it refuses."""
    fd = _open_gc_lock(root)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)


def open_shared_use(root: Path) -> int:
    """:func:`shared_use` for a writer that closes the descriptor itself (closing releases it)."""
    fd = _open_gc_lock(root)
    fcntl.flock(fd, fcntl.LOCK_SH)
    return fd


@contextlib.contextmanager
def exclusive_use(root: Path) -> Iterator[None]:
    fd = _open_gc_lock(root)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise JournalError(
                f"a build is writing to the journal {root} now: remove or prune journals when it has finished"
            ) from None
        yield
    finally:
        os.close(fd)


def _open_gc_lock(root: Path) -> int:
    with guard("open the lock file", root / GC_LOCK):
        return os.open(root / GC_LOCK, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), FILE_MODE)


def list_sets(root: Path, *, cache_dir: Path | None = None) -> list[SetInfo]:
    """Every set of ``root`` with what it holds, in name order (``cached``: its Arrow files are in
    the ``datasets`` cache ``cache_dir``)."""
    sets = root / "sets"
    folders = sorted(p for p in sets.iterdir() if p.is_dir() and not p.is_symlink()) if sets.is_dir() else []
    return [info for folder in folders if (info := set_info(folder, cache_dir)) is not None]


def set_info(folder: Path, cache_dir: Path | None = None) -> SetInfo | None:
    """What the set journal ``folder`` holds, or None when it is not one."""
    from eagle3_raw.identity import Target
    from eagle3_raw.journal.store import Journal
    from eagle3_raw.shards import whole_count

    try:
        manifest = read_manifest(folder)
    except JournalError:
        return None
    if manifest is None:
        return None
    with Journal.read_dir(folder) as journal:
        stats = journal.stats()
        referenced = _referenced_bytes(journal)
    own = sum(p.stat().st_size for p in folder.iterdir() if p.is_file() and not p.is_symlink())
    return SetInfo(
        config_id=folder.name,
        name=str(manifest.get("name", "?")),
        target=Target.from_dict(manifest["target"]).describe(),
        rows=stats["rows"],
        failed=sum(stats["failures"]["failed"].values()),
        prompt_tokens=stats["prompt_tokens"],
        generated_tokens=stats["generated_tokens"],
        bytes=own + referenced,
        whole=whole_count(folder) is not None,
        updated=str(manifest.get("updated", "")),
        pushed=tuple(str(p) for p in manifest.get("pushed") or []),
        writing=_being_written(folder),
        cached=_cached(folder.name, cache_dir),
    )  # fmt: skip


def _referenced_bytes(journal: Any) -> int:
    import numpy as np

    entries = journal.sets.entries()
    digests = np.unique(entries.digest[entries.kind == ROW])
    index = journal.generation_index()
    total = 0
    for digest in digests.tolist():
        location = index.locate(bytes(digest).ljust(16, b"\0"))
        total += location.length if location is not None else 0
    return int(total)


def _being_written(folder: Path) -> bool:
    for lock in folder.glob("shard-*.lock"):
        fd = try_lock(lock)
        if fd is None:
            return True
        os.close(fd)
    return False


def _cached(config_id: str, cache_dir: Path | None) -> bool:
    if cache_dir is None:
        from datasets import config

        cache_dir = Path(config.HF_DATASETS_CACHE)
    return (cache_dir / "eagle3_raw" / config_id).is_dir()


def remove_sets(root: Path, config_ids: Sequence[str], *, force: bool = False) -> list[SetInfo]:
    """Remove these sets' folders (refusing one being written, or one that was pushed unless
    ``force``), then collect what no set needs. Returns what was removed."""
    with exclusive_use(root):
        infos = {info.config_id: info for info in list_sets(root)}
        for config_id in config_ids:
            info = infos.get(config_id)
            if info is None:
                raise JournalError(f"the journal {root} has no set {config_id!r} (eagle3-raw journals list)")
            if info.writing:
                raise JournalError(f"set {config_id} is being written now; stop that build first")
            if info.pushed and not force:
                raise JournalError(
                    f"set {config_id} was pushed ({', '.join(info.pushed)}); rebuilding or re-pushing it "
                    "needs its journal: pass --force to remove it anyway"
                )
        for config_id in config_ids:
            _remove_folder(root / "sets" / config_id)
        collect_garbage(root, _locked=True)
    return [infos[c] for c in config_ids]


def prune(root: Path, *, cache_dir: Path | None = None, keep: Callable[[SetInfo], bool] | None = None,
          dry_run: bool = False) -> PruneReport:  # fmt: skip
    """Remove every set no cached or published set needs (and none being written, nor one
    ``keep`` keeps), then the generations no remaining set names."""
    report = PruneReport()
    with exclusive_use(root):
        for info in list_sets(root, cache_dir=cache_dir):
            (report.kept if info.needed or (keep is not None and keep(info)) else report.removed).append(info)
        if dry_run:
            return report
        for info in report.removed:
            _remove_folder(root / "sets" / info.config_id)
        report.freed_bytes = collect_garbage(root, _locked=True)
    return report


def _remove_folder(folder: Path) -> None:
    try:
        shutil.rmtree(folder)
    except OSError as exc:
        raise JournalError(f"cannot remove {folder}: {describe(exc)}") from exc


def collect_garbage(root: Path, *, _locked: bool = False) -> int:
    """Drop the generation records no set of ``root`` names: logs with none left are deleted, logs
    with fewer than half left are rewritten. Returns the bytes freed."""
    if not _locked:
        with exclusive_use(root):
            return collect_garbage(root, _locked=True)
    needed = _needed_digests(root)
    freed = 0
    for folder in sorted((root / "generations").glob("*")) if (root / "generations").is_dir() else []:
        for path in log_files(folder, "gen"):
            freed += _collect_log(path, needed)
    return freed


def _needed_digests(root: Path) -> npt.NDArray[Any]:
    import numpy as np

    from eagle3_raw.journal.sets import SetJournal

    parts = []
    for folder in sorted((root / "sets").glob("*")) if (root / "sets").is_dir() else []:
        if (folder / "manifest.json").exists():
            entries = SetJournal.read(folder).entries()
            parts.append(entries.digest[entries.kind == ROW])
    return np.unique(np.concatenate(parts)) if parts else np.zeros(0, "S16")


def _collect_log(path: Path, needed: npt.NDArray[Any]) -> int:
    """Delete or compact one generation log (only a log no process writes: its lock is taken)."""
    import numpy as np

    lock = try_lock(path.with_suffix(".lock"))
    if lock is None:
        return 0
    try:
        columns = entry_columns([path])
        keep = np.isin(columns["key1"], needed)
        size = path.stat().st_size
        if keep.all():
            return 0
        if not keep.any():
            for suffix in (".bin", ".idx"):
                path.with_suffix(suffix).unlink(missing_ok=True)
            return size
        if keep.mean() >= 0.5:
            return 0
        return size - _compact(path, columns, keep)
    finally:
        os.close(lock)
        if not path.exists():
            path.with_suffix(".lock").unlink(missing_ok=True)


def _compact(path: Path, columns: dict[str, Any], keep: npt.NDArray[np.bool_]) -> int:
    """Rewrite ``path`` with only the kept records (new data file and index, each published by an
    atomic replace: the index last, so a reader never sees an entry past the data)."""
    from eagle3_raw.journal.files import read_bytes
    from eagle3_raw.journal.log import encode_entry

    data, entries, offset = [], [], 0
    for position in keep.nonzero()[0].tolist():
        start, length = int(columns["offset"][position]), int(columns["length"][position])
        data.append(read_bytes(path, start, length))
        key1 = bytes(columns["key1"][position]).ljust(16, b"\0")
        key2 = bytes(columns["key2"][position]).ljust(16, b"\0")
        entries.append(encode_entry(key1, key2, offset, int(columns["kind"][position]), length))
        offset += length
    assert len(b"".join(entries)) == len(entries) * ENTRY.size
    replace_durably(path.with_suffix(".idx"), b"")  # readers see nothing while the data changes
    replace_durably(path, b"".join(data))
    replace_durably(path.with_suffix(".idx"), b"".join(entries))
    return offset


def sets_of(root: Path, name: str, fingerprint: str) -> list[tuple[Path, dict[str, Any]]]:
    """The set folders of ``root`` of the recipe ``name`` with ``fingerprint`` (one per target it
    was built for), with their manifests, in folder order; unreadable ones are left out."""
    found = []
    for folder in sorted((root / "sets").glob(f"{name}-*")):
        try:
            manifest = read_manifest(folder)
        except JournalError:
            continue
        if manifest and manifest.get("name") == name and manifest.get("fingerprint") == fingerprint:
            found.append((folder, manifest))
    return found
