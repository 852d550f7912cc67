"""Comparing a rebuilt set with the published one: rows matched by ``id``, ``input_ids`` hashed.

Memory stays small for large sets: one 16-byte hash per published row, the rebuilt set streamed
past it, and only the first few differing rows read again to say where they differ.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from eagle3_raw.hub.sets import arrow_batches
from eagle3_raw.printable import printable

if TYPE_CHECKING:
    import datasets
    import numpy as np
    import pyarrow as pa


@dataclass(frozen=True)
class RowDifference:
    """The first place where a published row and its rebuild differ."""

    id: str
    position: int
    part: Literal["prompt", "generated"]
    published_len: int
    rebuilt_len: int
    published_ids: tuple[int, ...]
    rebuilt_ids: tuple[int, ...]

    def render(self) -> str:
        return (
            f"{printable(self.id, limit=200)}: first difference at token {self.position} ({self.part}; "
            f"lengths {self.published_len} vs {self.rebuilt_len}): published {list(self.published_ids)} "
            f"rebuilt {list(self.rebuilt_ids)}"
        )


@dataclass(frozen=True)
class Comparison:
    """How a rebuild compares with the published rows (matched by ``id``, ``input_ids`` hashed)."""

    repo_id: str
    config: str
    commit: str
    published_fingerprint: str
    rebuilt_fingerprint: str
    published_rows: int
    rebuilt_rows: int
    common: int
    identical: int
    only_published: tuple[str, ...] = ()
    only_rebuilt: tuple[str, ...] = ()
    only_published_count: int = 0
    only_rebuilt_count: int = 0
    differences: tuple[RowDifference, ...] = field(default_factory=tuple)

    @property
    def identical_share(self) -> float:
        """Published rows whose rebuild has the same ``input_ids`` (1.0 for two empty sets)."""
        return self.identical / self.published_rows if self.published_rows else float(not self.rebuilt_rows)

    @property
    def full_agreement(self) -> bool:
        """Same recipe, same row ids, every ``input_ids`` identical."""
        same_rows = self.published_rows == self.rebuilt_rows == self.common == self.identical
        return same_rows and self.published_fingerprint == self.rebuilt_fingerprint

    def render(self) -> str:
        """A plain-text report for the terminal."""
        same = "same" if self.published_fingerprint == self.rebuilt_fingerprint else "DIFFERENT recipe"
        lines = [
            f"reproduced        {self.repo_id}@{printable(self.commit)} config {printable(self.config)}",
            f"fingerprint       rebuilt {self.rebuilt_fingerprint}, "
            f"published {printable(self.published_fingerprint, limit=64)} ({same})",
            f"rows              published {self.published_rows:,}, rebuilt {self.rebuilt_rows:,}, "
            f"in common {self.common:,}",
            f"identical         {self.identical:,} of {self.published_rows:,} ({self.identical_share:.1%})",
            *_listed("only published", self.only_published_count, self.only_published),
            *_listed("only rebuilt", self.only_rebuilt_count, self.only_rebuilt),
            *(f"difference        {d.render()}" for d in self.differences),
            f"verdict           {self._verdict()}",
        ]  # fmt: skip
        return "\n".join(lines)

    def _verdict(self) -> str:
        if self.full_agreement:
            return "full agreement: every row regenerated token for token"
        if self.published_fingerprint != self.rebuilt_fingerprint:
            return "the rebuilt recipe is not the published one (an override changed a data field?)"
        return "the rebuild differs (a sampled recipe on a non-deterministic server, or another server)"


def _listed(label: str, count: int, ids: Sequence[str]) -> list[str]:
    if not count:
        return []
    more = f" and {count - len(ids):,} more" if count > len(ids) else ""
    shown = ", ".join(printable(i, limit=200) for i in ids)  # a published set's ids: a stranger's text
    return [f"{label:<18}{count:,}: {shown}{more}"]


def compare(
    published: datasets.Dataset, rebuilt: datasets.Dataset, *, max_differences: int = 5, max_ids: int = 5
) -> dict[str, Any]:
    """Counts of a by-id comparison, as keyword arguments of :class:`Comparison` (minus identity).

    Memory: one ``{id: 16-byte hash of input_ids}`` of the published set; the rebuilt set streams
    past it. Differing rows are re-read afterwards, only the first ``max_differences`` of them.
    """
    hashes = dict(row_hashes(published))
    published_rows, common, identical = len(published), 0, 0
    only_rebuilt: list[str] = []
    differing: list[str] = []
    rebuilt_rows = 0
    for row_id, digest in row_hashes(rebuilt):
        rebuilt_rows += 1
        theirs = hashes.pop(row_id, None)
        if theirs is None:
            only_rebuilt.append(row_id)
            continue
        common += 1
        identical += theirs == digest
        if theirs != digest and len(differing) < max_differences:
            differing.append(row_id)
    return {
        "published_rows": published_rows, "rebuilt_rows": rebuilt_rows, "common": common,
        "identical": identical, "only_published": tuple(sorted(hashes)[:max_ids]),
        "only_published_count": len(hashes), "only_rebuilt": tuple(only_rebuilt[:max_ids]),
        "only_rebuilt_count": len(only_rebuilt),
        "differences": first_differences(published, rebuilt, differing),
    }  # fmt: skip


def row_hashes(dataset: datasets.Dataset) -> Iterator[tuple[str, bytes]]:
    """``(id, blake2b-128 of input_ids as little-endian int32)`` of every row, read in Arrow batches."""
    for table in arrow_batches(dataset, ["id", "input_ids"]):
        values, offsets = _flat_ids(table["input_ids"])
        for i, row_id in enumerate(table["id"].to_pylist()):
            data = values[offsets[i] : offsets[i + 1]].tobytes()
            yield row_id, hashlib.blake2b(data, digest_size=16).digest()


def _flat_ids(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    import numpy as np
    import pyarrow as pa

    lists = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    offsets = lists.offsets.to_numpy().astype(np.int64)
    values = lists.values.to_numpy(zero_copy_only=False).astype("<i4", copy=False)
    return values, offsets


def first_differences(
    published: datasets.Dataset, rebuilt: datasets.Dataset, ids: Sequence[str]
) -> tuple[RowDifference, ...]:
    """Where each of the rows ``ids`` first differs between the two sets (ids present in both)."""
    if not ids:
        return ()
    ours, theirs = _rows_by_id(published, ids), _rows_by_id(rebuilt, ids)
    return tuple(_difference(i, ours[i], theirs[i]) for i in ids if i in ours and i in theirs)


def _rows_by_id(dataset: datasets.Dataset, ids: Sequence[str]) -> dict[str, tuple[list[int], int]]:
    """``{id: (input_ids, prompt_len)}`` of the rows ``ids`` (a scan; ``ids`` are few)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    wanted = pa.array(list(ids), pa.string())
    found: dict[str, tuple[list[int], int]] = {}
    for table in arrow_batches(dataset, ["id", "input_ids", "prompt_len"]):
        hits = table.filter(pc.is_in(table["id"], value_set=wanted))
        for row in hits.to_pylist():
            found[row["id"]] = (row["input_ids"], row["prompt_len"])
    return found


def _difference(
    row_id: str, published: tuple[list[int], int], rebuilt: tuple[list[int], int], *, context: int = 8
) -> RowDifference:
    (ours, prompt_len), (theirs, _) = published, rebuilt
    position = next(
        (i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), min(len(ours), len(theirs))
    )
    return RowDifference(
        row_id, position, "prompt" if position < prompt_len else "generated", len(ours), len(theirs),
        tuple(ours[position : position + context]), tuple(theirs[position : position + context]),
    )  # fmt: skip
