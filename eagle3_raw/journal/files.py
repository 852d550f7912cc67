"""File primitives of the journal: OSError to JournalError, private folders, appending without
following links, fsync points, cuts, locks, and names unique per host and process.

Every OSError that reaches a caller is a JournalError naming the path and the error (:func:`guard`).
Folders are created 0700 and refused when another user owns them or others may write them; files
are created 0600 and opened with ``O_NOFOLLOW``, so another local user cannot plant a link that
makes a build write through it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import re
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

from eagle3_raw.errors import JournalError

_log = logging.getLogger("eagle3_raw.journal")

FILE_MODE = 0o600
DIR_MODE = 0o700
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


@contextlib.contextmanager
def guard(action: str, path: Path) -> Iterator[None]:
    """Turn an OSError into a JournalError naming the path and the error."""
    try:
        yield
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise JournalError(
                f"cannot {action} {path}: it is a symbolic link, which a journal never follows"
            ) from exc
        raise JournalError(f"cannot {action} {path}: {describe(exc)}") from exc


def describe(exc: OSError) -> str:
    """``exc``'s message with its errno name, e.g. ``No space left on device (ENOSPC)``."""
    name = errno.errorcode.get(exc.errno or 0)
    return f"{exc.strerror} ({name})" if name and exc.strerror else str(exc)


def host_name() -> str:
    """This machine's name as it goes into file names (letters, digits, ``.``, ``_``, ``-``)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname())[:64] or "host"


def make_private_dir(directory: Path, root: Path) -> None:
    """Create ``directory`` (0700, with its missing parents) durably, and check it and every folder
    between it and the journal ``root`` (inclusive).

    JournalError when one of them is not a real folder, belongs to another user, or others may
    write it: another user could then plant files (or links) a build would take as its own.
    """
    with guard("create the journal directory", directory):
        missing = [d for d in (directory, *directory.parents) if not os.path.lexists(d)]
        for created in reversed(missing):  # outermost first, each 0700 (umask cannot widen it)
            with contextlib.suppress(FileExistsError):  # another process made it meanwhile
                created.mkdir(mode=DIR_MODE)
        for created in missing:  # deepest first: each new directory's entry in its parent
            fsync_dir(created.parent)  # fsync point
    for level in (directory, *directory.parents):
        check_private_dir(level, follow=level == root)  # the root may be a link (to a shared disk)
        if level == root:
            break


def check_journal_dirs(directory: Path, root: Path) -> None:
    """For a reader (or a command that removes): what :func:`make_private_dir` checks, creating
    nothing. Every folder from ``directory`` up to the journal ``root`` (inclusive) that exists must
    be a real folder (the root may be a link) of this user that only it may write; JournalError
    otherwise. A journal root that another user owns or may write is not read: its files, its links
    and its rows would be someone else's."""
    if directory != root and root not in directory.parents:
        raise ValueError(f"{directory} is not inside the journal root {root}")
    levels = [directory, *directory.parents]
    for level in reversed(levels[: levels.index(root) + 1]):  # the root first: the message names it
        if os.path.lexists(level):
            check_private_dir(level, follow=level == root)


def check_private_dir(directory: Path, *, follow: bool = False) -> None:
    """JournalError unless ``directory`` is a folder (not a link, unless ``follow``: then the folder
    it leads to) of this user that only it may write."""
    with guard("inspect", directory):
        info = os.stat(directory) if follow else os.lstat(directory)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise JournalError(f"{directory} is not a folder (a link or a file): refusing to use it as a journal")
    if info.st_uid != os.geteuid():
        raise JournalError(
            f"{directory} belongs to another user (uid {info.st_uid}): refusing to use it as a journal; "
            "choose a journal folder of your own (--journal-dir or $EAGLE3_RAW_JOURNAL_DIR)"
        )
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise JournalError(
            f"{directory} may be written by other users (mode {stat.S_IMODE(info.st_mode):o}): refusing "
            f"to use it as a journal; run chmod go-w {directory} if you trust them"
        )


