"""One row per generation: the schema of the set, and the row as the run produces it.

``input_ids`` is the prompt ids exactly as sent followed by ``output_ids`` exactly as returned:
nothing is decoded or re-tokenized. ``loss_mask`` is 1 over the generated ids (the stop token
included) and 0 elsewhere; ``spans`` say where the generated ids are (``turn``: the message index
of the generation point, ``start``/``end``: positions in ``input_ids``).

``kind`` says what a row is: ``turn`` (one generation point of the source's history, ``turns: last``
or ``all``), ``rollout`` (one turn of a rollout, its history the target's own earlier turns) or
``merged`` (a whole rollout in one row: the last turn's sequence, which holds every earlier turn
verbatim, with a span per turn; ``turn`` is its last turn). ``mixture`` is the sampling mixture
component the conversation was drawn (its index and what it sets, as JSON), null without one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import datasets
    import numpy as np
    import numpy.typing as npt
    import pyarrow as pa

SPEC_FIELDS = (
    "spec_accept_length",
    "spec_accept_rate",
    "spec_num_correct_drafts",
    "spec_num_proposed_drafts",
    "spec_verify_ct",
    "spec_correct_drafts_histogram",
)
"""The speculative figures of ``meta`` (SGLang's ``meta_info`` names): null unless the server ran a
drafter (the drafter is in the set's target). ``spec_accept_length`` is generated ids per verify
step (the target's bonus id counted), ``spec_accept_rate`` accepted over proposed drafts,
``spec_correct_drafts_histogram[k]`` the verify steps that accepted ``k`` drafts."""

#: Keys of ``meta`` and their Arrow types (see :func:`arrow_schema`; ``list<int32>``: a list of them).
META_FIELDS: Mapping[str, str] = {
    "prompt_tokens": "int32",
    "completion_tokens": "int32",
    "cached_tokens": "int32",
    "e2e_latency": "float64",
    "endpoint": "string",
    "weight_version": "string",
    "max_new_tokens": "int32",
    "attempts": "int32",
    "spec_accept_length": "float64",
    "spec_accept_rate": "float64",
    "spec_num_correct_drafts": "int32",
    "spec_num_proposed_drafts": "int32",
    "spec_verify_ct": "int32",
    "spec_correct_drafts_histogram": "list<int32>",
}


@dataclass(frozen=True, order=True)
class RowKey:
    """Where a row stands in the canonical order: source position, assistant turn, sample."""

    index: int
    turn: int
    sample: int


KINDS = ("turn", "rollout", "merged")


@dataclass(frozen=True)
class Span:
    """Where one turn's generated ids are in a row's ``input_ids`` (``start`` inclusive, ``end`` not)."""

    turn: int
    start: int
    end: int


@dataclass(frozen=True)
class Row:
    """A finished generation (or a merged rollout), as journaled and as stored in the set.

    ``spans`` default to one: the output after the prompt. A merged row's ``prompt_ids`` are its
    last turn's prompt (holding the earlier turns), ``output_ids`` that turn's output.
    """

    key: RowKey
    source_id: str
    prompt_ids: Sequence[int]
    output_ids: Sequence[int]
    finish_reason: str
    sampling_seed: int
    meta: Mapping[str, Any] = field(default_factory=dict)
    kind: str = "turn"
    spans: tuple[Span, ...] = ()
    mixture: Mapping[str, Any] | None = None

    @property
    def id(self) -> str:
        """Stable row id: source id + turn + sample (``merged`` rows: ``<source id>:merged:<sample>``)."""
        if self.kind == "merged":
            return merged_row_id(self.source_id, self.key.sample)
        return row_id(self.source_id, self.key.turn, self.key.sample)

    @property
    def generated(self) -> tuple[Span, ...]:
        """The spans of generated ids (one after the prompt unless given)."""
        n = len(self.prompt_ids)
        return self.spans or (Span(self.key.turn, n, n + len(self.output_ids)),)

    def to_record(self) -> dict[str, Any]:
        """The row in the set's schema (``input_ids``, ``loss_mask``, ``prompt_len``, ...)."""
        input_ids = [*self.prompt_ids, *self.output_ids]
        mask = [0] * len(input_ids)
        for span in self.generated:
            mask[span.start : span.end] = [1] * (span.end - span.start)
        return {
            "id": self.id,
            "source_id": self.source_id,
            "turn": self.key.turn,
            "sample": self.key.sample,
            "input_ids": input_ids,
            "loss_mask": mask,
            "prompt_len": self.generated[0].start,
            "finish_reason": self.finish_reason,
            "sampling_seed": self.sampling_seed,
            "meta": {name: self.meta.get(name) for name in META_FIELDS},
            "kind": self.kind,
            "spans": [{"turn": s.turn, "start": s.start, "end": s.end} for s in self.generated],
            "mixture": dict(self.mixture) if self.mixture is not None else None,
        }


def row_id(source_id: str, turn: int, sample: int) -> str:
    """The id of the row generated for ``source_id``'s assistant turn ``turn``, sample ``sample``."""
    return f"{source_id}:{turn}:{sample}"


def id_hash(source_id: str) -> int:
    """A source id as a non-zero 64-bit hash (0 stands for a row without an id)."""
    return int.from_bytes(hashlib.blake2b(source_id.encode(), digest_size=8).digest(), "little") | 1


@dataclass(frozen=True)
class PassOver:
    """Source rows a resume passes over without reading them (every row key of theirs has an
    outcome: :func:`eagle3_raw.journal.plans.pass_over`), by index; and the hashes of their ids
    (:func:`id_hash`, sorted, with their indices) so that a later row repeating one of those ids is
    still refused as a duplicate."""

    rows: bytearray
    """One byte per source index, 1 for a row passed over (a bytearray: a lookup per row is ~30 ns)."""
    id_hashes: npt.NDArray[np.uint64]
    id_rows: npt.NDArray[np.int64]

    @classmethod
    def nothing(cls) -> PassOver:
        import numpy as np

        return cls(bytearray(), np.empty(0, np.uint64), np.empty(0, np.int64))

    @classmethod
    def of(cls, indices: npt.NDArray[np.int64], hashes: npt.NDArray[np.uint64]) -> PassOver:
        """Rows ``indices`` passed over, ``hashes`` their ids' hashes (0: no id)."""
        import numpy as np

        rows = np.zeros(int(indices.max()) + 1 if len(indices) else 0, np.uint8)
        rows[indices] = 1
        named = hashes != 0
        order = np.lexsort((indices[named], hashes[named]))
        return cls(bytearray(rows.tobytes()), hashes[named][order], indices[named][order])

    def __len__(self) -> int:
        return self.rows.count(1)

    def skips(self, index: int) -> bool:
        return index < len(self.rows) and self.rows[index] == 1

    def first_with_id(self, source_id: str) -> int | None:
        """The first row passed over whose id is ``source_id`` (by hash), or None."""
        import numpy as np

        if not len(self.id_hashes):
            return None
        wanted = np.uint64(id_hash(source_id))
        at = int(np.searchsorted(self.id_hashes, wanted))
        return int(self.id_rows[at]) if at < len(self.id_hashes) and self.id_hashes[at] == wanted else None


def merged_row_id(source_id: str, sample: int) -> str:
    """The id of the merged row of ``source_id``'s rollout ``sample``."""
    return f"{source_id}:merged:{sample}"


def arrow_schema() -> pa.Schema:
    """The Arrow schema of the set (the order of the columns is part of the contract)."""
    import pyarrow as pa

    meta = pa.struct([pa.field(name, _meta_type(kind)) for name, kind in META_FIELDS.items()])
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
            pa.field("kind", pa.string()),
            pa.field("spans", pa.list_(span_type())),
            pa.field("mixture", pa.struct([pa.field("index", pa.int32()), pa.field("choice", pa.string())])),
        ]
    )


def _meta_type(kind: str) -> pa.DataType:
    import pyarrow as pa

    if kind.startswith("list<"):
        return pa.list_(_meta_type(kind.removeprefix("list<").removesuffix(">")))
    return getattr(pa, kind)()


def span_type() -> pa.DataType:
    """The Arrow type of one :class:`Span`."""
    import pyarrow as pa

    return pa.struct([pa.field(name, pa.int32()) for name in ("turn", "start", "end")])


def features() -> datasets.Features:
    """The ``datasets`` features matching :func:`arrow_schema`."""
    import datasets

    return datasets.Features.from_arrow_schema(arrow_schema())
