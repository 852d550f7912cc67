"""From journaled outcomes and generations to the set's rows (:mod:`eagle3_raw.rows`).

Each row is a group of (outcome, generation) pairs: one pair for a ``turn`` or ``rollout`` row, every
turn of a rollout for a ``merged`` one. :func:`merged_groups` decides which rollouts become one
row: with ``rollout.merge: auto``, a rollout of two or more turns whose every turn's prompt starts
with the previous turn's whole sequence (``continues`` in the outcome, checked on the ids when the
turn was journaled). Its row is the last turn's sequence, with a span over each turn's output.

Reads no more than it is given: the pairs of one source row at a time.
"""

from __future__ import annotations

import sys
from array import array
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from eagle3_raw.journal.records import Generation, Outcome, native_ints
from eagle3_raw.rows import META_FIELDS, SPEC_FIELDS, Row, RowKey, Span, merged_row_id, row_id

if TYPE_CHECKING:
    import pyarrow as pa

Pair = tuple[Outcome, Generation]
T = TypeVar("T")

_SUMMED = ("completion_tokens", "cached_tokens", "e2e_latency", "attempts")
"""Meta fields a merged row adds up over its turns (the others are its last turn's)."""


def merged_groups(pairs: Iterable[tuple[Outcome, T]]) -> Iterator[list[tuple[Outcome, T]]]:
    """``pairs`` (in key order; only their outcomes are read) as rows: each merged rollout one
    group, every other pair alone; rows in key order (a merged row at its last turn)."""
    current: list[tuple[Outcome, T]] = []
    for pair in pairs:
        if current and pair[0].index != current[0][0].index:
            yield from _source_row(current)
            current = []
        current.append(pair)
    if current:
        yield from _source_row(current)


def _source_row(pairs: list[tuple[Outcome, T]]) -> list[list[tuple[Outcome, T]]]:
    by_sample: dict[int, list[tuple[Outcome, T]]] = {}
    for pair in pairs:
        by_sample.setdefault(pair[0].sample, []).append(pair)
    groups: list[list[tuple[Outcome, T]]] = []
    for turns in by_sample.values():
        merges = len(turns) > 1 and all(o.info.get("continues") is True for o, _ in turns[1:])
        groups.extend([turns] if merges else [[pair] for pair in turns])
    return sorted(groups, key=lambda g: (g[-1][0].turn, g[-1][0].sample))


def rollout_stats(
    outcomes: Sequence[Outcome], failures: Sequence[Mapping[str, Any]], *, merges: bool
) -> dict[str, Any]:
    """What a rollout set holds: ``rollouts`` (conversation samples with a turn), ``source_rows``,
    ``turns`` {turns generated: rollouts}, ``ended`` {reason: rollouts that ended before their last
    turn, by the first word of the reason}, ``rows`` {kind: rows of the set}."""
    turns = Counter((o.index, o.sample) for o in outcomes)
    ended: dict[tuple[int, int], str] = {}
    for failure in failures:
        key = failure["key"]
        if failure["kind"] == "ended":
            ended.setdefault((key.index, key.sample), str(failure["reason"]).split(":", 1)[0])
    groups = merged_groups((o, None) for o in outcomes) if merges else ([(o, None)] for o in outcomes)
    return {
        "rollouts": len(turns),
        "source_rows": len({index for index, _ in turns}),
        "turns": dict(sorted(Counter(turns.values()).items())),
        "ended": dict(Counter(ended.values()).most_common()),
        "rows": dict(Counter("merged" if len(g) > 1 else "rollout" for g in groups)),
    }


def mixture_counts(outcomes: Sequence[Outcome]) -> dict[str, int]:
    """Turns (rows of the journal) drawn each mixture component, by component index."""
    counts = Counter(int(o.info["mixture"]["index"]) for o in outcomes if o.info.get("mixture"))
    return {str(index): count for index, count in sorted(counts.items())}


def spans(group: Sequence[Pair]) -> list[Span]:
    """Where each turn's output is in the group's row (the last turn's sequence)."""
    return [Span(o.turn, g.n_prompt, g.n_prompt + g.n_output) for o, g in group]


def kind(group: Sequence[Pair]) -> str:
    return "merged" if len(group) > 1 else str(group[0][0].info.get("kind", "turn"))


def group_id(group: Sequence[Pair]) -> str:
    outcome = group[-1][0]
    source_id = str(outcome.info["source_id"])
    if len(group) > 1:
        return merged_row_id(source_id, outcome.sample)
    return row_id(source_id, outcome.turn, outcome.sample)


def row_meta(group: Sequence[Pair]) -> dict[str, Any]:
    """The ``meta`` column of a row: the generation's server facts, the ``max_new_tokens`` sent and
    the attempts (summed over a merged row's turns where a sum means something)."""
    metas = [_turn_meta(outcome, generation) for outcome, generation in group]
    meta = dict(metas[-1])
    if len(metas) > 1:
        for name in _SUMMED:
            values = [m.get(name) for m in metas]
            meta[name] = None if None in values else sum(values)
        meta.update(merged_spec(metas))
    return {name: meta.get(name) for name in META_FIELDS}


