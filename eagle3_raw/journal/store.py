"""The :class:`Journal` of one set: its outcomes (:mod:`.sets`) joined with its target's generations
(:mod:`.generations`), and where journals live (:func:`journal_root`).

A run writes through it (a generation and its row, a reused generation, a failure) and plans with
it (the keys already done, the memo of earlier requests); the builder reads the set back from it in
key order as Arrow tables, without any server. See :mod:`eagle3_raw.journal` for the layout.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3_raw.errors import JournalError
from eagle3_raw.identity import Target
from eagle3_raw.journal.assembly import Pair, merged_groups, mixture_counts, rollout_stats, to_row, to_table
from eagle3_raw.journal.files import check_journal_dirs, open_shared_use
from eagle3_raw.journal.generations import GenerationIndex, GenerationStore, Location, generations_dir
from eagle3_raw.journal.log import LogWriter
from eagle3_raw.journal.records import FAILURE, GEN_FIXED, GENERATION, HEAD, ROW, Outcome
from eagle3_raw.journal.sets import FAILURE_KINDS, Entries, SetJournal, iter_positions, pack_key, union_keys
from eagle3_raw.journal.spill import spill, spill_dir, spill_root, take_back
from eagle3_raw.rows import Row, RowKey, arrow_schema

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    import pyarrow as pa

    from eagle3_raw.identity import Target

log = logging.getLogger("eagle3_raw")

_MAX_BATCH_IDS = 8 << 20  # ids per Arrow batch: bounds batch memory and keeps int32 offsets valid


def journal_root() -> Path:
    """Where journals live: ``$EAGLE3_RAW_JOURNAL_DIR``, else ``~/.cache/eagle3_raw/journals``."""
    configured = os.environ.get("EAGLE3_RAW_JOURNAL_DIR")
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "eagle3_raw" / "journals"


def set_dir(root: Path, config_id: str) -> Path:
    """The folder of set ``config_id``'s journal under the journal root ``root``."""
    return root / "sets" / config_id


@dataclass(frozen=True)
class Spilled:
    """What a journal held when it closed on a full disk, and where it went."""

    rows: int
    """Generations held (rows that would have to be generated again if lost)."""
    records: int
    """Records written to the spill folder (generations, outcomes, aliases); 0 when that failed."""
    folder: Path
    error: str = ""
    """Why the spill failed too (then the rows are lost), else empty."""

    def message(self) -> str:
        """One sentence for the user: how many rows, where they are, what to do."""
        if self.error:
            return (
                f"the journal's disk is full and {self.rows:,} generated rows held in memory could not be "
                f"kept in the spill folder {self.folder} either ({self.error}): a rerun generates them again"
            )
        return (
            f"the journal's disk is full: {self.rows:,} generated rows held in memory were written to the "
            f"spill folder {self.folder}; free space on the journal's disk and run the same command again: "
            "it takes them back (nothing is generated twice)"
        )


