"""A derived set (issue 24): the rows of a set that its recipe's ``select`` rules keep.

The parent is the same recipe without ``select`` (its set id: :func:`parent_config_id`); the
derived set is built as any set (its generations are the parent's, found by request digest, so
nothing is sent again) and its rows are the parent's rows that every rule keeps, read in the
parent's canonical order (:func:`tables`, the one call :func:`eagle3_raw.builder.journal_tables`
makes). The rules enter the derived set's fingerprint with this module's code digest
(:func:`eagle3_raw.recipe.fingerprint.fingerprint_payload`).

**Order and counting.** The rules run in the order :class:`~eagle3_raw.recipe.schema.SelectConfig`
declares them: finish reasons, lengths, acceptance (rows without acceptance figures are dropped
as ``accept_not_measured`` when an acceptance rule is set), repetition, then exact and near
duplicate prompts. A row dropped by several rules is counted once, under the first that drops it.
The row rules are functions of the row alone, except ``lowest_accept_fraction``, whose bound is
taken over the whole parent set (every measured row, before the other rules). The duplicate
rules compare a row with the rows kept before it (those that passed every rule), so a prompt's
first row that the other rules keep is the one kept.

**Repetition rate** of a generated span of ids ``s`` and n-gram size ``n``: the share of its
n-grams ``s[i:i+n]`` (``i`` from 0 to ``len(s) - n``) that equal an n-gram at an earlier position
of the same span, i.e. ``1 - distinct / count``; 0 for a span shorter than ``n``. A row's rate is
the highest of its spans' (a merged rollout row has one span per turn).

**Near duplicates**: the set of a prompt's ``near_duplicate_shingle``-id shingles (one shingle of
the whole prompt when it is shorter), a MinHash signature of :data:`MINHASH_HASHES` multiply-shift
hashes (fixed seed), candidates from LSH (:data:`LSH_BANDS` bands of :data:`LSH_ROWS`) and a
candidate kept before counted when the share of equal signature entries (the estimated Jaccard
similarity) is at least the threshold. A pair at similarity 0.5 is a candidate with probability
0.87, at 0.7 above 0.999. Memory: the signature (1 KiB) and band keys of every kept row.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from eagle3_raw.errors import FatalError, JournalError
from eagle3_raw.identity import Target, set_config_id
from eagle3_raw.journal import Journal, set_dir
from eagle3_raw.recipe import Recipe
from eagle3_raw.recipe.schema import SelectConfig

log = logging.getLogger("eagle3_raw")

UNMEASURED = "accept_not_measured"
"""The reason of a row dropped because an acceptance rule is set and the row has no figures."""

ACCEPT_RULES = ("min_accept_length", "max_accept_length", "lowest_accept_fraction")
LENGTH_RULES = (
    "min_prompt_len", "max_prompt_len", "min_output_len", "max_output_len", "min_total_len", "max_total_len",
)  # fmt: skip
REASONS = (
    "finish_reasons", *LENGTH_RULES, UNMEASURED, *ACCEPT_RULES, "max_repetition", "drop_duplicate_prompts",
    "near_duplicate_threshold",
)  # fmt: skip
"""Every reason a row is dropped for, in the order the rules run."""

MINHASH_HASHES = 128
LSH_BANDS = 32
LSH_ROWS = MINHASH_HASHES // LSH_BANDS
_SEED = 0x5E1EC7
_MASK61 = np.uint64((1 << 61) - 1)


# --- reading ----------------------------------------------------------------------------------


def tables(journal: Journal, recipe: Recipe) -> Iterator[pa.Table]:
    """The set's rows from ``journal`` in canonical order: the parent's (:func:`parent_tables`),
    then, for a derived set, only those its ``select`` rules keep (counted; logged at the end)."""
    if not recipe.select.active:
        yield from parent_tables(journal, recipe)
        return
    selection = Selection.start(recipe.select, lambda: parent_tables(journal, recipe))
    for table in parent_tables(journal, recipe):
        yield selection.apply(table)
    counts = selection.counts
    if counts.parent_rows and not counts.kept:
        unmeasured = " (the parent's rows have no acceptance figures: was its server speculating?)"
        raise FatalError(
            f"recipe {recipe.name!r} kept no row: {counts.describe()}"
            f"{unmeasured if counts.dropped.get(UNMEASURED) else ''}; loosen its select rules"
        )
    log.info("%s", counts.describe())


def parent_tables(journal: Journal, recipe: Recipe) -> Iterator[pa.Table]:
    """The parent set's rows: the journal's, without those ``on_truncation: drop`` leaves out."""
    for table in journal.iter_tables():
        if recipe.on_truncation == "drop":
            table = table.filter(pc.not_equal(table["finish_reason"], "length"))
        yield table


# --- the counts -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Counts:
    """Rows read from the parent, rows kept, and rows dropped by reason (:data:`REASONS`)."""

    parent_rows: int = 0
    kept: int = 0
    dropped: Mapping[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the dropped counts in the rules' order, reasons that dropped none left out."""
        dropped = {reason: self.dropped[reason] for reason in REASONS if self.dropped.get(reason)}
        return {"parent_rows": self.parent_rows, "kept": self.kept, "dropped": dropped}

    def describe(self) -> str:
        """One line: kept out of the parent's rows, and each reason's count."""
        reasons = ", ".join(f"{reason} {count:,}" for reason, count in self.to_dict()["dropped"].items())
        return f"select: kept {self.kept:,} of {self.parent_rows:,} rows" + (
            f"; dropped: {reasons}" if reasons else ""
        )


