"""Opening a set to look at it (``eagle3-raw inspect``, ``eagle3-raw stats``): a recipe's set as built
in the ``datasets`` cache, or a published one from the Hub, with the tokenizer that made it.

Only public APIs: ``datasets.load_dataset_builder("eagle3_raw", recipe=...)`` and its
``as_dataset`` (which never generates: a recipe that was not built yet is an error saying how to
build it), and ``datasets.load_dataset(org/name, config, revision=..., split="train")``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3_raw.errors import FatalError, HubError
from eagle3_raw.recipe import read_yaml

if TYPE_CHECKING:
    import datasets
    from transformers import PreTrainedTokenizerBase

_HUB_REF = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+(@.+)?")


@dataclass(frozen=True)
class OpenedSet:
    """A set, what it is called, and how to get the tokenizer that made it (loaded on demand)."""

    dataset: datasets.Dataset
    label: str
    tokenizer: Callable[[], PreTrainedTokenizerBase]


def open_set(
    target: str,
    *,
    config: str | None = None,
    overrides: Mapping[str, Any] | None = None,
    cache_dir: Path | None = None,
    tokenizer: str | None = None,
    journal_dir: Path | None = None,
) -> OpenedSet:
    """``target`` is a recipe (file or bundled name) or a published ``org/name[@revision]``;
    ``journal_dir``: the journal root a recipe was built with (default: the usual one)."""
    if _is_recipe(target) or not _HUB_REF.fullmatch(target):
        if config is not None:
            raise FatalError("--config applies to a published set (org/name); a recipe is one config")
        return _built(target, overrides or {}, cache_dir, tokenizer, journal_dir)
    if overrides:
        raise FatalError("--set applies to a recipe; a published set is read as it is")
    return _published(target, config, cache_dir, tokenizer)


def _is_recipe(target: str) -> bool:
    from eagle3_raw.resources import builder_scripts_dir

    path = Path(target).expanduser()
    bundled = not path.parent.parts and (builder_scripts_dir() / f"{path.name}.yaml").is_file()
    return path.is_file() or bundled or path.suffix in (".yaml", ".yml")  # a missing file: say so


def _built(
    target: str, overrides: Mapping[str, Any], cache_dir: Path | None, tokenizer: str | None,
    journal_dir: Path | None,
) -> OpenedSet:  # fmt: skip
    import datasets

    from eagle3_raw.recipe import load_recipe
    from eagle3_raw.registry import register

    recipe = load_recipe(target, overrides)
    register()
    cache = str(cache_dir) if cache_dir is not None else None
    builder = datasets.load_dataset_builder(
        "eagle3_raw", recipe=recipe, cache_dir=cache, journal_dir=journal_dir, progress="none"
    )
    try:
        dataset = builder.as_dataset(split="train")
    except FileNotFoundError as exc:
        raise FatalError(
            f"recipe {recipe.name!r} ({builder.config_id}) is not built in the datasets cache "
            f"{builder.cache_dir}: build it first with `eagle3-raw build {target}` (with the same --set "
            "and --cache-dir)"
        ) from exc
    assert isinstance(dataset, datasets.Dataset)
    return OpenedSet(
        dataset, f"recipe {recipe.name} ({builder.config_id})", _recipe_tokenizer(recipe, tokenizer)
    )


def _recipe_tokenizer(recipe: Any, override: str | None) -> Callable[[], PreTrainedTokenizerBase]:
    def load() -> PreTrainedTokenizerBase:
        if override is not None:
            return _load_tokenizer(override, None, trust_remote_code=False)
        from eagle3_raw.render import load_tokenizer

        return load_tokenizer(recipe)

    return load


def _published(ref: str, config: str | None, cache_dir: Path | None, tokenizer: str | None) -> OpenedSet:
    import datasets

    from eagle3_raw.hub.client import hub_errors, parse_repo_ref

    repo_id, revision = parse_repo_ref(ref)
    model = _published_model(repo_id, config, revision)
    with hub_errors(repo_id, "load the rows of"):
        try:
            dataset = datasets.load_dataset(
                repo_id,
                config,
                revision=revision,
                split="train",
                cache_dir=str(cache_dir) if cache_dir else None,
            )
        except ValueError as exc:  # e.g. "Config name is missing", an unknown config
            raise HubError(f"cannot load {repo_id}: {str(exc).splitlines()[0]}") from exc
    assert isinstance(dataset, datasets.Dataset)

    def load() -> PreTrainedTokenizerBase:
        if tokenizer is not None:
            return _load_tokenizer(tokenizer, None, trust_remote_code=False)
        if model is None:
            raise FatalError(
                f"{repo_id} has no eagle3_raw recipe to say which tokenizer made it: pass --tokenizer"
            )
        return _load_tokenizer(str(model.get("tokenizer") or "reference"), model.get("revision"),
                               trust_remote_code=bool(model.get("trust_remote_code")))  # fmt: skip

    at = f"@{revision}" if revision else ""
    return OpenedSet(dataset, f"{repo_id}{at} config {dataset.config_name}", load)


def _published_model(repo_id: str, config: str | None, revision: str | None) -> dict[str, Any] | None:
    """The ``model`` section of the published recipe (None when the repo has no eagle3_raw recipe)."""
    from huggingface_hub import HfApi, hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError

    from eagle3_raw.hub.client import hub_errors
    from eagle3_raw.hub.reproducing import choose_config

    with hub_errors(repo_id, "read"):
        files = HfApi().list_repo_files(repo_id, repo_type="dataset", revision=revision)
        configs = sorted(m[1] for f in files if (m := re.fullmatch(r"recipes/([^/]+)\.yaml", f)))
        if not configs:
            return None
        name = choose_config(repo_id, configs, config)
        try:
            path = hf_hub_download(repo_id, f"recipes/{name}.yaml", repo_type="dataset", revision=revision)
        except EntryNotFoundError:
            return None
    model = read_yaml(Path(path)).get("model") or {}
    return dict(model) if isinstance(model, Mapping) else None


def _load_tokenizer(name: str, revision: str | None, *, trust_remote_code: bool) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    from eagle3_raw.errors import RecipeError
    from eagle3_raw.recipe import REFERENCE_TOKENIZER
    from eagle3_raw.resources import reference_model_dir

    source = str(reference_model_dir()) if name == REFERENCE_TOKENIZER else name
    try:
        tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(
            source, revision=revision, trust_remote_code=trust_remote_code
        )
    except Exception as exc:  # transformers raises many kinds (OSError, ValueError, HTTP errors)
        cause = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
        raise RecipeError("tokenizer", name, f"could not load it ({cause}); pass --tokenizer") from exc
    return tokenizer
