"""Where an export's rows come from: a recipe's set (built or reused) or a published set, and the
size of the target vocabulary its ``t2d`` must have.

A recipe's set comes through :func:`eagle3_raw.load` (the ``datasets`` cache; built first if it is
not there); a published one through ``datasets.load_dataset(repo, config, revision=...)``. The target
vocabulary is, in this order: the size given; the target model's ``config.json`` (``text_config``
for multimodal models, ``padded_vocab_size`` before ``vocab_size``, as SpecForge reads it:
``specforge/modeling/target/target_utils.py:70-74``); for a published set the size its pushed
``draft_vocab.json`` records, else its manifest's tokenizer size; last, ``len(tokenizer)``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3_raw.builder import load_set
from eagle3_raw.errors import ExportError
from eagle3_raw.hub.client import hub_api, parse_repo_ref
from eagle3_raw.hub.strangers import load_published_rows, published_json, published_vocab_size, resolve_config
from eagle3_raw.recipe import load_recipe, tokenizer_path
from eagle3_raw.run.render import Renderer
from eagle3_raw.splits import VALIDATION

if TYPE_CHECKING:
    import datasets

    from eagle3_raw.recipe import Recipe


@dataclass(frozen=True)
class Source:
    """The rows to export and what names them."""

    dataset: datasets.Dataset
    name: str
    target_vocab_size: int
    vocab_from: str
    draft_vocab_sizes: tuple[int, ...] = ()
    repo_id: str | None = None
    revision: str | None = None
    validation: datasets.Dataset | None = None
    """The held-out split (a recipe's ``splits``), or None."""

    @property
    def label(self) -> str:
        if self.repo_id is None:
            return f"recipe {self.name}"
        return f"{self.repo_id}@{self.revision} config {self.name}"


def from_recipe(
    recipe: Any,
    *,
    overrides: Mapping[str, Any] | Sequence[str] | None,
    cache_dir: Path | None,
    run_options: Mapping[str, Any] | None,
    target_vocab_size: int | None,
) -> Source:
    """The recipe's set (built or reused, as :func:`eagle3_raw.load` does)."""
    loaded = load_recipe(recipe, overrides)
    options = dict(run_options or {})
    cache = str(cache_dir) if cache_dir else None
    dataset = load_set(loaded, cache_dir=cache, **options)
    validation = (
        load_set(loaded, VALIDATION, cache_dir=cache, **options) if loaded.splits.rule is not None else None
    )
    size, origin = (target_vocab_size, "given") if target_vocab_size else recipe_vocab_size(loaded)
    return Source(dataset, loaded.name, size, origin, loaded.export.draft_vocab_sizes, validation=validation)


def recipe_vocab_size(recipe: Recipe) -> tuple[int, str]:
    """The target vocabulary of ``recipe``'s model, and where the number came from."""
    config = _model_config(recipe)
    size = config_vocab_size(config) if config is not None else None
    if size is not None:
        return size, "the target model's config.json"

    return Renderer(recipe).vocab_size, "len(tokenizer) (the model has no config.json)"


def config_vocab_size(config: Mapping[str, Any]) -> int | None:
    """``padded_vocab_size`` or ``vocab_size`` of a model config (its ``text_config`` if it has one)."""
    text = config.get("text_config") if isinstance(config.get("text_config"), Mapping) else config
    assert isinstance(text, Mapping)
    value = text.get("padded_vocab_size") or text.get("vocab_size")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _model_config(recipe: Recipe) -> dict[str, Any] | None:
    local = tokenizer_path(recipe)
    path = local / "config.json" if local is not None else _hub_file(recipe)
    if path is None or not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else None


def _hub_file(recipe: Recipe) -> Path | None:
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download(recipe.model.tokenizer, "config.json", revision=recipe.model.revision))
    except Exception:  # best effort: a model without a config.json falls back to len(tokenizer)
        return None


def from_hub(
    ref: str, *, config: str | None, token: str | None, cache_dir: Path | None, target_vocab_size: int | None
) -> Source:
    """A published set at one commit (``ref`` is ``org/name[@revision]``), read as every command
    reads a stranger's set (:mod:`eagle3_raw.hub.strangers`: the card's data files inside the repo,
    the published JSON files and vocabulary size bounded)."""
    repo_id, revision = parse_repo_ref(ref)
    api = hub_api(token)
    commit, name = resolve_config(api, repo_id, revision, config)
    dataset = load_published_rows(api, repo_id, name, commit, cache_dir)
    validation = _published_validation(api, repo_id, commit, name, cache_dir)
    given = (target_vocab_size, "given") if target_vocab_size else None
    size, origin = given or _published_vocab(api, repo_id, commit, name)
    return Source(
        dataset, name, size, origin, repo_id=repo_id, revision=revision or commit, validation=validation
    )


def _published_validation(
    api: Any, repo_id: str, commit: str, name: str, cache_dir: Path | None
) -> datasets.Dataset | None:
    """The published held-out split, when the config's manifest says it has one."""
    manifest = published_json(api, repo_id, commit, f"recipes/{name}.manifest.json") or {}
    splits = manifest.get("splits")
    if not isinstance(splits, Mapping) or not isinstance(splits.get(VALIDATION), Mapping):
        return None
    return load_published_rows(api, repo_id, name, commit, cache_dir, VALIDATION)


def _published_vocab(api: Any, repo_id: str, commit: str, name: str) -> tuple[int, str]:
    path = f"recipes/{name}/vocab/draft_vocab.json"
    summary = published_json(api, repo_id, commit, path)
    if summary and summary.get("target_vocab_size") is not None:
        where = f"{repo_id}: {path}"
        return published_vocab_size(summary["target_vocab_size"], where), "the published draft_vocab.json"
    path = f"recipes/{name}.manifest.json"
    manifest = published_json(api, repo_id, commit, path) or {}
    tokenizer = manifest.get("tokenizer")
    size = tokenizer.get("vocab_size") if isinstance(tokenizer, Mapping) else None
    if size is None:
        raise ExportError(f"{repo_id} config {name}: no vocabulary size published; pass target_vocab_size")
    size = int(size) if isinstance(size, str) and size.isdigit() and len(size) < 12 else size
    return (
        published_vocab_size(size, f"{repo_id}: {path}"),
        "the published manifest (len(tokenizer); pass target_vocab_size if the model pads it)",
    )
