"""What a push publishes about acceptance: the summary in the manifest, the plot beside it.

Only a set whose server speculated has figures (rows' ``meta.spec_*``); for the others nothing is
added. The plot needs matplotlib (the ``plot`` extra): without it the push goes on, the card says
how to get the picture, and the manifest's ``plot`` is null.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import datasets

from eagle3_raw.acceptance import Summary, records_of_table, summarize
from eagle3_raw.errors import MissingExtra
from eagle3_raw.hub.sets import arrow_batches
from eagle3_raw.plots import acceptance_png
from eagle3_raw.recipe import Recipe
from eagle3_raw.source.prompts import source_categories

_log = logging.getLogger("eagle3_raw")

_COLUMNS = ("source_id", "turn", "prompt_len", "finish_reason", "meta", "loss_mask")


@dataclass(frozen=True)
class PublishedAcceptance:
    """The manifest's ``acceptance`` (None: the server did not speculate) and the files to upload."""

    manifest: Mapping[str, Any] | None = None
    files: Mapping[str, bytes] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()


def plot_path(name: str) -> str:
    """The acceptance plot's path in the repo (beside the recipe; relative links resolve on the Hub)."""
    return f"recipes/{name}.acceptance.png"


def set_summary(dataset: datasets.Dataset, recipe: Recipe) -> Summary:
    """The acceptance summary of a set's rows, grouped by the recipe's category column if it has one."""
    categories = source_categories(recipe)
    records = (r for table in arrow_batches(dataset, _COLUMNS) for r in records_of_table(table, categories))
    return summarize(records)


def publish_acceptance(
    dataset: datasets.Dataset, recipe: Recipe, drafter: Mapping[str, Any] | None
) -> PublishedAcceptance:
    """The acceptance facts a push of ``dataset`` publishes (nothing when no row has figures)."""
    summary = set_summary(dataset, recipe)
    if not summary.measured:
        return PublishedAcceptance()
    label = str((drafter or {}).get("speculative_draft_model_path") or "drafter")
    try:
        png = acceptance_png({label: summary}, title=f"{recipe.name}: acceptance of {label}")
    except MissingExtra as exc:
        _log.warning("%s; the card shows the acceptance tables without the plot", exc)
        return PublishedAcceptance({"summary": summary.to_dict(), "plot": None}, {}, (str(exc),))
    path = plot_path(recipe.name)
    return PublishedAcceptance({"summary": summary.to_dict(), "plot": path}, {path: png})
