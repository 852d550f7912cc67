"""Where a built set is written: the ``datasets`` cache and ``--output-dir``.

Both are checked before the build starts (a folder that cannot be created or written is an
:class:`OutputError` naming it, before any request is sent), and a write that fails later (a disk
that fills up meanwhile) is an :class:`OutputError` too, never a traceback. The journal is another
folder: whatever fails here, every generated row stays in it, and rerunning the same command
rebuilds the set from it without sending a request.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from eagle3_raw.errors import FatalError

if TYPE_CHECKING:
    import datasets

_AFTER = (
    "the journal keeps every generated row: fix that and run the same command again (nothing is regenerated)"
)


class OutputError(FatalError):
    """The set cannot be written where it should go (the cache or the output folder)."""


def describe(exc: OSError) -> str:
    """``exc``'s message with its errno name, e.g. ``No space left on device (ENOSPC)``."""
    name = errno.errorcode.get(exc.errno or 0)
    text = exc.strerror or str(exc)
    return f"{text} ({name})" if name else text


def check_writable(folder: Path, what: str) -> None:
    """OutputError unless ``folder`` exists or can be created, and a file in it can be written."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)  # one it makes: the user's only
        with tempfile.TemporaryFile(dir=folder, prefix=".eagle3_raw-check-") as probe:
            probe.write(b"\0" * 4096)
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as exc:
        raise OutputError(f"cannot write the {what} {folder}: {describe(exc)}") from exc


def default_cache_dir() -> Path:
    """The ``datasets`` cache used when no cache folder is given (``HF_DATASETS_CACHE``)."""
    import datasets

    return Path(datasets.config.HF_DATASETS_CACHE)


@contextlib.contextmanager
def cache_errors(cache_dir: Path) -> Iterator[None]:
    """An OSError while ``datasets`` writes its cache as an OutputError naming the cache: one that
    ``datasets`` wrapped while writing the split, or one on a path inside ``cache_dir``."""
    import datasets

    try:
        yield
    except datasets.exceptions.DatasetGenerationError as exc:
        cause = exc.__cause__ or exc.__context__
        if not isinstance(cause, OSError):
            raise
        raise OutputError(_cache_message(cache_dir, cause)) from exc
    except OSError as exc:
        if not _inside(exc.filename, cache_dir):
            raise
        raise OutputError(_cache_message(cache_dir, exc)) from exc


def _cache_message(cache_dir: Path, exc: OSError) -> str:
    return f"cannot write the datasets cache {cache_dir}: {describe(exc)}; {_AFTER}"


def _inside(filename: object, folder: Path) -> bool:
    if not isinstance(filename, str | os.PathLike):
        return False
    path, root = Path(filename).absolute(), folder.absolute()
    return path == root or root in path.parents


def write_parquet(dataset: datasets.Dataset, output_dir: Path, name: str) -> Path:
    """Write the set as ``<output_dir>/<name>.parquet``, whole or not at all: into a temporary file
    in the same folder, renamed over the target only once complete (a full disk leaves no truncated
    ``.parquet`` behind, and an earlier one stays as it was)."""
    path = output_dir / f"{name}.parquet"
    output_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # a folder it makes: the user's only
    temporary = output_dir / f".{name}.{uuid.uuid4().hex[:12]}.parquet.partial"
    try:
        os.close(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))  # the rows: 0600
        dataset.to_parquet(str(temporary))
        with open(temporary, "rb") as written:
            os.fsync(written.fileno())
        os.replace(temporary, path)
    except OSError as exc:
        temporary.unlink(missing_ok=True)
        raise OutputError(
            f"cannot write {path}: {describe(exc)}; the set is in the datasets cache, and {_AFTER}"
        ) from exc
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return path
