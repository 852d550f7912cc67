"""File primitives of the journal: OSError to JournalError, appending, fsync points, cuts, shard locks.

Every OSError that reaches a caller is a JournalError naming the path and the error (:func:`guard`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import socket
from collections.abc import Iterator
from pathlib import Path

from eagle3_raw.errors import JournalError

_log = logging.getLogger("eagle3_raw.journal")


@contextlib.contextmanager
def guard(action: str, path: Path) -> Iterator[None]:
    """Turn an OSError into a JournalError naming the path and the error."""
    try:
        yield
    except OSError as exc:
        raise JournalError(f"cannot {action} {path}: {describe(exc)}") from exc


def describe(exc: OSError) -> str:
    """``exc``'s message with its errno name, e.g. ``No space left on device (ENOSPC)``."""
    name = errno.errorcode.get(exc.errno or 0)
    return f"{exc.strerror} ({name})" if name and exc.strerror else str(exc)


def make_dir(directory: Path) -> None:
    """Create the journal directory (and its parents) if missing, durably."""
    with guard("create the journal directory", directory):
        if directory.is_dir():
            return
        missing = [d for d in (directory, *directory.parents) if not d.exists()]
        directory.mkdir(parents=True, exist_ok=True)
        for created in missing:  # deepest first: each new directory's entry in its parent
            fsync_dir(created.parent)  # fsync point


def fsync_dir(directory: Path) -> None:
    """fsync ``directory`` itself: makes entries created or renamed in it durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd`` (os.write may write less than asked)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def open_append(path: Path) -> int:
    """A descriptor appending to ``path``, created (durably) if missing. Raises OSError."""
    created = not path.exists()
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
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
        _log.warning(
            "journal file %s: cutting a torn tail (%s) of %d bytes at offset %d",
            path,
            reason,
            size - end,
            end,
        )
        os.ftruncate(fd, end)
        os.fsync(fd)  # fsync point: the cut is durable before new records follow it


def take_lock(path: Path, directory: Path, shard: str) -> int:
    """Lock ``path`` (the shard's lock file) for this process and write who holds it in it.

    Returns the descriptor, whose closing releases the lock. JournalError, naming the holder, if
    another process (or another handle in this one) holds it.
    """
    with guard("open the lock file", path):
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        _lock_or_refuse(fd, path, directory, shard)
        with guard("write the lock file", path):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _lock_or_refuse(fd: int, path: Path, directory: Path, shard: str) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
        raise JournalError(
            f"another build is writing shard {shard} of the journal {directory} ({path} is locked by "
            f"{holder}); wait for it to finish or stop it, or run this one with another --shard"
        ) from None
    except OSError as exc:
        raise JournalError(f"cannot lock {path}: {describe(exc)}") from exc


def replace_durably(path: Path, data: bytes, action: str = "write") -> None:
    """Publish ``data`` at ``path`` atomically and durably: a temporary file written and fsynced,
    renamed over ``path``, then the directory fsynced; the temporary file is removed on failure."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with guard(action, path):
        try:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
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