# --- the rules --------------------------------------------------------------------------------


class Selection:
    """The rules of one read of a set, with the state the duplicate rules keep across batches."""

    def __init__(self, rules: SelectConfig, lowest: np.ndarray | None = None) -> None:
        """``lowest``: for ``lowest_accept_fraction``, whether each parent row (by position) is
        among the lowest (:func:`lowest_accept`)."""
        self.rules = rules
        self.lowest = lowest
        self._rows = 0
        self._dropped: Counter[str] = Counter()
        self._seen: set[bytes] = set()
        near = rules.near_duplicate_threshold is not None
        self._near = NearDuplicates(rules.near_duplicate_shingle) if near else None

    @property
    def counts(self) -> Counts:
        """What this read has counted so far."""
        dropped = dict(self._dropped)
        return Counts(self._rows, self._rows - sum(dropped.values()), dropped)

    @classmethod
    def start(cls, rules: SelectConfig, parent: Callable[[], Iterable[pa.Table]]) -> Selection:
        """The selection for one read; ``parent`` gives the parent's tables again for the rules
        that need the whole set first (``lowest_accept_fraction``)."""
        fraction = rules.lowest_accept_fraction
        if fraction is None:
            return cls(rules)
        accept = np.concatenate([np.zeros(0), *(accept_lengths(table) for table in parent())])
        return cls(rules, lowest_accept(accept, fraction))

    def apply(self, table: pa.Table) -> pa.Table:
        """The rows of ``table`` (the next parent batch) that every rule keeps, drops counted."""
        first = self._rows
        self._rows += table.num_rows
        reasons = self.row_reasons(table, first)
        keep = np.zeros(table.num_rows, dtype=bool)
        prompts = _prompt_ids(table) if self._needs_prompts else None
        for i, reason in enumerate(reasons):
            if reason is None and prompts is not None:
                reason = self._duplicate(prompts[i])
            if reason is None:
                keep[i] = True
            else:
                self._dropped[reason] += 1
        return table.filter(pa.array(keep))

    @property
    def _needs_prompts(self) -> bool:
        return self.rules.drop_duplicate_prompts or self._near is not None

    def row_reasons(self, table: pa.Table, first: int = 0) -> list[str | None]:
        """For each row of ``table`` (parent positions from ``first``), the first row rule that
        drops it (None: kept by all), in :data:`REASONS` order; duplicates are not looked at."""
        r = self.rules
        reasons: list[str | None] = [None] * table.num_rows
        checks: list[tuple[str, np.ndarray]] = []  # (reason, kept) in the rules' order
        if r.finish_reasons is not None:
            finish = table["finish_reason"].to_numpy(zero_copy_only=False)
            checks.append(("finish_reasons", np.isin(finish, list(r.finish_reasons))))
        lengths = row_lengths(table)
        for name in LENGTH_RULES:
            bound = getattr(r, name)
            if bound is not None:
                values = lengths[name.split("_")[1]]
                checks.append((name, values >= bound if name.startswith("min") else values <= bound))
        if any(getattr(r, name) is not None for name in ACCEPT_RULES):
            accept = accept_lengths(table)
            checks.append((UNMEASURED, ~np.isnan(accept)))
            if r.min_accept_length is not None:
                checks.append(("min_accept_length", accept >= r.min_accept_length))
            if r.max_accept_length is not None:
                checks.append(("max_accept_length", accept <= r.max_accept_length))
            if self.lowest is not None:
                checks.append(("lowest_accept_fraction", self.lowest[first : first + table.num_rows]))
        if r.max_repetition is not None:
            rates = np.array([max(spans, default=0.0) for spans in span_rates(table, r.repetition_ngram)])
            checks.append(("max_repetition", rates <= r.max_repetition))
        for reason, kept in checks:
            for i in np.flatnonzero(~kept):
                if reasons[i] is None:
                    reasons[i] = reason
        return reasons

    def _duplicate(self, prompt: np.ndarray) -> str | None:
        """The duplicate rule that drops a row with ``prompt`` (None: kept, and remembered)."""
        key = hashlib.blake2b(prompt.astype("<i4").tobytes(), digest_size=16).digest()
        if self.rules.drop_duplicate_prompts and key in self._seen:
            return "drop_duplicate_prompts"
        signature = None
        if self._near is not None:
            assert self.rules.near_duplicate_threshold is not None
            signature = self._near.signature(prompt)
            if self._near.matches(signature, self.rules.near_duplicate_threshold):
                return "near_duplicate_threshold"
        self._seen.add(key)
        if self._near is not None and signature is not None:
            self._near.add(signature)
        return None


