"""Managing a journal root: what its sets hold, and removing what no set needs any more.

A set needs its outcomes and the generations they name; generations are shared, so removing a set
removes its folder, and then :func:`collect_garbage` drops the generation logs (or rewrites them)
that no remaining set names. A set is *kept* by :func:`prune` when it is in a ``datasets`` cache (the one
given, or any cache its manifest records a build into: its Arrow files could be rebuilt from it),
was pushed to the Hub (recorded in its manifest), is being written, or is *resumable* (a build that
did not finish left outcomes a rerun goes on from), unless asked to remove resumable sets too;
:func:`remove_sets` refuses the same sets unless forced. Everything here holds ``<root>/gc.lock``
exclusively; every writer of the root holds it shared, so nothing is collected under a running build.

A root another user owns or may write is refused before anything is read or removed, and so is a
symbolic link inside it (a journal makes none): removing through a planted link would delete
files elsewhere, the user's own generations among them.
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
from eagle3_raw.identity import Target
from eagle3_raw.journal.files import (
    check_journal_dirs,
    describe,
    guard,
    open_gc_lock,
    read_bytes,
    replace_durably,
    try_lock,
)
from eagle3_raw.journal.log import ENTRY, encode_entry, entry_columns, log_files
from eagle3_raw.journal.manifest import read_manifest, update_manifest
from eagle3_raw.journal.records import ROW
from eagle3_raw.journal.sets import SetJournal
from eagle3_raw.journal.store import Journal
from eagle3_raw.run.shards import whole_count

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt


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
    caches: tuple[str, ...] = ()
    """The ``datasets`` cache folders that hold the set built (complete, not ``.incomplete``)."""
    skipped: int = 0
    """Rows skipped (malformed, too long, refused by the chat path)."""
    ended: int = 0
    """Rollout turns not made because their rollout ended before them."""

    @property
    def cached(self) -> bool:
        return bool(self.caches)

    @property
    def resumable(self) -> bool:
        """Not whole, with outcomes a rerun of its recipe goes on from (an interrupted build's set)."""
        return not self.whole and self.rows + self.failed + self.skipped + self.ended > 0

    @property
    def needed(self) -> bool:
        return self.cached or bool(self.pushed) or self.writing

    def kept_because(self, *, resumable: bool = False) -> str:
        """Why :func:`prune` keeps this set (``resumable``: resumable sets may go), or ``""``."""
        reasons = ["being written"] if self.writing else []
        if self.resumable and not resumable:
            reasons.append(f"a rerun resumes it: {self.rows:,} rows; --resumable removes it")
        reasons += [f"cached in {c}" for c in self.caches] + [f"pushed to {p}" for p in self.pushed]
        return ", ".join(reasons)


@dataclass
class PruneReport:
    """What :func:`prune` removed (or would remove, with ``dry_run``) and kept."""

    removed: list[SetInfo] = field(default_factory=list)
    kept: list[SetInfo] = field(default_factory=list)
    freed_bytes: int = 0


@contextlib.contextmanager
def shared_use(root: Path) -> Iterator[None]:
    """Held by every writer of ``root`` for its life: collection waits for none of them, it refuses."""
    fd = open_gc_lock(root)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def exclusive_use(root: Path) -> Iterator[None]:
    """Held while sets or generations are removed; JournalError when a writer holds the root, or
    for a root another user owns or may write (checked before the lock file is made in it)."""
    check_root(root)
    fd = open_gc_lock(root)
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


def list_sets(root: Path, *, cache_dir: Path | None = None) -> list[SetInfo]:
    """Every set of ``root`` with what it holds, in name order (``caches``: the ``datasets`` cache
    ``cache_dir``, or the default one, and those its manifest records, that hold it built).
    JournalError for a root another user owns or may write, or with a link inside."""
    check_root(root)
    return [info for folder in subfolders(root / "sets") if (info := set_info(folder, cache_dir)) is not None]


def check_root(root: Path) -> None:
    """JournalError unless ``root`` and its ``sets`` and ``generations`` folders (those that exist)
    are this user's and only it may write them (see :func:`~.files.check_journal_dirs`)."""
    for folder in (root / "sets", root / "generations"):
        check_journal_dirs(folder, root)


def subfolders(folder: Path) -> list[Path]:
    """The folders in ``folder`` (checked by the caller), in name order; JournalError for a link
    among them: a journal makes none, so someone else did, and nothing is read or removed through it."""
    if not folder.is_dir():
        return []
    with guard("list", folder):
        children = sorted(folder.iterdir())
    for child in children:
        if child.is_symlink():
            raise JournalError(
                f"{child} is a symbolic link, which a journal never makes nor follows: refusing to go on "
                "(nothing was removed); remove the link, or move what it leads to into the journal"
            )
    return [child for child in children if child.is_dir()]


def record_cache(directory: Path, cache: str) -> None:
    """Note in the set's manifest that the ``datasets`` cache folder ``cache`` holds it built, so
    :func:`prune` keeps it whatever ``--cache-dir`` it is given (nothing when already noted)."""
    manifest = read_manifest(directory)
    if manifest is None or cache in (manifest.get("caches") or []):
        return
    update_manifest(directory, lambda m: m.update(caches=sorted({*(m.get("caches") or []), cache})))


def set_info(folder: Path, cache_dir: Path | None = None) -> SetInfo | None:
    """What the set journal ``folder`` holds, or None when it is not one."""
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
        skipped=sum(stats["failures"]["skipped"].values()),
        ended=sum(stats["failures"].get("ended", {}).values()),
        prompt_tokens=stats["prompt_tokens"],
        generated_tokens=stats["generated_tokens"],
        bytes=own + referenced,
        whole=whole_count(folder) is not None,
        updated=str(manifest.get("updated", "")),
        pushed=tuple(str(p) for p in manifest.get("pushed") or []),
        writing=_being_written(folder),
        caches=_caches(folder.name, manifest, cache_dir),
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


def _caches(config_id: str, manifest: dict[str, Any], cache_dir: Path | None) -> tuple[str, ...]:
    """The cache folders holding the set built: the recorded ones that still do, and ``cache_dir``'s
    (default: ``datasets``' own) when it does. A folder a failed build left (its lock files, an
    ``.incomplete`` folder) holds nothing."""
    if cache_dir is None:
        from datasets import config

        cache_dir = Path(config.HF_DATASETS_CACHE)
    here = [str(p.parent) for p in (cache_dir / "eagle3_raw" / config_id).glob("*/*/dataset_info.json")]
    recorded = [c for c in manifest.get("caches") or [] if isinstance(c, str)]
    return tuple(sorted({c for c in [*here, *recorded] if _holds_set(Path(c))}))


def _holds_set(folder: Path) -> bool:
    return not folder.name.endswith(".incomplete") and (folder / "dataset_info.json").is_file()


def remove_sets(
    root: Path, config_ids: Sequence[str], *, force: bool = False, dry_run: bool = False,
    cache_dir: Path | None = None,
) -> list[SetInfo]:  # fmt: skip
    """Remove these sets' folders, then collect what no set needs; returns what was removed (with
    ``dry_run``: what would be, removing nothing). Refuses (JournalError, nothing removed) a set
    being written, and unless ``force`` one that was pushed, is cached or that a rerun resumes."""
    with exclusive_use(root):
        infos = {info.config_id: info for info in list_sets(root, cache_dir=cache_dir)}
        problems = [_refusal(root, c, infos.get(c), force) for c in dict.fromkeys(config_ids)]
        if any(problems):
            raise JournalError("; ".join(p for p in problems if p) + "; nothing was removed")
        removed = [infos[c] for c in dict.fromkeys(config_ids)]
        if not dry_run:
            for info in removed:
                _remove_folder(root / "sets" / info.config_id)
            collect_garbage(root, _locked=True)
    return removed


def _refusal(root: Path, config_id: str, info: SetInfo | None, force: bool) -> str:
    """Why ``config_id`` may not be removed (``""``: it may)."""
    if info is None:
        return f"the journal {root} has no set {config_id!r} (eagle3-raw journals list)"
    if info.writing:
        return f"set {config_id} is being written now; stop that build first"
    if force:
        return ""
    needs = []
    if info.pushed:
        needs.append(f"was pushed ({', '.join(info.pushed)}): rebuilding or re-pushing it needs its journal")
    if info.cached:
        needs.append(f"is cached in {', '.join(info.caches)}")
    if info.resumable:
        needs.append(f"is resumable ({info.rows:,} rows of a build that did not finish: a rerun goes on)")
    return f"set {config_id} {' and '.join(needs)}: pass --force to remove it anyway" if needs else ""


def prune(root: Path, *, cache_dir: Path | None = None, keep: Callable[[SetInfo], bool] | None = None,
          dry_run: bool = False, resumable: bool = False) -> PruneReport:  # fmt: skip
    """Remove every set no cached or published set needs (and none being written, none a rerun
    would resume unless ``resumable``, nor one ``keep`` keeps), then the generations no remaining
    set names. With ``dry_run``, the report says what would go and nothing is removed."""
    report = PruneReport()
    with exclusive_use(root):
        for info in list_sets(root, cache_dir=cache_dir):
            kept = info.kept_because(resumable=resumable) or (keep is not None and keep(info))
            (report.kept if kept else report.removed).append(info)
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
    check_root(root)
    needed = _needed_digests(root)
    freed = 0
    for folder in subfolders(root / "generations"):
        check_journal_dirs(folder, root)
        for path in log_files(folder, "gen"):
            freed += _collect_log(path, needed)
    return freed


def _needed_digests(root: Path) -> npt.NDArray[Any]:
    import numpy as np

    parts = []
    for folder in subfolders(root / "sets"):
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
    check_root(root)
    found = []
    for folder in sorted((root / "sets").glob(f"{name}-*")):
        if folder.is_symlink():  # a journal makes no links: not followed
            continue
        try:
            manifest = read_manifest(folder)
        except JournalError:
            continue
        if manifest and manifest.get("name") == name and manifest.get("fingerprint") == fingerprint:
            found.append((folder, manifest))
    return found
