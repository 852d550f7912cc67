"""How well a drafter did, summarized: overall and by group, from rows or from a server's answers.

Each record is one generation (a set's row, or an ``eval`` replay) with its turn, prompt and
output lengths, finish reason, optional category, ``completion_tokens`` and the speculative figures
SGLang returned (:data:`eagle3_raw.rows.SPEC_FIELDS`, None when not measured). A group's figures
are SGLang's own definitions over the group's sums, so a long row weighs as many verify steps as
it took (the way SGLang's server-wide metrics and its benchmarks average):

- acceptance length: generated ids (the bonus id of each step counted) per verify step;
- accept rate: accepted drafts over proposed drafts;
- histogram: verify steps by the number of drafts they accepted.

Groups: ``turn`` (the generation point's message index), ``prompt length`` and ``output length``
(power-of-two buckets), ``category`` (the source's ``prompts.category_column``, when some record
has one) and ``finish reason``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

GROUPS = ("turn", "prompt length", "output length", "category", "finish reason")
"""The groups a summary breaks its records down by, in the order they are shown."""

_SMALLEST_BUCKET = 64


@dataclass(frozen=True)
class Stats:
    """One group's figures (``measured``: its records with figures; the rest have none)."""

    rows: int = 0
    measured: int = 0
    tokens: int = 0
    """Completion tokens of the measured records."""
    verify_steps: int = 0
    correct: int = 0
    proposed: int = 0
    histogram: tuple[int, ...] = ()

    @property
    def accept_length(self) -> float | None:
        """Generated ids per verify step (SGLang's ``spec_accept_length`` over the group)."""
        return self.tokens / self.verify_steps if self.verify_steps else None

    @property
    def accept_rate(self) -> float | None:
        """Accepted over proposed drafts (SGLang's ``spec_accept_rate`` over the group)."""
        return self.correct / self.proposed if self.proposed else None

    def add(self, record: Mapping[str, Any]) -> Stats:
        """These figures with one more record."""
        steps = record.get("spec_verify_ct")
        if steps is None:
            return Stats(self.rows + 1, *self._sums())
        return Stats(
            self.rows + 1,
            self.measured + 1,
            self.tokens + int(record.get("completion_tokens") or 0),
            self.verify_steps + int(steps),
            self.correct + int(record.get("spec_num_correct_drafts") or 0),
            self.proposed + int(record.get("spec_num_proposed_drafts") or 0),
            _added(self.histogram, record.get("spec_correct_drafts_histogram") or ()),
        )

    def _sums(self) -> tuple[int, int, int, int, int, tuple[int, ...]]:
        return self.measured, self.tokens, self.verify_steps, self.correct, self.proposed, self.histogram

    def to_dict(self) -> dict[str, Any]:
        return {
            "rows": self.rows, "measured": self.measured, "tokens": self.tokens,
            "verify_steps": self.verify_steps, "correct_drafts": self.correct,
            "proposed_drafts": self.proposed, "accept_length": self.accept_length,
            "accept_rate": self.accept_rate, "histogram": list(self.histogram),
        }  # fmt: skip


@dataclass(frozen=True)
class Summary:
    """Figures over all records and by group (group -> bucket label -> figures, buckets ordered)."""

    overall: Stats
    groups: Mapping[str, Mapping[str, Stats]] = field(default_factory=dict)

    @property
    def measured(self) -> bool:
        """True when some record carries figures (the server speculated)."""
        return self.overall.measured > 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "overall": self.overall.to_dict(),
            "groups": {
                name: {label: stats.to_dict() for label, stats in buckets.items()}
                for name, buckets in self.groups.items()
            },
        }


def summarize(records: Iterable[Mapping[str, Any]]) -> Summary:
    """The figures of ``records`` (see the module docstring for the keys each one has)."""
    overall = Stats()
    groups: dict[str, dict[Any, Stats]] = {name: {} for name in GROUPS}
    for record in records:
        overall = overall.add(record)
        for name, key in _keys(record).items():
            if key is not None:
                groups[name][key] = groups[name].get(key, Stats()).add(record)
    return Summary(overall, {name: _labelled(name, buckets) for name, buckets in groups.items() if buckets})


def records_of_table(table: pa.Table, categories: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """A set's rows (:func:`eagle3_raw.rows.arrow_schema`) as :func:`summarize` records: the output
    length is the row's ``completion_tokens`` (a merged row's, over its turns), else the ids its
    loss mask covers; ``categories`` maps a source id to its category
    (:func:`eagle3_raw.source.prompts.source_categories`)."""
    columns = table.select(["source_id", "turn", "prompt_len", "finish_reason", "meta"]).to_pydict()
    records = []
    for i, meta in enumerate(columns["meta"]):
        output = meta.get("completion_tokens")
        if output is None:
            output = sum(table["loss_mask"][i].as_py())
        records.append(
            {
                **meta,
                "turn": columns["turn"][i],
                "prompt_len": columns["prompt_len"][i],
                "output_len": output,
                "finish_reason": columns["finish_reason"][i],
                "category": (categories or {}).get(columns["source_id"][i]),
            }
        )
    return records


def length_bucket(length: int) -> int:
    """The power-of-two bucket ``length`` falls in: its lower bound (0 for the first, < 64)."""
    if length < _SMALLEST_BUCKET:
        return 0
    return 1 << (int(length).bit_length() - 1)


def _keys(record: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "turn": record.get("turn"),
        "prompt length": _bucket(record.get("prompt_len")),
        "output length": _bucket(record.get("output_len")),
        "category": record.get("category"),
        "finish reason": record.get("finish_reason"),
    }


def _bucket(length: int | None) -> int | None:
    return None if length is None else length_bucket(length)


def _labelled(name: str, buckets: Mapping[Any, Stats]) -> dict[str, Stats]:
    """Buckets in order (numbers ascending, names by size), keyed by their label."""
    if name in ("turn", "prompt length", "output length"):
        ordered = sorted(buckets.items())
    else:
        ordered = sorted(buckets.items(), key=lambda item: (-item[1].rows, str(item[0])))
    return {_label(name, key): stats for key, stats in ordered}


def _label(name: str, key: Any) -> str:
    if name in ("prompt length", "output length"):
        low = int(key)
        high = (_SMALLEST_BUCKET if low == 0 else low * 2) - 1
        return f"{low}-{high}"
    return str(key)


def _added(histogram: Sequence[int], more: Sequence[int]) -> tuple[int, ...]:
    width = max(len(histogram), len(more))
    return tuple(
        (histogram[k] if k < len(histogram) else 0) + (more[k] if k < len(more) else 0) for k in range(width)
    )
