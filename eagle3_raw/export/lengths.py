"""``max_length``: what cutting rows to a length costs, counted, since the trainers cut silently.

Both trainers truncate every row to their length limit and then drop a row left with no supervised
token, without counting it: SpecForge 0.2.0 (``data.max_length``, default 2048:
``specforge/config/schema.py:140``; ``specforge/data/prompt_builder.py:243-246`` with
``min_loss_tokens`` 1 for EAGLE-3, ``specforge/algorithms/common/defaults.py:18``) and speculators
0.9.0 ``prepare-data`` (``--seq-length``, default 8192: ``speculators/cli/prepare_data.py:95-98``;
``speculators/data_generation/preprocessing.py:390-395``, which logs a warning). An export can do
either on purpose, and reports both choices for the same limit:

- ``truncate``: rows keep their first ``max_length`` ids; a row left with no supervised token is
  dropped (what the trainers would do);
- ``drop``: rows longer than ``max_length`` are left out whole.

Supervised tokens are counted on the mask as exported (with the SpecForge boundary variant, one
more per row). Everything is computed per Arrow batch with numpy; no row becomes a Python list.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import numpy as np

from eagle3_raw.errors import ExportError

if TYPE_CHECKING:
    import pyarrow as pa

Overflow = Literal["truncate", "drop"]
OVERFLOWS: tuple[Overflow, ...] = ("truncate", "drop")
_KEYS = ("truncate_cut", "truncate_dropped", "truncate_lost", "drop_dropped", "drop_lost")


@dataclass(frozen=True)
class Cost:
    """What one choice costs: rows cut short (kept), rows left out, supervised tokens lost."""

    rows_truncated: int
    rows_dropped: int
    supervised_lost: int


@dataclass(frozen=True)
class LengthReport:
    """Both choices at ``max_length``; ``applied`` says which one the export used (None: neither)."""

    max_length: int
    applied: Overflow | None
    rows: int
    supervised_tokens: int
    rows_over: int
    truncate: Cost
    drop: Cost

    def cost(self, overflow: Overflow) -> Cost:
        return self.truncate if overflow == "truncate" else self.drop

    def render(self, limit_name: str = "max_length") -> list[str]:
        """Lines for the terminal: the limit, then each choice with its cost."""
        share = self.supervised_tokens or 1
        lines = [
            f"{limit_name} {self.max_length:,}: {self.rows_over:,} of {self.rows:,} rows are longer"
            + ("" if self.applied else " (reported only; nothing was cut)")
        ]
        for overflow in OVERFLOWS:
            cost = self.cost(overflow)
            mark = "applied " if overflow == self.applied else "would   "
            rows = f"{cost.rows_truncated:,} rows cut, {cost.rows_dropped:,} rows dropped"
            lost = f"{cost.supervised_lost:,} supervised tokens lost ({cost.supervised_lost / share:.2%})"
            lines.append(f"  {mark}{overflow:<9} {rows}, {lost}")
        return lines


@dataclass
class LengthTally:
    """Adds up :class:`LengthReport` over batches (see :func:`measure`)."""

    max_length: int
    rows: int = 0
    supervised: int = 0
    over: int = 0
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_KEYS, 0))

    def add(self, measured: Measured) -> None:
        self.rows += measured.total.size
        self.supervised += int(measured.total.sum())
        self.over += int(measured.over.sum())
        for key, value in measured.costs().items():
            self.counts[key] += value

    def report(self, applied: Overflow | None) -> LengthReport:
        c = self.counts
        return LengthReport(
            self.max_length, applied, self.rows, self.supervised, self.over,
            truncate=Cost(c["truncate_cut"], c["truncate_dropped"], c["truncate_lost"]),
            drop=Cost(0, c["drop_dropped"], c["drop_lost"]),
        )  # fmt: skip


@dataclass(frozen=True)
class Measured:
    """Per row of one batch: supervised tokens in all, within ``max_length``, and whether it is longer."""

    total: np.ndarray
    kept: np.ndarray
    over: np.ndarray

    def costs(self) -> dict[str, int]:
        emptied = self.kept == 0
        return {
            "truncate_cut": int((self.over & ~emptied).sum()),
            "truncate_dropped": int(emptied.sum()),
            "truncate_lost": int((self.total - self.kept).sum()),
            "drop_dropped": int(self.over.sum()),
            "drop_lost": int(self.total[self.over].sum()),
        }


def measure(mask: pa.ChunkedArray | pa.Array, max_length: int) -> Measured:
    """Supervised tokens of each row of ``mask`` (a list column), in all and in its first ``max_length``."""
    values, offsets = flat_values(mask)
    lengths = np.diff(offsets)
    running = np.concatenate([[0], np.cumsum(values, dtype=np.int64)])
    start = offsets[:-1]
    total = running[start + lengths] - running[start]
    kept = running[start + np.minimum(lengths, max_length)] - running[start]
    return Measured(total=total, kept=kept, over=lengths > max_length)


def apply(table: pa.Table, measured: Measured, max_length: int, overflow: Overflow) -> pa.Table:
    """``table`` with its list columns cut to ``max_length`` and the rows ``overflow`` leaves out removed."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if overflow == "drop":
        return table.filter(pa.array(~measured.over))
    for name in ("input_ids", "loss_mask", "generated_mask"):
        if name in table.column_names:
            column = pc.list_slice(table[name], 0, max_length)
            table = table.set_column(table.schema.get_field_index(name), name, column)
    return table.filter(pa.array(measured.kept > 0))


def extend_boundary(mask: pa.ChunkedArray | pa.Array, prompt_len: np.ndarray) -> pa.Array:
    """``mask`` with position ``prompt_len - 1`` set to 1 in every row (the SpecForge 885 variant),
    and the position before every other generated span of a row (a merged rollout's later turns)."""
    import pyarrow as pa

    values, offsets = flat_values(mask)
    original = values
    values = values.copy()
    lengths = np.diff(offsets)
    rows = (prompt_len >= 1) & (prompt_len <= lengths)
    values[offsets[:-1][rows] + prompt_len[rows] - 1] = 1
    starts = np.flatnonzero((original[1:] == 1) & (original[:-1] == 0)) + 1  # a span starts at each
    starts = starts[~np.isin(starts, offsets[:-1])]  # never the first id of a row
    values[starts - 1] = 1
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(values, pa.int8()))


def flat_values(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """A list column's values (numpy) and its row offsets into them, starting at 0."""
    import pyarrow as pa

    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    offsets = np.asarray(array.offsets, dtype=np.int64)
    values = array.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
    flat: np.ndarray = values.to_numpy(zero_copy_only=False)
    return flat, offsets - offsets[0]


def check_max_length(max_length: int | None, overflow: str) -> None:
    """ExportError for a ``max_length`` below 1 or an ``overflow`` other than truncate/drop."""
    if max_length is not None and (isinstance(max_length, bool) or max_length < 1):
        raise ExportError(f"max_length {max_length!r}: expected an integer >= 1")
    if overflow not in OVERFLOWS:
        raise ExportError(f"overflow {overflow!r}: expected one of {', '.join(OVERFLOWS)}")
