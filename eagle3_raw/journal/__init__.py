"""Crash-safe, append-only journal of what every run generated, shared by every set that needs it.

A journal root (``journal_root()``, ``--journal-dir``) holds, outside the ``datasets`` cache (which
deletes its ``.incomplete`` folder on any error)::

    generations/<model>/          every /generate exchange made for one model, once, by request digest
        target.json               which model (served name, path, weights, SGLang version)
        gen-<host>-<n>.bin|.idx|.lock    one log per writing process (records, index, lock)
    sets/<config id>/             one set: the outcome of each of its rows
        manifest.json, manifest.lock     what the set is, its target, recipe, retry epoch, history
        out-<shard>-<host>-<n>.bin|.idx|.lock   outcome logs (a row by digest, or a failure)
        plan-<shard>-<host>-<n>.bin   each planned source row's number of row keys (:mod:`.plans`)
        shard-<i>-of-<N>.lock     held by the process writing that shard
        complete-<i>-of-<N>.json  the shard has an outcome for every row it planned

The package, by concern: :mod:`.files` (OSError handling, private folders, no symlinks, fsync
points, locks), :mod:`.records` (the framed records and their payloads), :mod:`.log` (one writer's
data and index files: commit order, recovery, full disks), :mod:`.generations` (the store by
request digest and its memo by input key), :mod:`.sets` (a set's outcomes), :mod:`.manifest` (a
set's manifest), :mod:`.plans` (the source rows a resume need not read), :mod:`.store`
(:class:`Journal`, both joined, and reading a set back) and :mod:`.roots` (listing and pruning
journals), :mod:`.spill` (what a full disk had no room for, kept elsewhere until a rerun takes it
back). Import from here.

**Identity.** Rows are matched by what was sent, never by position (:mod:`eagle3_raw.identity`):
a row's outcome names the digest of its request; a generation is kept once per model however many
sets use it; two sets never share a folder, and no set mixes models or server configurations
(both are part of its config id).

**Durability.** Records are buffered and written every ``flush_interval`` seconds (about one
second of rows at risk): data fsynced, then its index entries fsynced; a row counts only once its
outcome is indexed and its generation is in the store. See :mod:`.log` for recovery and full disks.

**Processes and hosts.** Each process writes logs named after its own host; a shard is written by
one process at a time (its lock); readers only read index files, so another writer's tail in
progress is never read as damage. Nothing orders events across hosts by their clocks.
"""

from eagle3_raw.journal.sets import FAILURE_KINDS, pack_key
from eagle3_raw.journal.store import Journal, journal_root, set_dir

__all__ = ["FAILURE_KINDS", "Journal", "journal_root", "pack_key", "set_dir"]
