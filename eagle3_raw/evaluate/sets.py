"""The prompts ``eagle3-raw eval`` replays: a split of a recipe's set as built, and its points.

The set is opened as ``inspect`` and ``stats`` open one (``datasets.load_dataset_builder`` and
``as_dataset``, which never generate: a recipe not built yet is an error saying how to build it).

One :class:`Point` per generation the set holds: for a ``turn`` or ``rollout`` row, its prompt
(``input_ids[:prompt_len]``); for a ``merged`` row (a whole rollout in one row), one point per
span, its prompt every id before the span (the history verbatim, the target's own earlier
turns included), so each turn of a rollout is measured as it was generated. Each point is sent
with the row's ``meta.max_new_tokens`` (what the build sent, fitted to the context; a merged row
keeps its last turn's, so its earlier turns get the recipe's, as the build sent them; the replay
fits each to the server's context again) and the recipe's sampling for the row (its mixture
component's, if drawn), with the row's ``sampling_seed`` (a merged row's column is its first
turn's: each turn gets its own, derived as the build derived it); ``greedy`` sends
``temperature: 0`` instead, the same answer on every server of the same model.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import datasets

from eagle3_raw.errors import FatalError
from eagle3_raw.recipe import Recipe, load_recipe
from eagle3_raw.registry import register
from eagle3_raw.run.mixture import draw
from eagle3_raw.run.plan import derive_seed

if TYPE_CHECKING:
    import pyarrow as pa

COLUMNS = (
    "id", "source_id", "turn", "sample", "input_ids", "prompt_len", "finish_reason", "sampling_seed",
    "meta", "kind", "spans",
)  # fmt: skip
"""The columns a replay reads."""

PREFERRED_SPLIT = "validation"


@dataclass(frozen=True)
class Point:
    """One generation to replay: the prompt ids as the set holds them and the params to send."""

    row_id: str
    source_id: str
    turn: int
    prompt_ids: tuple[int, ...]
    sampling_params: Mapping[str, Any]
    """Complete ``sampling_params``: the recipe's, ``max_new_tokens`` and ``sampling_seed``."""
    category: str | None = None

    @property
    def max_new_tokens(self) -> int:
        return int(self.sampling_params["max_new_tokens"])


@dataclass(frozen=True)
class OpenedSplit:
    """A split of a recipe's built set."""

    dataset: datasets.Dataset
    split: str
    splits: tuple[str, ...]
    """Every split the set has."""
    recipe: Recipe
    label: str
    model: Mapping[str, str]
    """The model that generated the set (:attr:`eagle3_raw.identity.Target.model`)."""


def open_split(
    recipe: str | Path | Mapping[str, Any] | Recipe,
    *,
    split: str | None = None,
    overrides: Mapping[str, Any] | None = None,
    cache_dir: Path | None = None,
    journal_dir: Path | None = None,
) -> OpenedSplit:
    """``split`` of ``recipe``'s set from the ``datasets`` cache (default: ``validation`` when the
    set has one, else ``train``). FatalError when the set is not built (saying how to build it) or
    has no such split (naming those it has). Sends no generation."""
    loaded = load_recipe(recipe, overrides or {})
    register()
    builder = datasets.load_dataset_builder(
        "eagle3_raw", recipe=loaded, cache_dir=str(cache_dir) if cache_dir is not None else None,
        journal_dir=journal_dir, progress="none",
    )  # fmt: skip
    splits = tuple(builder.info.splits or ())
    if not splits:
        raise FatalError(
            f"recipe {loaded.name!r} ({builder.config_id}) is not built in the datasets cache "
            f"{builder.cache_dir}: build it first with `eagle3-raw build {recipe}` (with the same --set "
            "and --cache-dir)"
        )
    chosen = split or (PREFERRED_SPLIT if PREFERRED_SPLIT in splits else "train")
    if chosen not in splits:
        raise FatalError(
            f"recipe {loaded.name!r} ({builder.config_id}) has no split {chosen!r}; it has "
            f"{', '.join(sorted(splits))}"
        )
    dataset = builder.as_dataset(split=chosen)
    assert isinstance(dataset, datasets.Dataset)
    label = f"recipe {loaded.name} ({builder.config_id}), split {chosen}"
    target = builder.config.target
    return OpenedSplit(dataset, chosen, splits, loaded, label, dict(target.model) if target else {})


def table_rows(table: pa.Table) -> Iterator[dict[str, Any]]:
    """The rows of a set's Arrow table as mappings, a batch at a time (the columns a replay reads)."""
    for batch in table.select(list(COLUMNS)).to_batches(max_chunksize=1024):
        yield from batch.to_pylist()


def points(
    rows: Iterable[Mapping[str, Any]],
    recipe: Recipe,
    *,
    greedy: bool = False,
    categories: Mapping[str, str] | None = None,
) -> Iterator[Point]:
    """The replay points of ``rows`` (records in the set's schema), in the set's order, lazily; see
    the module docstring. ``categories``: source id -> the source's category, where it has one."""
    for row in rows:
        category = categories.get(row["source_id"]) if categories else None
        yield from _row_points(row, recipe, greedy=greedy, category=category)


def _row_points(
    row: Mapping[str, Any], recipe: Recipe, *, greedy: bool, category: str | None
) -> Iterator[Point]:
    ids = row["input_ids"]
    spans = row.get("spans") or [{"turn": row["turn"], "start": row["prompt_len"], "end": len(ids)}]
    if row.get("kind") != "merged":
        spans = spans[:1]
    for span in spans:
        sent = dict(row)
        if row.get("kind") == "merged":  # its seed column is its first turn's, its meta its last turn's
            sent["sampling_seed"] = derive_seed(
                recipe.sampling.seed, row["source_id"], span["turn"], row["sample"]
            )
            if span["turn"] != row["turn"]:
                sent["meta"] = {}  # an earlier turn: the recipe's max_new_tokens
        params = _params(sent, recipe, greedy=greedy)
        yield Point(
            row_id=str(row["id"]), source_id=str(row["source_id"]), turn=int(span["turn"]),
            prompt_ids=tuple(ids[: span["start"]]), sampling_params=params, category=category,
        )  # fmt: skip


def _params(row: Mapping[str, Any], recipe: Recipe, *, greedy: bool) -> dict[str, Any]:
    """The recipe's params for ``row`` (its mixture component's), its ``max_new_tokens`` (the
    recipe's when its meta has none) and seed."""
    choice = draw(recipe, row["source_id"], row["sample"])
    params = recipe.sampling.request_params(choice.component if choice is not None else None)
    sent = (row.get("meta") or {}).get("max_new_tokens")
    params["max_new_tokens"] = int(sent) if sent is not None else params["max_new_tokens"]
    if params.get("min_new_tokens", 0) > params["max_new_tokens"]:
        params["min_new_tokens"] = params["max_new_tokens"]  # SGLang refuses min above max
    if greedy:
        params["temperature"] = 0.0
    params["sampling_seed"] = int(row["sampling_seed"])
    return params
