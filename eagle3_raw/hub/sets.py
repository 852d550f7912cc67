"""The set on this machine: building (or reusing) it, and reading it in Arrow batches.

Reading never materializes the ids as Python ints: columns come out as Arrow tables of at most
4096 rows (:func:`arrow_batches`), and :func:`scan_set` keeps only per-row lengths.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from eagle3_raw import card as cards
from eagle3_raw.export.lengths import flat_values

if TYPE_CHECKING:
    import datasets
    import numpy as np
    import pyarrow as pa

_BATCH = 4096


def arrow_batches(dataset: datasets.Dataset, columns: Sequence[str]) -> Iterator[pa.Table]:
    """``columns`` of every row of ``dataset``, as Arrow tables of at most 4096 rows."""
    tables: Iterator[pa.Table] = (
        dataset.select_columns(list(columns)).with_format("arrow").iter(batch_size=_BATCH)
    )
    return tables


@dataclass(frozen=True)
class SetScan:
    """What one pass over a set gives: counts from the rows themselves, and every row's lengths."""

    rows: int
    finish_reasons: Mapping[str, int]
    prompt_lengths: np.ndarray
    total_lengths: np.ndarray
    generated_lengths: np.ndarray
    """Ids under the loss mask (a merged rollout's every turn, not what follows its first prompt)."""

    def length_stats(self) -> dict[str, dict[str, float | int]]:
        return {
            "prompt": cards.length_stats(self.prompt_lengths),
            "generated": cards.length_stats(self.generated_lengths),
            "total": cards.length_stats(self.total_lengths),
        }


def scan_set(dataset: datasets.Dataset) -> SetScan:
    """Lengths and finish reasons of every row, read in Arrow batches (ids are never materialized)."""
    import pyarrow.compute as pc

    prompts: list[np.ndarray] = []
    totals: list[np.ndarray] = []
    generated: list[np.ndarray] = []
    reasons: Counter[str] = Counter()
    for table in arrow_batches(dataset, ["input_ids", "loss_mask", "prompt_len", "finish_reason"]):
        totals.append(pc.list_value_length(table["input_ids"]).to_numpy(zero_copy_only=False))
        prompts.append(table["prompt_len"].to_numpy(zero_copy_only=False))
        generated.append(_masked(*flat_values(table["loss_mask"])))
        reasons.update(table["finish_reason"].to_pylist())
    return SetScan(len(dataset), dict(reasons), _joined(prompts), _joined(totals), _joined(generated))


def _masked(mask: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Per row, how many of its ids are under the mask."""
    import numpy as np

    sums = np.concatenate([[0], np.cumsum(mask, dtype=np.int64)])
    counts: np.ndarray = sums[offsets[1:]] - sums[offsets[:-1]]
    return counts


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    import numpy as np

    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)
