"""``eagle3-raw eval --plot FILE.png``: the report drawn with the card's acceptance plot
(:func:`eagle3_raw.plots.acceptance_png`), one bar colour per server.

matplotlib is the ``plot`` extra; :func:`require_matplotlib` says so before anything is sent, so a
long replay never ends in a missing package.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from eagle3_raw.errors import LocalFileError, MissingExtra
from eagle3_raw.evaluate.report import Report, server_names
from eagle3_raw.outputs import describe
from eagle3_raw.plots import acceptance_png

MISSING = "--plot needs matplotlib: pip install 'eagle3_raw[plot]'"


def require_matplotlib() -> None:
    """MissingExtra naming the ``plot`` extra when matplotlib is not installed (nothing imported)."""
    if importlib.util.find_spec("matplotlib") is None:
        raise MissingExtra(MISSING)


def write_plot(report: Report, path: Path) -> Path:
    """Draw ``report`` into the PNG file ``path`` (MissingExtra without matplotlib; LocalFileError
    when the file cannot be written)."""
    summaries = {
        f"{name}: {server.url}": server.summary
        for name, server in zip(server_names(report), report.servers, strict=True)
    }
    png = acceptance_png(summaries, title=f"{report.label}: {report.points:,} prompts")
    try:
        path.write_bytes(png)
    except OSError as exc:
        raise LocalFileError(f"cannot write the plot {path}: {describe(exc)}") from exc
    return path
