"""The draft-vocabulary files a push publishes beside a config, for trainers to download.

``recipes/<name>/vocab/`` holds ``token_freq.pt`` (every generated id's count, over the whole set),
``draft_vocab.json`` (target vocabulary, totals, coverage, tie-break) and, for each size of the
recipe's ``export.draft_vocab_sizes``, the mapping in every trainer's format:
``vocab_mapping-N.pt`` (SpecForge), ``d2t-N.npy``/``t2d-N.npy`` (speculators), ``d2t-N.pt``
(Model-Optimizer). The push's stale-file cleanup of ``recipes/<name>/`` removes sizes no longer named.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from eagle3_raw.export.layouts import VocabFormat
from eagle3_raw.export.sources import recipe_vocab_size
from eagle3_raw.export.vocab import FrequencyCounter, check_sizes
from eagle3_raw.export.writers import vocab_files, vocab_summary
from eagle3_raw.hub.sets import arrow_batches

if TYPE_CHECKING:
    import datasets

    from eagle3_raw.recipe import Recipe

ALL_FORMATS: tuple[VocabFormat, ...] = ("specforge", "speculators", "modelopt")


@dataclass(frozen=True)
class PublishedVocab:
    """The files (repo path -> bytes) and what ``draft_vocab.json`` says, for the card."""

    folder: str
    files: Mapping[str, bytes]
    summary: Mapping[str, Any]


def vocab_folder(name: str) -> str:
    """Where config ``name``'s vocabulary files go in the dataset repo."""
    return f"recipes/{name}/vocab"


def publish_vocab(recipe: Recipe, dataset: datasets.Dataset) -> PublishedVocab:
    """Count the set's generated ids (one pass in Arrow batches) and make the files to upload."""
    size, origin = recipe_vocab_size(recipe)
    counter = FrequencyCounter(size)
    for table in arrow_batches(dataset, ["id", "input_ids", "loss_mask"]):
        counter.add(table)
    frequencies = counter.result()
    sizes = check_sizes(recipe.export.draft_vocab_sizes, size)
    folder = vocab_folder(recipe.name)
    made = vocab_files(frequencies, sizes, ALL_FORMATS)
    files = {f"{folder}/{name}": content for name, content in made.items()}
    summary = {**vocab_summary(frequencies, sizes), "target_vocab_from": origin}
    return PublishedVocab(folder, files, summary)