class Journal:
    """One set's journal (outcomes and generations); :meth:`open` to write a shard, :meth:`read` to read.

    Writing calls may come from any thread; ``close`` must not race them.
    """

    def __init__(self, root: Path, sets: SetJournal, generations: GenerationStore) -> None:
        """Use :meth:`open` or :meth:`read`."""
        self.root = root
        self.sets = sets
        self.generations = generations
        self._in_use: int | None = None  # a writer's shared hold on the root's gc.lock
        self.spilled: Spilled | None = None
        self._closed = False
        """Set by :meth:`close` when the journal's disk had no room for what it held."""

    @classmethod
    def open(
        cls, root: Path, fresh: Mapping[str, Any], target: Target, *, shard: str = "0-of-1",
        flush_interval: float = 1.0,
    ) -> Journal:  # fmt: skip
        """Create or reopen set ``fresh["config_id"]`` under ``root`` and become the writer of ``shard``."""

        sets = SetJournal.open(
            set_dir(root, fresh["config_id"]), fresh, shard=shard, flush_interval=flush_interval
        )
        journal = cls(root, sets, GenerationStore(generations_dir(root, target), target))
        try:
            journal._in_use = open_shared_use(root)  # no garbage collection while this writer lives
            journal.generations.open_writer(flush_interval=flush_interval)
            journal._take_back()
        except BaseException:
            journal.close()
            raise
        return journal

    def _take_back(self) -> None:
        """Append what an earlier run spilled for these logs (its disk was full), before planning."""
        base = spill_root()
        counts = [
            take_back(store.writer, spill_dir(self.root, store.directory, base), base)
            for store in (self.generations, self.sets)  # generations first: a row counts once both are in
        ]
        if any(counts):
            log.warning(
                "took back %d generations and %d row outcomes an earlier run kept in %s when the journal's "
                "disk was full", counts[0], counts[1], spill_dir(self.root, self.root, base),
            )  # fmt: skip

    @classmethod
    def read(cls, root: Path, config_id: str) -> Journal:
        """Open set ``config_id`` under ``root`` to read, without locks or writes."""
        sets = SetJournal.read(set_dir(root, config_id))  # checks the folders, as a writer does
        target = Target.from_dict(sets.manifest["target"])
        check_journal_dirs(generations_dir(root, target), root)
        return cls(root, sets, GenerationStore(generations_dir(root, target)))

    @classmethod
    def read_dir(cls, directory: Path) -> Journal:
        """Open the set journal folder ``directory`` (``<root>/sets/<config id>``) to read."""
        return cls.read(directory.parent.parent, directory.name)

    @property
    def directory(self) -> Path:
        return self.sets.directory

    @property
    def manifest(self) -> dict[str, Any]:
        return self.sets.manifest

    # --- writing ---------------------------------------------------------------------------------

    def add_generation(
        self, key: RowKey, *, digest: bytes, input_key: bytes, prompt_ids: Sequence[int],
        output_ids: Sequence[int], generation: Mapping[str, Any], row: Mapping[str, Any],
    ) -> None:  # fmt: skip
        """Journal a new generation and that ``key`` is it (``generation``: finish_reason,
        sampling_params, meta; ``row``: source_id, sampling_seed, attempts). The generation is
        queued first, and both are written by the same flush order: generation log, then outcomes."""
        self.generations.put(digest, input_key, prompt_ids, output_ids, generation)
        self.sets.add_row(key, digest, {**row, "reused": False})

    def add_reused(
        self, key: RowKey, *, digest: bytes, row: Mapping[str, Any], alias: bytes | None = None
    ) -> None:
        """Journal that ``key`` is the generation ``digest`` already in the store (with ``alias``: the
        input key that found it by its request, remembered for next time)."""
        if alias is not None:
            self.generations.alias(digest, alias)
        self.sets.add_row(key, digest, {**row, "reused": True})

    def add_failure(self, key: RowKey, row_id: str, kind: str, reason: str) -> None:
        self.sets.add_failure(key, row_id, kind, reason)

    def flush(self) -> None:
        """Write and fsync everything journaled so far: generations before the outcomes naming them."""
        self.generations.flush()  # fsync point order: a row's generation is durable before the row
        self.sets.flush()

    @property
    def full_since(self) -> float | None:
        """Since when (``time.monotonic()``) a writer finds no space on the journal's disk, or None."""
        times = [w.full_since for w in self._writers() if w.full_since is not None]
        return min(times) if times else None

    @property
    def held_rows(self) -> int:
        """Generations made and not on disk yet (more than a flush's worth only while the disk is full)."""
        writer = self.generations.writer_or_none
        return writer.held(GENERATION) if writer is not None else 0

    def _writers(self) -> list[LogWriter]:
        return [w for w in (self.generations.writer_or_none, self.sets.writer_or_none) if w is not None]

    def close(self) -> None:
        """Write what is held, stop writing and release the locks. When the journal's disk still has
        no room, what it holds is spilled first (:mod:`.spill`, :attr:`spilled` says where). A second
        call does nothing."""
        if self._closed:
            return
        self._closed = True
        try:
            self._spill_if_full()
            self.generations.close()
        finally:
            self.sets.close()
            if self._in_use is not None:
                os.close(self._in_use)
                self._in_use = None

    def _spill_if_full(self) -> None:
        writers = self._writers()
        if not writers:
            return
        try:
            self.flush()
            return
        except JournalError:
            if self.full_since is None:
                return  # another write error: close raises it
        rows, base = self.held_rows, spill_root()
        folder = spill_dir(self.root, self.root, base)
        try:
            records = sum(spill(w, spill_dir(self.root, w.path.parent, base), base) for w in writers)
        except JournalError as exc:
            self.spilled = Spilled(rows, 0, folder, str(exc))
            return
        self.spilled = Spilled(rows, records, folder)

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- planning ----------------------------------------------------------------------------------

    def generation_index(self) -> GenerationIndex:
        return self.generations.index()

    def done_keys(self, index: GenerationIndex | None = None) -> npt.NDArray[np.int64]:
        """Packed keys (:func:`~eagle3_raw.journal.sets.pack_key`) with a row whose generation is
        in the store, sorted: what a resume does not ask for again."""

        self.flush()
        entries = self.sets.entries()
        firsts = entries.first_rows()
        index = index or self.generation_index()
        present = index.has(entries.digest[firsts])
        return entries.packed[firsts][present]  # one per key, in key order: sorted and distinct

    def outcome_keys(self) -> npt.NDArray[np.int64]:
        """Packed keys with an outcome that counts: a row whose generation is in the store, or a
        failure (what a shard's completion marker counted)."""

        entries = self.sets.entries()
        return union_keys(self.done_keys(), entries.packed[entries.kind == FAILURE])

    def failed_keys(
        self, done: npt.NDArray[np.int64], kinds: tuple[str, ...] = ("failed",)
    ) -> npt.NDArray[np.int64]:
        """Packed keys whose current failure is of one of ``kinds`` (``failed``: not asked again
        unless --retry-failed; ``ended``: a rollout's turns after its end)."""
        import numpy as np

        failed = [pack_key(f["key"]) for f in self.sets.failures(done=done) if f["kind"] in kinds]
        return union_keys(np.array(failed, np.int64))

    # --- reading -----------------------------------------------------------------------------------

    def _rows(self) -> Iterator[tuple[Outcome, Location]]:
        try:
            yield from self._present_rows()
        finally:  # no descriptor outlives an iteration (a reader may be on a mount about to go)
            self.sets.close_readers()
            self.generations.close_readers()

    def _present_rows(self) -> Iterator[tuple[Outcome, Location]]:
        self.flush()
        entries = self.sets.entries()
        index = self.generation_index()
        firsts = entries.first_rows()
        present = firsts[index.has(entries.digest[firsts])]  # a row counts once its generation is in
        for chunk in iter_positions(present, 2048):
            locations = index.locate_all(entries.digest[chunk])
            for position, location in zip(chunk.tolist(), locations, strict=True):
                yield self.sets.read_outcome(entries, position), location

    def iter_tables(self, batch_rows: int = 1000) -> Iterator[pa.Table]:
        """Every row once, in key order, as tables in ``rows.arrow_schema()``; no server needed.

        Tables hold at most ``batch_rows`` rows (fewer if their ids are very many). Memory: ~60 bytes
        per outcome and per generation for the snapshots, plus one batch (and one source row's
        turns for a rollout set).
        """
        if batch_rows < 1:
            raise ValueError(f"batch_rows must be at least 1, got {batch_rows}")
        schema = arrow_schema()
        batch: list[list[Pair]] = []
        ids = 0
        for group in self._groups():
            batch.append(group)
            ids += len(group[-1][1].ids) // 4
            if len(batch) >= batch_rows or ids >= _MAX_BATCH_IDS:
                yield to_table(batch, schema)
                batch, ids = [], 0
        if batch:
            yield to_table(batch, schema)

    def iter_rows(self) -> Iterator[Row]:
        """Every row once, in key order, as :class:`~eagle3_raw.rows.Row`."""
        for group in self._groups():
            yield to_row(group)

    def _groups(self) -> Iterator[list[Pair]]:
        """The set's rows as groups of (outcome, generation): merged rollouts together."""
        pairs = ((outcome, self.generations.read(location)) for outcome, location in self._rows())
        if self.merges_rollouts:
            yield from merged_groups(pairs)
        else:
            yield from ([pair] for pair in pairs)

    @property
    def merges_rollouts(self) -> bool:
        """Whether this set makes one row of each rollout that keeps its history verbatim."""
        recipe = self.manifest.get("recipe") or {}
        return (
            recipe.get("turns") == "rollout" and (recipe.get("rollout") or {}).get("merge", "auto") == "auto"
        )

    def failures(self) -> list[dict[str, Any]]:
        """The current failure of every key that has one and no row, in key order."""
        try:
            return self.sets.failures()
        finally:
            self.sets.close_readers()

    def stats(self) -> dict[str, Any]:
        """Counts: ``rows``, ``prompt_tokens``, ``generated_tokens``, ``finish_reasons`` {reason: rows},
        ``tokens_by_reason``, ``reused`` (rows made of generations journaled for another row or set),
        ``failures`` {kind: {reason: n}}; for rollouts ``rollouts`` (:func:`~.assembly.rollout_stats`),
        with a mixture ``mixture`` {component: turns}. Reads no ids."""
        by_reason: dict[str, Counter[str]] = {}
        reused = 0
        outcomes: list[Outcome] = []
        for outcome, location in self._rows():
            n_prompt, n_output, finish = self.generation_facts(location)
            by_reason.setdefault(finish, Counter()).update(
                rows=1, prompt_tokens=n_prompt, generated_tokens=n_output
            )
            reused += bool(outcome.info.get("reused"))
            if outcome.info.get("kind") == "rollout" or outcome.info.get("mixture") is not None:
                outcomes.append(outcome)
        totals: Counter[str] = sum(by_reason.values(), Counter())
        current = self.failures()
        failures = self.sets.failure_counts(current)
        extra = {"mixture": mixture_counts(outcomes)} if any(o.info.get("mixture") for o in outcomes) else {}
        if (self.manifest.get("recipe") or {}).get("turns") == "rollout":
            extra["rollouts"] = rollout_stats(outcomes, current, merges=self.merges_rollouts)
        return {
            **extra,
            "rows": totals["rows"],
            "prompt_tokens": totals["prompt_tokens"],
            "generated_tokens": totals["generated_tokens"],
            "finish_reasons": {reason: c["rows"] for reason, c in by_reason.items()},
            "tokens_by_reason": {
                reason: {"prompt_tokens": c["prompt_tokens"], "generated_tokens": c["generated_tokens"]}
                for reason, c in by_reason.items()
            },
            "reused": reused,
            "failures": {
                kind: failures.get(kind, {})
                for kind in FAILURE_KINDS
                if kind != "ended" or failures.get(kind)  # rollout sets only
            },
        }

    def generation_facts(self, location: Location) -> tuple[int, int, str]:
        """(prompt tokens, generated tokens, finish reason) of the generation at ``location``,
        read without its ids."""
        import orjson

        read = self.generations.read_bytes  # on the store's descriptors, open for the whole scan
        head = read(location.path, HEAD.size + GEN_FIXED.size, location.offset)
        *_, n_prompt, n_output, n_json = GEN_FIXED.unpack_from(head, HEAD.size)
        start = location.offset + len(head) + 4 * (n_prompt + n_output)
        info = orjson.loads(read(location.path, n_json, start))
        return n_prompt, n_output, str(info["finish_reason"])


__all__ = ["ROW", "Entries", "Journal", "journal_root", "set_dir"]
