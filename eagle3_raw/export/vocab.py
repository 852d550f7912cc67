"""Draft vocabularies: how often each id was generated, the ids a draft of size N keeps, d2t and t2d.

**Frequencies** count the generated ids only (``loss_mask == 1`` of the set, the stop token
included), over the rows as exported (after ``max_length``), as speculators' ``prepare-data
--no-skip-token-freq`` (``speculators/train/vocab_mapping.py:44-52``) and SpecForge's
``generate_vocab_mapping_file`` (``specforge/data/preprocessing.py:615-625``) count them.

**Selection** (the tie-break is part of the contract): the ``N`` ids with the highest count, an id
with the same count as another kept before it when it is smaller; when fewer than ``N`` ids were
generated, the smallest ungenerated ids fill the rest. This is speculators 0.9.0's rule
(``build_vocab_mappings_from_distribution``, ``speculators/train/vocab_mapping.py:81-96``). SpecForge
0.2.0's ``process_token_dict_to_mappings`` (``specforge/data/preprocessing.py:720-768``) breaks ties
by the order ids were first seen (``Counter.most_common``), so its own mapping can differ from this
one among ids of equal count; both trainers accept either.

**Mappings**, for the ``N`` kept ids in ascending order ``s``: ``d2t[i] = s[i] - i`` (int64, ``N``
entries; a draft id ``i`` is target id ``i + d2t[i]``) and ``t2d[t] = t in s`` (bool, one entry per
target id, exactly ``N`` true). The target vocabulary is the target model's ``config.json``
``vocab_size`` (the draft's ``t2d`` buffer has that length: ``specforge/modeling/draft/
llama3_eagle.py:1696``, ``speculators/model.py:45-53``), which can exceed ``len(tokenizer)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from eagle3_raw.errors import ExportError
from eagle3_raw.export.lengths import flat_values
from eagle3_raw.limits import VOCAB_IDS

if TYPE_CHECKING:
    import pyarrow as pa

#: Draft sizes the card and the export report show coverage for (SpecForge's default is 32000).
COMMON_SIZES = (1024, 2048, 4096, 8192, 16384, 32000, 65536)


@dataclass(frozen=True)
class TokenFrequencies:
    """``counts[t]``: how many times target id ``t`` was generated; one entry per target id."""

    counts: np.ndarray

    @property
    def vocab_size(self) -> int:
        return int(self.counts.shape[0])

    @property
    def total(self) -> int:
        """Generated tokens counted."""
        return int(self.counts.sum())

    @property
    def distinct(self) -> int:
        """Distinct ids generated at least once."""
        return int(np.count_nonzero(self.counts))

    def as_dict(self) -> dict[int, int]:
        """``{id: count}`` of the generated ids, in id order (speculators' ``token_freq.pt`` content)."""
        ids = np.flatnonzero(self.counts)
        return dict(zip(ids.tolist(), self.counts[ids].tolist(), strict=True))

    def select(self, size: int) -> np.ndarray:
        """The ``size`` ids a draft vocabulary keeps (see the module docs), ascending, int64."""
        if not 1 <= size <= self.vocab_size:
            raise ExportError(f"draft vocabulary size {size}: expected 1..{self.vocab_size} (the target's)")
        order = np.argsort(-self.counts, kind="stable")  # stable: equal counts stay in id order
        return np.sort(order[:size]).astype(np.int64)

    def coverage(self, size: int) -> float:
        """Share of the generated tokens whose id a draft vocabulary of ``size`` keeps (1.0 when none)."""
        if self.total == 0:
            return 1.0
        return float(self.counts[self.select(size)].sum() / self.total)

    def coverage_table(self, sizes: Iterable[int] = COMMON_SIZES) -> list[tuple[int, float]]:
        """``(size, coverage)`` for the sizes smaller than the target vocabulary."""
        return [(size, self.coverage(size)) for size in sizes if size < self.vocab_size]


@dataclass(frozen=True)
class DraftMapping:
    """``d2t``/``t2d`` of one draft vocabulary size (see the module docs)."""

    d2t: np.ndarray
    t2d: np.ndarray

    @property
    def size(self) -> int:
        return int(self.d2t.shape[0])


def mapping(frequencies: TokenFrequencies, size: int) -> DraftMapping:
    """The draft vocabulary of ``size`` ids as SpecForge's and speculators' ``d2t``/``t2d``."""
    selected = frequencies.select(size)
    t2d = np.zeros(frequencies.vocab_size, dtype=np.bool_)
    t2d[selected] = True
    return DraftMapping(d2t=selected - np.arange(size, dtype=np.int64), t2d=t2d)


class FrequencyCounter:
    """Counts generated ids batch by batch (Arrow tables with ``id``, ``input_ids``, ``loss_mask``)."""

    def __init__(self, vocab_size: int) -> None:
        if not 1 <= vocab_size <= VOCAB_IDS:
            raise ExportError(
                f"target vocabulary of {vocab_size:,} ids: expected 1 to {VOCAB_IDS:,} (the largest models "
                "have about 260,000; t2d has one entry per id)"
            )
        self._counts = np.zeros(vocab_size, dtype=np.int64)

    def add(self, table: pa.Table, mask_column: str = "loss_mask") -> None:
        """Count ``table``'s ``input_ids`` where its ``mask_column`` is 1."""
        ids, _ = flat_values(table["input_ids"])
        mask, _ = flat_values(table[mask_column])
        picked = ids[mask == 1]
        if picked.size and (picked.min() < 0 or picked.max() >= self._counts.shape[0]):
            raise ExportError(_out_of_vocab(table, self._counts.shape[0]))
        self._counts += np.bincount(picked, minlength=self._counts.shape[0])

    def result(self) -> TokenFrequencies:
        return TokenFrequencies(self._counts.copy())


def _out_of_vocab(table: pa.Table, vocab_size: int) -> str:
    for row_id, ids in zip(table["id"].to_pylist(), table["input_ids"].to_pylist(), strict=True):
        bad = next((t for t in ids if not 0 <= t < vocab_size), None)
        if bad is not None:
            return (
                f"row {row_id!r} has token id {bad}, outside the target vocabulary (0..{vocab_size - 1}); "
                "pass the target model's vocab_size (target_vocab_size / --target-vocab-size)"
            )
    raise AssertionError("unreachable")


def check_sizes(sizes: Sequence[int], vocab_size: int) -> tuple[int, ...]:
    """``sizes`` sorted and unique; ExportError for a size outside ``1..vocab_size``."""
    for size in sizes:
        if not 1 <= size <= vocab_size:
            raise ExportError(f"draft vocabulary size {size}: expected 1..{vocab_size} (the target's)")
    return tuple(sorted(set(sizes)))
