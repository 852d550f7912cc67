"""Records a full journal disk had no room for, kept on another disk until a rerun takes them back.

A run whose journal's disk is full holds what it generated in memory (:mod:`.log`). When it ends
(finished, stopped, interrupted) with records still held, each writer's pending records go to a
log of the same kind in the spill folder, written and fsynced as the journal's own; the next
writer of the same logs (a rerun of the recipe, any set of the same model) appends them to its own
log, and once they are durable there removes the spilled files. Nothing is generated twice; a
record that ends up in both places is harmless (readers take the first of a key).

Layout: ``<spill root>/<16 hex of the journal root's path>/<the log folder under the root>/``, e.g.
``/tmp/eagle3_raw-spill-1000/3f0c.../sets/<config id>/out-0-of-1-<host>-0.bin|.idx|.lock``. The
spill root is ``$EAGLE3_RAW_SPILL_DIR``, else ``eagle3_raw-spill-<uid>`` in the system's temporary
folder (usually another disk than ``~/.cache``); its folders are 0700 and checked as a journal's.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from pathlib import Path

from eagle3_raw.errors import JournalError
from eagle3_raw.journal.files import check_journal_dirs, guard, make_private_dir, read_bytes, try_lock
from eagle3_raw.journal.log import LogWriter, entry_columns, log_files
from eagle3_raw.journal.records import checked_payload

_log = logging.getLogger("eagle3_raw.journal")

_NEVER = 1e9  # a spill log is written once, on close: its flusher never runs first


def spill_root() -> Path:
    """Where spilled records go: ``$EAGLE3_RAW_SPILL_DIR``, else ``<tmp>/eagle3_raw-spill-<uid>``."""
    configured = os.environ.get("EAGLE3_RAW_SPILL_DIR")
    if configured:
        return Path(configured).expanduser()
    return Path(tempfile.gettempdir()) / f"eagle3_raw-spill-{os.geteuid()}"


def spill_dir(journal_root: Path, directory: Path, base: Path | None = None) -> Path:
    """The spill folder of the log folder ``directory`` of the journal root ``journal_root``."""
    key = hashlib.sha256(os.fsencode(journal_root.resolve())).hexdigest()[:16]
    return (base or spill_root()) / key / directory.relative_to(journal_root)


def spill(writer: LogWriter, folder: Path, base: Path) -> int:
    """Move what ``writer`` holds into a log of its own in ``folder`` (under the spill root
    ``base``); returns how many records. JournalError when that fails too: the records are then
    held by ``writer`` again."""
    pending = writer.take_pending()
    if not pending:
        return 0
    try:
        make_private_dir(folder, base)
        spilled = LogWriter(folder, writer.prefix, writer.kind, flush_interval=_NEVER)
        try:
            for record in pending:
                spilled.append(*record)
        finally:
            spilled.close()  # fsync point: the records are durable here before the run says so
    except BaseException:
        for record in pending:
            writer.append(*record)
        raise
    return len(pending)


def take_back(writer: LogWriter, folder: Path, base: Path) -> int:
    """Append to ``writer`` the records spilled in ``folder`` by writers of its prefix, write them,
    then remove the spilled files; returns how many records. When the journal's disk still has no
    room, nothing is taken (the files stay) and 0 is returned."""
    if not folder.is_dir():
        return 0
    check_journal_dirs(folder, base)
    taken, files = 0, []
    for path in log_files(folder, writer.prefix):
        lock = try_lock(path.with_suffix(".lock"))
        if lock is None:  # another process spills or takes it back now
            continue
        files.append((path, lock))
        taken += _append_records(writer, path)
    written = False
    try:
        writer.flush()
        written = True
    except JournalError:
        if writer.full_since is None:
            raise
        writer.take_pending()  # still no room: they stay in the spill folder only
        _log.warning("the journal's disk is still full: %d records stay in %s", taken, folder)
    finally:
        for path, lock in files:
            if written:
                _remove_log(path)
            os.close(lock)
    return taken if written else 0


def _append_records(writer: LogWriter, path: Path) -> int:
    columns = entry_columns([path])
    for key1, key2, offset, kind, length in zip(
        columns["key1"], columns["key2"], columns["offset"].tolist(), columns["kind"].tolist(),
        columns["length"].tolist(), strict=True,
    ):  # fmt: skip
        with guard("read", path):
            record = read_bytes(path, offset, length)
        if checked_payload(record, length, writer.kind.magic) is None:
            raise JournalError(f"{path}: the spilled record at offset {offset} is damaged: it stays there")
        writer.append(record, bytes(key1).ljust(16, b"\0"), bytes(key2).ljust(16, b"\0"), kind)
    return len(columns["key1"])


def _remove_log(path: Path) -> None:
    for suffix in (".bin", ".idx", ".lock"):
        with guard("remove", path.with_suffix(suffix)):
            path.with_suffix(suffix).unlink(missing_ok=True)
