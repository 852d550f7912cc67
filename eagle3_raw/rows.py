"""One row per generation: the schema of the set, and the row as the run produces it.

``input_ids`` is the prompt ids exactly as sent followed by ``output_ids`` exactly as returned:
nothing is decoded or re-tokenized. ``loss_mask`` is 0 over the prompt and 1 over the generated
ids (the stop token included).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import datasets
    import pyarrow as pa

#: Keys of ``meta`` and their Arrow types (see :func:`arrow_schema`).
META_FIELDS: Mapping[str, str] = {
    "prompt_tokens": "int32",
    "completion_tokens": "int32",
    "cached_tokens": "int32",
    "e2e_latency": "float64",
    "endpoint": "string",
    "weight_version": "string",
    "max_new_tokens": "int32",
    "attempts": "int32",
}


@dataclass(frozen=True, order=True)
class RowKey:
    """Where a row stands in the canonical order: source position, assistant turn, sample."""

    index: int
    turn: int
    sample: int


@dataclass(frozen=True)
class Row:
    """A finished generation, as journaled and as stored in the set."""

    key: RowKey
    source_id: str
    prompt_ids: Sequence[int]
    output_ids: Sequence[int]
    finish_reason: str
    sampling_seed: int
    meta: Mapping[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        """Stable row id: source id + turn + sample."""
        return row_id(self.source_id, self.key.turn, self.key.sample)

    def to_record(self) -> dict[str, Any]:
        """The row in the set's schema (``input_ids``, ``loss_mask``, ``prompt_len``, ...)."""
        prompt_len = len(self.prompt_ids)
        return {
            "id": self.id,
            "source_id": self.source_id,
            "turn": self.key.turn,
            "sample": self.key.sample,
            "input_ids": [*self.prompt_ids, *self.output_ids],
            "loss_mask": [0] * prompt_len + [1] * len(self.output_ids),
            "prompt_len": prompt_len,
            "finish_reason": self.finish_reason,
            "sampling_seed": self.sampling_seed,
            "meta": {name: self.meta.get(name) for name in META_FIELDS},
        }


def row_id(source_id: str, turn: int, sample: int) -> str:
    """The id of the row generated for ``source_id``'s assistant turn ``turn``, sample ``sample``."""
    return f"{source_id}:{turn}:{sample}"


def arrow_schema() -> pa.Schema:
    """The Arrow schema of the set (the order of the columns is part of the contract)."""
    import pyarrow as pa

    meta = pa.struct([pa.field(name, getattr(pa, kind)()) for name, kind in META_FIELDS.items()])
    return pa.schema(
        [
            pa.field("id", pa.string()),
            pa.field("source_id", pa.string()),
            pa.field("turn", pa.int32()),
            pa.field("sample", pa.int32()),
            pa.field("input_ids", pa.list_(pa.int32())),
            pa.field("loss_mask", pa.list_(pa.int8())),
            pa.field("prompt_len", pa.int32()),
            pa.field("finish_reason", pa.string()),
            pa.field("sampling_seed", pa.int64()),
            pa.field("meta", meta),
        ]
    )


def features() -> datasets.Features:
    """The ``datasets`` features matching :func:`arrow_schema`."""
    import datasets

    return datasets.Features.from_arrow_schema(arrow_schema())
