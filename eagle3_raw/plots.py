"""The acceptance plot: a PNG of one or more drafters' figures side by side (matplotlib, optional).

Three panels, one bar per drafter in each group: the share of verify steps by accepted drafts
(the histogram), the acceptance length by output length, and by turn. Used by ``push`` (the
card's picture, one drafter) and ``eagle3-raw eval --plot`` (one or two). matplotlib is the
``plot`` extra; without it :class:`~eagle3_raw.errors.MissingExtra` says how to
install it.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any

from eagle3_raw.acceptance import Stats, Summary
from eagle3_raw.errors import MissingExtra

_PANELS = (("output length", "acceptance length by output length (tokens)"),
           ("turn", "acceptance length by turn"))  # fmt: skip


def acceptance_png(summaries: Mapping[str, Summary], *, title: str) -> bytes:
    """The plot of ``summaries`` (label -> summary, one bar colour each) as PNG bytes."""
    plt = _pyplot()
    figure, axes = plt.subplots(1, 3, figsize=(13, 3.8), dpi=100)
    width = 0.8 / max(1, len(summaries))
    drafts = max((len(s.overall.histogram) for s in summaries.values()), default=0)
    groups = {group: _labels(summaries, group) for group, _ in _PANELS}
    for k, (label, summary) in enumerate(summaries.items()):
        shift = (k - (len(summaries) - 1) / 2) * width
        steps = max(1, sum(summary.overall.histogram))
        shares = [n / steps for n in summary.overall.histogram]
        axes[0].bar([i + shift for i in range(len(shares))], shares, width, label=_legend(label, summary))
        for axis, (group, _) in zip(axes[1:], _PANELS, strict=True):
            buckets = summary.groups.get(group, {})
            values = [_length(buckets.get(bucket)) for bucket in groups[group]]
            axis.bar([i + shift for i in range(len(values))], values, width)
    axes[0].set_xticks(range(drafts))
    axes[0].set_title("share of verify steps by drafts accepted", fontsize=10)
    axes[0].legend(fontsize=8)
    for axis, (group, heading) in zip(axes[1:], _PANELS, strict=True):
        axis.set_xticks(range(len(groups[group])), groups[group], rotation=30, fontsize=8)
        axis.set_title(heading, fontsize=10)
    figure.suptitle(title, fontsize=11)
    figure.tight_layout()
    out = io.BytesIO()
    figure.savefig(out, format="png", metadata={"Software": None})  # no version stamp: same set, same bytes
    plt.close(figure)
    return out.getvalue()


def _labels(summaries: Mapping[str, Summary], group: str) -> list[str]:
    """Every bucket of ``group`` any summary has, in order (by the number each label starts with)."""
    labels = {label for summary in summaries.values() for label in summary.groups.get(group, {})}
    return sorted(labels, key=lambda label: int(label.split("-")[0]))


def _legend(label: str, summary: Summary) -> str:
    length = summary.overall.accept_length
    return f"{label} (length {length:.2f})" if length is not None else label


def _length(stats: Stats | None) -> float:
    return (stats.accept_length if stats is not None else None) or 0.0


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: never a window, never a display
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise MissingExtra("the acceptance plot needs matplotlib: pip install 'eagle3_raw[plot]'") from exc
    return plt
