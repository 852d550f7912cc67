"""Crash-safe, append-only journal of the rows a run has finished.

A journal is a directory outside the ``datasets`` cache (which deletes its ``.incomplete`` folder on
any error), one per recipe fingerprint, by default ``journal_root() / recipe.config_id``::

    manifest.json           fingerprint, recipe, server identity, history; replaced atomically
    manifest.lock           flock held while one process read-modify-writes the manifest
    rows-<shard>.bin        row records, appended by the one process that writes <shard>
    rows-<shard>.lock       flock held by that process while its Journal is open (holds its pid)
    failures-<shard>.jsonl  failure records and clear markers, one JSON object per line

The package, by concern: :mod:`.records` (the binary rows-file record and its CRC, decoding to rows
and Arrow), :mod:`.index` (indexing and repairing rows files, the canonical order, reading back),
:mod:`.failures` (the failures files), :mod:`.manifest` (the manifest and the server-identity check),
:mod:`.files` (OSError handling, fsync points, shard locks) and :mod:`.store` (:class:`Journal`, which
ties them together). Import from here; the modules are the package's own.

**Durability.** :meth:`Journal.append` encodes the row and buffers it; a background thread writes the
buffer every ``flush_interval`` seconds and fsyncs the file, so at most about that long of rows is at
risk; :meth:`Journal.flush` and :meth:`Journal.close` write at once. A row counts as journaled
(:meth:`Journal.done`, :meth:`Journal.iter_tables`) only after its fsync. A new file is followed by
an fsync of its directory; the manifest is replaced by write-temp, fsync, rename, fsync(directory).

**Repair.** Opening a shard for writing scans its file and cuts a torn tail (short header, short
record, bad magic, bad checksum) back to the last complete record. Damaged bytes followed by a valid
record are corruption, not a torn write: that raises JournalError instead of dropping data. Readers
stop at a torn tail without cutting it (its writer may be writing it right now).

**Exactly once.** Records are never rewritten; readers deduplicate by RowKey and the first record of
a key wins, "first" meaning the lowest (shard file name, offset). Rows come out in RowKey order,
whatever order they were appended in.

**Processes.** One process writes one shard file (flock on ``rows-<shard>.lock``; a second writer
gets JournalError). Every reader (:meth:`Journal.done`, :meth:`Journal.iter_tables`,
:meth:`Journal.failures`, :meth:`Journal.stats`) reads all shard files of the directory, so merging
shards is opening the directory with :meth:`Journal.read` and iterating.

**Errors.** An OSError while writing (ENOSPC, EFBIG, EROFS, EACCES, EIO) becomes JournalError naming
the path and the error. The partial group is truncated away at once (or cut at the next open), what
was fsync'd stays readable, and the Journal accepts no more writes.
"""

from eagle3_raw.journal.failures import FAILURE_KINDS
from eagle3_raw.journal.manifest import IDENTITY_KEYS
from eagle3_raw.journal.manifest import identity_differences as identity_differences
from eagle3_raw.journal.records import encode_record as encode_record
from eagle3_raw.journal.store import Journal, journal_root

__all__ = ["FAILURE_KINDS", "IDENTITY_KEYS", "Journal", "journal_root"]
