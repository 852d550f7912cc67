"""The set on this machine: building (or reusing) it, and reading it in Arrow batches.

Reading never materializes the ids as Python ints: columns come out as Arrow tables of at most
4096 rows (:func:`arrow_batches`), and :func:`scan_set` keeps only per-row lengths.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3_raw import card as cards
from eagle3_raw.recipe import Recipe

if TYPE_CHECKING:
    import datasets
    import numpy as np
    import pyarrow as pa

_BATCH = 4096


@dataclass(frozen=True)
class Built:
    """A built set, where its journal is, and whether this call generated it."""

    dataset: datasets.Dataset
    journal_dir: Path
    generated: bool


def build(
    recipe: Recipe, *, cache_dir: Path | None = None, run_options: Mapping[str, Any] | None = None
) -> Built:
    """Build ``recipe``'s set, or reuse it from the ``datasets`` cache (then no request is sent).

    ``run_options`` are the builder's run options (``journal_dir``, ``progress``, ...).
    """
    import datasets

    from eagle3_raw.builder import our_errors
    from eagle3_raw.registry import register
    from eagle3_raw.run import journal_dir_for

    register()
    options = dict(run_options or {})
    builder = datasets.load_dataset_builder(
        "eagle3_raw", recipe=recipe, cache_dir=str(cache_dir) if cache_dir else None, **options
    )
    with our_errors():
        builder.download_and_prepare()
    dataset = builder.as_dataset(split="train")
    result = builder.run_result
    journal = (
        result.journal_dir if result is not None else journal_dir_for(recipe, options.get("journal_dir"))
    )
    return Built(dataset, Path(journal), result is not None)


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

    @property
    def generated_lengths(self) -> np.ndarray:
        generated: np.ndarray = self.total_lengths - self.prompt_lengths
        return generated

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
    reasons: Counter[str] = Counter()
    for table in arrow_batches(dataset, ["input_ids", "prompt_len", "finish_reason"]):
        totals.append(pc.list_value_length(table["input_ids"]).to_numpy(zero_copy_only=False))
        prompts.append(table["prompt_len"].to_numpy(zero_copy_only=False))
        reasons.update(table["finish_reason"].to_pylist())
    return SetScan(len(dataset), dict(reasons), _joined(prompts), _joined(totals))


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    import numpy as np

    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)