def lowest_accept(accept: np.ndarray, fraction: float) -> np.ndarray:
    """Whether each row is among the ``ceil(fraction x measured)`` measured rows with the lowest
    acceptance length (``accept``: NaN where not measured; ties: the earlier row)."""
    measured = np.flatnonzero(~np.isnan(accept))
    take = math.ceil(fraction * len(measured) - 1e-9)
    order = measured[np.argsort(accept[measured], kind="stable")][:take]
    chosen = np.zeros(len(accept), dtype=bool)
    chosen[order] = True
    return chosen


# --- columns ----------------------------------------------------------------------------------


def accept_lengths(table: pa.Table) -> np.ndarray:
    """Each row's ``meta.spec_accept_length`` as float64, NaN where null (or where the rows have no
    such column: a set built before acceptance was recorded)."""
    meta = table["meta"].combine_chunks() if table.num_rows else None
    if meta is None or meta.type.get_field_index("spec_accept_length") < 0:
        return np.full(table.num_rows, np.nan)
    values = pc.struct_field(meta, "spec_accept_length").cast(pa.float64())
    return np.asarray(values.fill_null(np.nan).to_numpy(zero_copy_only=False), dtype=np.float64)


def row_lengths(table: pa.Table) -> dict[str, np.ndarray]:
    """``prompt`` (``prompt_len``), ``output`` (ids with ``loss_mask`` 1) and ``total``
    (``len(input_ids)``) of each row, as int64 arrays."""
    prompt = table["prompt_len"].to_numpy().astype(np.int64)
    total = pc.list_value_length(table["input_ids"]).to_numpy().astype(np.int64)
    mask = table["loss_mask"].combine_chunks()
    flat = np.asarray(mask.values.to_numpy(), dtype=np.int64)  # .values: the offsets index into it
    offsets = np.asarray(mask.offsets.to_numpy(), dtype=np.int64)
    sums = np.concatenate([[0], np.cumsum(flat)])
    return {"prompt": prompt, "output": sums[offsets[1:]] - sums[offsets[:-1]], "total": total}