def fsync_dir(directory: Path) -> None:
    """fsync ``directory`` itself: makes entries created or renamed in it durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def open_read(path: Path) -> int:
    """A read-only descriptor of ``path``, never through a symbolic link. Raises OSError."""
    return os.open(path, os.O_RDONLY | _NOFOLLOW | _CLOEXEC)


def read_bytes(path: Path, start: int = 0, size: int = -1) -> bytes:
    """The bytes of ``path`` from ``start`` (all, or ``size``), without following a link. Raises OSError."""
    fd = open_read(path)
    try:
        length = os.fstat(fd).st_size - start if size < 0 else size
        return os.pread(fd, max(0, length), start) if length > 0 else b""
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd`` (os.write may write less than asked)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def open_append(path: Path) -> int:
    """A descriptor appending to ``path``, created 0600 (durably) if missing, never through a
    symbolic link. Raises OSError."""
    created = not os.path.lexists(path)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | _NOFOLLOW | _CLOEXEC, FILE_MODE)
    if created:
        try:
            fsync_dir(path.parent)  # fsync point: the new file's directory entry
        except BaseException:
            os.close(fd)
            raise
    return fd


def cut(fd: int, path: Path, end: int, reason: str) -> None:
    """Truncate the file open as ``fd`` to its first ``end`` valid bytes, logging what is cut."""
    with guard("repair", path):
        size = os.fstat(fd).st_size
        if size <= end:
            return
        _log.warning(
            "journal file %s: cutting a torn tail (%s) of %d bytes at offset %d",
            path,
            reason,
            size - end,
            end,
        )
        os.ftruncate(fd, end)
        os.fsync(fd)  # fsync point: the cut is durable before new records follow it


def try_lock(path: Path) -> int | None:
    """An exclusive lock on ``path`` (created 0600) for this process: its descriptor (closing it
    releases the lock), or None when another process (or handle) holds it."""
    with guard("open the lock file", path):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | _NOFOLLOW | _CLOEXEC, FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except OSError as exc:
        os.close(fd)
        raise JournalError(f"cannot lock {path}: {describe(exc)}") from exc
    with guard("write the lock file", path):
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
    return fd


def lock_holder(path: Path) -> str:
    """Who holds the lock ``path`` (what :func:`try_lock` wrote in it), for messages."""
    try:
        return read_bytes(path, 0, 200).decode(errors="replace").strip() or "another process"
    except OSError:
        return "another process"


@contextlib.contextmanager
def locked(path: Path, *, shared: bool = False) -> Iterator[None]:
    """Hold a blocking flock on ``path`` (created 0600) for the block."""
    with guard("open the lock file", path):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | _NOFOLLOW | _CLOEXEC, FILE_MODE)
    try:
        with guard("lock", path):
            fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def temporary_name(path: Path) -> Path:
    """A temporary sibling of ``path`` unique to this host and process, ``.<name>~<host>~<pid>.tmp``
    (shared folders: another host's temporary files are never touched). ``~`` is in no host name
    (:func:`host_name`), so the owner reads back exactly: ``a.b`` is not host ``b``."""
    return path.with_name(f".{path.name}~{host_name()}~{os.getpid()}.tmp")


def remove_own_temporaries(directory: Path) -> None:
    """Remove temporary files this host left in ``directory`` from processes that are gone."""
    host = host_name()
    for stale in directory.glob(".*~*~*.tmp"):
        _, owner, pid = stale.name[: -len(".tmp")].rsplit("~", 2)
        if owner != host or not pid.isdigit() or _alive(int(pid)):
            continue
        with contextlib.suppress(OSError):
            stale.unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def replace_durably(path: Path, data: bytes, action: str = "write") -> None:
    """Publish ``data`` at ``path`` atomically and durably: a temporary file written and fsynced,
    renamed over ``path``, then the directory fsynced; the temporary file is removed on failure."""
    temporary = temporary_name(path)
    with guard(action, path):
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _NOFOLLOW | _CLOEXEC
            fd = os.open(temporary, flags, FILE_MODE)
            try:
                write_all(fd, data)
                os.fsync(fd)  # fsync point: the content is durable before a rename publishes it
            finally:
                os.close(fd)
            os.replace(temporary, path)
        except BaseException:
            with contextlib.suppress(OSError):
                temporary.unlink()
            raise
        fsync_dir(path.parent)  # fsync point: the rename itself


GC_LOCK = "gc.lock"


def open_gc_lock(root: Path) -> int:
    """The root's collection lock file, opened (made if missing); the caller locks and closes it."""
    with guard("open the lock file", root / GC_LOCK):
        return os.open(root / GC_LOCK, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), FILE_MODE)


def open_shared_use(root: Path) -> int:
    """A shared hold on the root's collection lock (as :func:`~eagle3_raw.journal.roots.shared_use`)
    for a writer that closes the descriptor itself (closing releases it)."""
    fd = open_gc_lock(root)
    fcntl.flock(fd, fcntl.LOCK_SH)
    return fd
