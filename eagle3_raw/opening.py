"""Opening a set to look at it (``eagle3-raw inspect``, ``eagle3-raw stats``): a recipe's set as built
in the ``datasets`` cache, or a published one from the Hub, with the tokenizer that made it.

Only public APIs: ``datasets.load_dataset_builder("eagle3_raw", recipe=...)`` and its
``as_dataset`` (which never generates: a recipe that was not built yet is an error saying how to
build it), and ``datasets.load_dataset(org/name, config, revision=..., split="train")``.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3_raw.errors import FatalError, RecipeError
from eagle3_raw.hub.client import hub_api, hub_errors, parse_repo_ref
from eagle3_raw.hub.strangers import choose_config, download_config, load_published_rows, published_configs
from eagle3_raw.hub.untrusted import Trust, confine, pinned_commit, read_stranger_recipe
from eagle3_raw.hub_reach import hub_local_files_only
from eagle3_raw.limits import check_recipe_file, check_yaml_size
from eagle3_raw.recipe import REFERENCE_TOKENIZER, load_recipe, read_yaml
from eagle3_raw.registry import register
from eagle3_raw.resources import builder_scripts_dir, reference_model_dir
from eagle3_raw.run.render import load_tokenizer

if TYPE_CHECKING:
    import datasets
    from huggingface_hub import HfApi
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
    trust_remote_code: bool = False,
    split: str = "train",
) -> OpenedSet:
    """``target`` is a recipe (file or bundled name) or a published ``org/name[@revision]``;
    ``journal_dir``: the journal root a recipe was built with (default: the usual one); ``split``:
    ``train`` or ``validation`` (the split a recipe's ``splits`` holds out).

    A published set is a stranger's: its rows are read once the card names no file outside the
    repo, and the tokenizer its recipe names is loaded under ``reproduce``'s rules
    (:mod:`eagle3_raw.hub.untrusted`): from the repo or the Hub, no code run unless
    ``trust_remote_code`` (the user's ``--trust-remote-code``) and a commit allow it."""
    if _is_recipe(target) or not _HUB_REF.fullmatch(target):
        if config is not None:
            raise FatalError("--config applies to a published set (org/name); a recipe is one config")
        return _built(target, overrides or {}, cache_dir, tokenizer, journal_dir, split)
    if overrides:
        raise FatalError("--set applies to a recipe; a published set is read as it is")
    return _published(target, config, cache_dir, tokenizer, trust_remote_code, split)


def _is_recipe(target: str) -> bool:
    path = Path(target).expanduser()
    bundled = not path.parent.parts and (builder_scripts_dir() / f"{path.name}.yaml").is_file()
    return path.is_file() or bundled or path.suffix in (".yaml", ".yml")  # a missing file: say so


def _built(
    target: str, overrides: Mapping[str, Any], cache_dir: Path | None, tokenizer: str | None,
    journal_dir: Path | None, split: str,
) -> OpenedSet:  # fmt: skip
    import datasets

    recipe = load_recipe(target, overrides)
    if split != "train" and recipe.splits.rule is None:
        raise RecipeError(
            "splits.validation", None,
            f"recipe {recipe.name!r} holds no split out, so its set has only 'train' (--split train)",
        )  # fmt: skip
    register()
    cache = str(cache_dir) if cache_dir is not None else None
    builder = datasets.load_dataset_builder(
        "eagle3_raw", recipe=recipe, cache_dir=cache, journal_dir=journal_dir, progress="none"
    )
    try:
        dataset = builder.as_dataset(split=split)
    except FileNotFoundError as exc:
        raise FatalError(
            f"recipe {recipe.name!r} ({builder.config_id}) is not built in the datasets cache "
            f"{builder.cache_dir}: build it first with `eagle3-raw build {target}` (with the same --set "
            "and --cache-dir)"
        ) from exc
    assert isinstance(dataset, datasets.Dataset)
    shown = f" split {split}" if split != "train" else ""
    return OpenedSet(
        dataset, f"recipe {recipe.name} ({builder.config_id}){shown}", _recipe_tokenizer(recipe, tokenizer)
    )


def _recipe_tokenizer(recipe: Any, override: str | None) -> Callable[[], PreTrainedTokenizerBase]:
    def load() -> PreTrainedTokenizerBase:
        if override is not None:
            return _load_tokenizer(override, None, trust_remote_code=False)

        return load_tokenizer(recipe)

    return load


def _published(
    ref: str, config: str | None, cache_dir: Path | None, tokenizer: str | None, trust_remote_code: bool,
    split: str,
) -> OpenedSet:  # fmt: skip
    """A published set: a stranger's, read as every command reads one (:mod:`eagle3_raw.hub.strangers`)."""
    from huggingface_hub import get_token

    repo_id, revision = parse_repo_ref(ref)
    api = hub_api(get_token())
    with hub_errors(repo_id, "read"):
        commit = str(api.dataset_info(repo_id, revision=revision).sha)
        configs = published_configs(api.list_repo_files(repo_id, repo_type="dataset", revision=commit))
    name = choose_config(repo_id, configs, config) if configs else config
    dataset = load_published_rows(api, repo_id, name, commit, cache_dir, split)
    trust = Trust(trust_remote_code=trust_remote_code, pinned_commit=pinned_commit(revision, commit))

    def load() -> PreTrainedTokenizerBase:
        if tokenizer is not None:
            return _load_tokenizer(tokenizer, None, trust_remote_code=False)
        if name is None or name not in configs:
            raise FatalError(
                f"{repo_id} has no eagle3_raw recipe to say which tokenizer made it: pass --tokenizer"
            )
        return published_tokenizer(api, repo_id, commit, name, trust)

    at = f"@{revision}" if revision else ""
    shown = f" split {split}" if split != "train" else ""
    return OpenedSet(dataset, f"{repo_id}{at} config {dataset.config_name}{shown}", load)


def published_tokenizer(
    api: HfApi, repo_id: str, commit: str, name: str, trust: Trust
) -> PreTrainedTokenizerBase:
    """The tokenizer config ``name``'s published recipe names, loaded as ``reproduce`` would: from
    the download (a folder of the repo) or the Hub, its code run only as ``trust`` allows."""
    with tempfile.TemporaryDirectory(prefix="eagle3_raw-inspect-") as tmp:
        path = download_config(api, repo_id, commit, name, Path(tmp), folders=())
        folder = _tokenizer_folder(path, name)
        if folder is not None:
            download_config(api, repo_id, commit, name, Path(tmp), folders=(folder,))
        return load_tokenizer(read_stranger_recipe(path, trust))


def _tokenizer_folder(path: Path, name: str) -> str | None:
    """Where below ``recipes/<name>/`` the recipe's tokenizer folder is (None: it names none there)."""
    check_recipe_file(path)
    raw = read_yaml(path)
    check_yaml_size(raw, "recipe")
    model = raw.get("model")
    value = model.get("tokenizer") if isinstance(model, Mapping) else None
    if not isinstance(value, str) or not value.startswith(f"{name}/"):
        return None
    confine(path.parent, "model.tokenizer", value, may_be_hub_id=True)  # before any of it is fetched
    return value.removeprefix(f"{name}/")


def _load_tokenizer(name: str, revision: str | None, *, trust_remote_code: bool) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    source = str(reference_model_dir()) if name == REFERENCE_TOKENIZER else name
    local = name == REFERENCE_TOKENIZER or Path(name).is_dir()
    cached = not local and hub_local_files_only("tokenizer", name, revision)
    try:
        tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(
            source, revision=revision, trust_remote_code=trust_remote_code, local_files_only=cached
        )
    except Exception as exc:  # transformers raises many kinds (OSError, ValueError, HTTP errors)
        cause = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
        raise RecipeError("tokenizer", name, f"could not load it ({cause}); pass --tokenizer") from exc
    return tokenizer