def merged_spec(metas: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A merged row's speculative figures over its turns: counts and histograms added up, the
    length and rate recomputed from the sums (SGLang's definitions). All null when no turn has
    them (the server ran no drafter); a turn without them had no verify step (one output id) and
    counts its ids with none."""
    measured = [m for m in metas if m.get("spec_verify_ct") is not None]
    if not measured:
        return dict.fromkeys(SPEC_FIELDS)
    steps = sum(m["spec_verify_ct"] for m in measured)
    correct = sum(m.get("spec_num_correct_drafts") or 0 for m in measured)
    proposed = sum(m.get("spec_num_proposed_drafts") or 0 for m in measured)
    histogram: list[int] = []
    for m in measured:
        for k, n in enumerate(m.get("spec_correct_drafts_histogram") or ()):
            histogram.extend([0] * (k + 1 - len(histogram)))
            histogram[k] += n
    tokens = sum(m.get("completion_tokens") or 0 for m in metas)
    return {
        "spec_accept_length": tokens / steps if steps else None,
        "spec_accept_rate": correct / proposed if proposed else None,
        "spec_num_correct_drafts": correct,
        "spec_num_proposed_drafts": proposed,
        "spec_verify_ct": steps,
        "spec_correct_drafts_histogram": histogram or None,
    }


def _turn_meta(outcome: Outcome, generation: Generation) -> dict[str, Any]:
    meta = dict(generation.info.get("meta") or {})
    meta["max_new_tokens"] = (generation.info.get("sampling_params") or {}).get("max_new_tokens")
    meta["attempts"] = outcome.info.get("attempts")
    return meta


def to_row(group: Sequence[Pair]) -> Row:
    first, (last, generation) = group[0][0], group[-1]
    return Row(
        key=RowKey(last.index, last.turn, last.sample),
        source_id=str(last.info["source_id"]),
        prompt_ids=generation.prompt_ids(),
        output_ids=generation.output_ids(),
        finish_reason=str(generation.info["finish_reason"]),
        sampling_seed=int(first.info["sampling_seed"]),
        meta=row_meta(group),
        kind=kind(group),
        spans=tuple(spans(group)) if len(group) > 1 else (),
        mixture=last.info.get("mixture"),
    )


def to_table(groups: list[list[Pair]], schema: pa.Schema) -> pa.Table:
    """``groups`` as one table in ``schema``; the ids of all rows go in as one buffer."""
    import pyarrow as pa

    columns: dict[str, list[Any]] = {
        "id": [group_id(g) for g in groups],
        "source_id": [str(g[-1][0].info["source_id"]) for g in groups],
        "turn": [g[-1][0].turn for g in groups],
        "sample": [g[-1][0].sample for g in groups],
        "prompt_len": [g[0][1].n_prompt for g in groups],
        "finish_reason": [str(g[-1][1].info["finish_reason"]) for g in groups],
        "sampling_seed": [int(g[0][0].info["sampling_seed"]) for g in groups],
        "meta": [row_meta(g) for g in groups],
        "kind": [kind(g) for g in groups],
        "spans": [[{"turn": s.turn, "start": s.start, "end": s.end} for s in spans(g)] for g in groups],
        "mixture": [g[-1][0].info.get("mixture") for g in groups],
    }
    arrays = {name: pa.array(values, schema.field(name).type) for name, values in columns.items()}
    lengths = array("i", [0])
    for group in groups:
        lengths.append(lengths[-1] + len(group[-1][1].ids) // 4)
    offsets = pa.Array.from_buffers(pa.int32(), len(lengths), [None, pa.py_buffer(lengths)])
    ids = b"".join(g[-1][1].ids for g in groups)
    ids = ids if sys.byteorder == "little" else native_ints(ids).tobytes()
    mask = b"".join(_mask(g) for g in groups)
    arrays["input_ids"] = _list_array(offsets, ids, pa.int32())
    arrays["loss_mask"] = _list_array(offsets, mask, pa.int8())
    return pa.Table.from_arrays([arrays[name] for name in schema.names], schema=schema)


def _mask(group: Sequence[Pair]) -> bytes:
    generation = group[-1][1]
    if len(group) == 1:
        return b"\0" * generation.n_prompt + b"\1" * generation.n_output
    mask = bytearray(len(generation.ids) // 4)
    for span in spans(group):
        mask[span.start : span.end] = b"\1" * (span.end - span.start)
    return bytes(mask)


def _list_array(offsets: pa.Array, data: bytes, kind: pa.DataType) -> pa.Array:
    import pyarrow as pa

    values = pa.Array.from_buffers(kind, len(data) // kind.byte_width, [None, pa.py_buffer(data)])
    return pa.ListArray.from_arrays(offsets, values)
