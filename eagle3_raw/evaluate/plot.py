"""``eagle3-raw eval --plot FILE.png``: the report drawn, servers side by side.

One panel for the histogram of accepted drafts per verify step (each server's share of its
steps), then one per group (acceptance length in each bucket). matplotlib is imported only here,
only when a plot is asked for (``pip install 'eagle3_raw[plot]'``), with the Agg backend: no
display is needed.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3_raw.errors import FatalError, LocalFileError
from eagle3_raw.evaluate.report import Report, group_labels, server_names
from eagle3_raw.outputs import describe

if TYPE_CHECKING:
    from matplotlib.axes import Axes


MISSING = "--plot needs matplotlib: pip install 'eagle3_raw[plot]' (or pip install matplotlib)"


def require_matplotlib() -> None:
    """FatalError naming the ``plot`` extra when matplotlib is not installed (nothing imported)."""
    if importlib.util.find_spec("matplotlib") is None:
        raise FatalError(MISSING)


def write_plot(report: Report, path: Path) -> Path:
    """Draw ``report`` into the PNG file ``path`` (FatalError naming the extra without matplotlib;
    LocalFileError when the file cannot be written)."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    groups = group_labels(report)
    panels = 1 + len(groups)
    columns = min(3, panels)
    rows = math.ceil(panels / columns)
    figure, axes = pyplot.subplots(rows, columns, figsize=(5.5 * columns, 3.8 * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    try:
        _histogram(flat[0], report)
        for ax, (group, labels) in zip(flat[1:], groups.items(), strict=False):
            _group(ax, report, group, labels)
        for ax in flat[panels:]:
            ax.set_visible(False)
        figure.suptitle(f"{report.label}: {report.points:,} prompts", fontsize=10)
        figure.tight_layout()
        try:
            figure.savefig(path, format="png", dpi=100)
        except OSError as exc:
            raise LocalFileError(f"cannot write the plot {path}: {describe(exc)}") from exc
    finally:
        pyplot.close(figure)
    return path


def _bars(ax: Axes, report: Report, values: list[list[float]], ticks: list[str]) -> None:
    """Grouped bars: ``values[server][tick]``, one colour per server, a legend naming them."""
    count = max(1, len(values))
    width = 0.8 / count
    for i, (name, row) in enumerate(zip(server_names(report), values, strict=True)):
        url = report.servers[i].url
        ax.bar(
            [t + (i - (count - 1) / 2) * width for t in range(len(row))], row, width, label=f"{name}: {url}"
        )
    ax.set_xticks(range(len(ticks)), ticks, rotation=30 if len(ticks) > 6 else 0, fontsize=8)
    ax.legend(fontsize=7)


def _histogram(ax: Axes, report: Report) -> None:
    width = max((len(s.summary.overall.histogram) for s in report.servers), default=0)
    shares = []
    for server in report.servers:
        histogram = list(server.summary.overall.histogram) + [0] * width
        steps = sum(histogram) or 1
        shares.append([100 * n / steps for n in histogram[:width]])
    _bars(ax, report, shares, [str(k) for k in range(width)])
    ax.set_title("accepted drafts per verify step", fontsize=9)
    ax.set_ylabel("% of verify steps", fontsize=8)


def _group(ax: Axes, report: Report, group: str, labels: list[str]) -> None:
    lengths: list[list[float]] = []
    for server in report.servers:
        buckets: dict[str, Any] = dict(server.summary.groups.get(group, {}))
        lengths.append([_length(buckets.get(label)) for label in labels])
    _bars(ax, report, lengths, [label[:14] for label in labels])
    ax.set_title(f"acceptance length by {group}", fontsize=9)
    ax.set_ylabel("tokens per verify step", fontsize=8)


def _length(stats: Any) -> float:
    value = getattr(stats, "accept_length", None)
    return float(value) if value is not None else 0.0