def span_rates(table: pa.Table, n: int) -> list[list[float]]:
    """Each row's generated spans' repetition rates (:func:`repetition_rate`), span by span."""
    ids, offsets = _flat_ids(table)
    rows: list[list[float]] = []
    for row, spans in enumerate(table["spans"].to_pylist()):
        base = offsets[row]
        rows.append([repetition_rate(ids[base + s["start"] : base + s["end"]], n) for s in spans or []])
    return rows


def repetition_rate(ids: np.ndarray | list[int], n: int) -> float:
    """The share of the n-grams of ``ids`` that equal an n-gram at an earlier position: ``1 -
    distinct / count`` over the ``len(ids) - n + 1`` n-grams; 0.0 when ``ids`` is shorter than ``n``."""
    values = np.ascontiguousarray(ids, dtype=np.int32)
    count = len(values) - n + 1
    if count <= 0:
        return 0.0
    windows = np.lib.stride_tricks.sliding_window_view(values, n)
    distinct = len(np.unique(np.ascontiguousarray(windows).view(np.dtype((np.void, 4 * n)))))
    return 1.0 - distinct / count


def _prompt_ids(table: pa.Table) -> list[np.ndarray]:
    """Each row's prompt ids (``input_ids[:prompt_len]``), as views of the batch's ids."""
    ids, offsets = _flat_ids(table)
    lengths = table["prompt_len"].to_numpy()
    return [ids[offsets[row] : offsets[row] + int(lengths[row])] for row in range(table.num_rows)]


def _flat_ids(table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """The batch's ``input_ids`` as one int32 array and each row's start in it (and the end)."""
    column = table["input_ids"].combine_chunks()
    offsets = np.asarray(column.offsets.to_numpy(), dtype=np.int64)
    values = np.asarray(column.values.to_numpy(), dtype=np.int32)
    return values, offsets


# --- near duplicates --------------------------------------------------------------------------


class NearDuplicates:
    """MinHash signatures of the kept prompts and their LSH band keys (see the module docstring)."""

    def __init__(self, shingle: int) -> None:
        rng = np.random.default_rng(_SEED)
        self.shingle = shingle
        self._a = rng.integers(1, 1 << 61, MINHASH_HASHES, dtype=np.uint64) | np.uint64(1)
        self._b = rng.integers(0, 1 << 61, MINHASH_HASHES, dtype=np.uint64)
        self._signatures: list[np.ndarray] = []
        self._bands: list[dict[bytes, list[int]]] = [defaultdict(list) for _ in range(LSH_BANDS)]

    def signature(self, prompt: np.ndarray) -> np.ndarray:
        """The MinHash signature (uint32, :data:`MINHASH_HASHES`) of ``prompt``'s shingle set."""
        hashes = shingle_hashes(prompt, self.shingle)
        mixed = (self._a[:, None] * hashes[None, :] + self._b[:, None]) >> np.uint64(32)
        return np.asarray(mixed.min(axis=1), dtype=np.uint32)

    def matches(self, signature: np.ndarray, threshold: float) -> bool:
        """Whether a kept prompt among ``signature``'s LSH candidates has an estimated Jaccard
        similarity of at least ``threshold``."""
        keys = enumerate(self._keys(signature))
        candidates = {i for band, key in keys for i in self._bands[band].get(key, ())}
        return any(np.mean(self._signatures[i] == signature) >= threshold for i in sorted(candidates))

    def add(self, signature: np.ndarray) -> None:
        """Remember a kept prompt's signature."""
        index = len(self._signatures)
        self._signatures.append(signature)
        for band, key in enumerate(self._keys(signature)):
            self._bands[band][key].append(index)

    @staticmethod
    def _keys(signature: np.ndarray) -> list[bytes]:
        return [signature[b * LSH_ROWS : (b + 1) * LSH_ROWS].tobytes() for b in range(LSH_BANDS)]


def shingle_hashes(prompt: np.ndarray, size: int) -> np.ndarray:
    """The distinct 64-bit hashes of ``prompt``'s ``size``-id shingles (one of the whole prompt
    when it is shorter; a fixed hash for an empty one)."""
    values = np.asarray(prompt, dtype=np.int64)
    if len(values) < size:
        values = np.concatenate([values, np.full(size - len(values), -1, dtype=np.int64)])
    windows = np.lib.stride_tricks.sliding_window_view(values, size).astype(np.uint64)
    hashes = np.zeros(len(windows), dtype=np.uint64)
    for column in range(size):  # polynomial hash, wrapping at 2**64
        hashes = hashes * np.uint64(0x100000001B3) + windows[:, column] + np.uint64(1)
    return np.unique(hashes & _MASK61)


# --- the parent -------------------------------------------------------------------------------


def parent_recipe(recipe: Recipe) -> Recipe:
    """The recipe of ``recipe``'s parent set: the same, without ``select``."""
    return dataclasses.replace(recipe, select=SelectConfig())


def parent_config_id(recipe: Recipe, target: Target, root: Path | None = None) -> str:
    """The config id of the set ``recipe`` selects from (by ``target``). A config id is the
    recipe's name and a digest that does not depend on it: a derived recipe renamed (to be pushed
    beside its parent) names the parent's set in the journal ``root`` by the digest, whatever
    name it was built under (the first in name order when several), else by its own name."""
    own = set_config_id(parent_recipe(recipe), target)
    digest = own.removeprefix(f"{recipe.name}-")
    if root is not None and not set_dir(root, own).is_dir():
        found = sorted(p.name for p in (root / "sets").glob(f"*-{digest}") if p.name.endswith(f"-{digest}"))
        if found:
            return found[0]
    return own


@dataclass(frozen=True)
class Report:
    """What the manifest and the card say of a derived set: its parent, its rules, its counts."""

    parent: Mapping[str, Any]
    rules: Mapping[str, Any]
    counts: Counts

    def to_dict(self) -> dict[str, Any]:
        return {"parent": dict(self.parent), "rules": dict(self.rules), **self.counts.to_dict()}


def report(recipe: Recipe, journal_dir: Path) -> Report | None:
    """The selection of the set whose journal is ``journal_dir``, recomputed from it (None: the
    recipe selects nothing). The parent is named by config id and, where it was pushed, by each
    ``repo@revision`` it went to."""
    if not recipe.select.active:
        return None
    with Journal.read_dir(journal_dir) as journal:
        target = Target.from_dict(journal.manifest["target"])
        selection = Selection.start(recipe.select, lambda: parent_tables(journal, recipe))
        for table in parent_tables(journal, recipe):
            selection.apply(table)
    root = journal_dir.parent.parent  # the journal root (journal.set_dir)
    parent_id = parent_config_id(recipe, target, root)
    parent = {"config_id": parent_id, "pushed": _pushed(root, parent_id)}
    return Report(parent, recipe.select.rules(), selection.counts)


def _pushed(root: Path, config_id: str) -> list[str]:
    """Where the set ``config_id`` was pushed (``repo@tag-or-commit``), as its journal records."""
    directory = set_dir(root, config_id)
    if not (directory / "manifest.json").exists():
        return []
    try:
        with Journal.read_dir(directory) as journal:
            return sorted(journal.manifest.get("pushed") or [])
    except JournalError as exc:
        log.debug("cannot read the parent set's journal %s: %s", directory, exc)
        return []
