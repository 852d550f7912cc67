"""A published set is a stranger's: every road into it reads it the same bounded, confined way.

``reproduce``, ``inspect``, ``stats`` and ``export --hub`` all read a repo somebody else can write.
They go through here, so the rules are the same on every road:

- **the config**: one commit (the revision resolved first), one of its ``recipes/<name>.yaml``;
- **downloads**: a config's files are listed with their sizes first and refused above
  :data:`~eagle3_raw.limits.DOWNLOAD_FILES` files or :data:`~eagle3_raw.limits.DOWNLOAD_BYTES`
  bytes; a published JSON file (manifest, ``draft_vocab.json``) above
  :data:`~eagle3_raw.limits.RECIPE_BYTES` is refused before it is fetched;
- **the recipe** is loaded by :mod:`eagle3_raw.hub.untrusted` (no server, key, launcher or code of
  its own; its files inside the download); a copy kept on disk is marked
  (:func:`eagle3_raw.recipe.mark_kept_copy`) so that ``build`` and ``push`` refuse it;
- **the rows** (and a Hub prompt source's) are loaded by ``datasets`` only once the dataset card's
  ``configs`` are checked to name files of the repo itself: a ``data_files`` or ``data_dir`` that
  is a URL, an absolute path, ``~`` or ``..`` would make ``datasets`` fetch any URL (with the
  user's token, for another repo) or read the user's own files, and is refused, naming it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from eagle3_raw.errors import HubError
from eagle3_raw.hub.client import hub_errors
from eagle3_raw.limits import DOWNLOAD_BYTES, DOWNLOAD_FILES, RECIPE_BYTES, VOCAB_IDS
from eagle3_raw.printable import printable
from eagle3_raw.recipe import mark_kept_copy
from eagle3_raw.source.datafiles import card_problem

if TYPE_CHECKING:
    import datasets
    from huggingface_hub import HfApi

_CONFIG = re.compile(r"recipes/([A-Za-z0-9][\w.-]*)\.yaml")


# --- the config -----------------------------------------------------------------------------------


def resolve_config(api: HfApi, repo_id: str, revision: str | None, config: str | None) -> tuple[str, str]:
    """``(commit, config name)``: the commit ``revision`` is at now and the config to read there."""
    with hub_errors(repo_id, "read"):
        commit = str(api.dataset_info(repo_id, revision=revision).sha)
        files = api.list_repo_files(repo_id, repo_type="dataset", revision=commit)
    return commit, choose_config(repo_id, published_configs(files), config)


def published_configs(files: Iterable[str]) -> list[str]:
    """The eagle3_raw configs among a repo's files (``recipes/<name>.yaml``), sorted."""
    return sorted(m[1] for f in files if (m := _CONFIG.fullmatch(f)))


def choose_config(repo_id: str, configs: Sequence[str], config: str | None) -> str:
    """``config`` if published, the only config when ``config`` is None, else HubError listing them."""
    listed = ", ".join(configs)
    if not configs:
        raise HubError(
            f"{repo_id} has no eagle3_raw recipe (recipes/<config>.yaml): was it pushed by eagle3-raw?"
        )
    if config is None and len(configs) > 1:
        raise HubError(f"{repo_id} has several configs ({listed}); choose one with --config NAME")
    if config is not None and config not in configs:
        raise HubError(f"{repo_id} has no config {printable(config)!r}; it has: {listed}")
    return config or configs[0]


# --- downloads ----------------------------------------------------------------------------------------


def download_config(
    api: HfApi, repo_id: str, commit: str, name: str, local_dir: Path, folders: Sequence[str] = ("",)
) -> Path:
    """Download config ``name``'s recipe and manifest, and the files below ``recipes/<name>/<folder>``
    for each of ``folders`` (``""``: all of them), at ``commit`` into ``local_dir``; the recipe's path.

    The folder holding the copy is marked a stranger's first (``build`` and ``push`` refuse what is
    in it); the files are listed with their sizes and refused above the bounds before any is fetched.
    """
    from huggingface_hub import snapshot_download

    recipes = local_dir / "recipes"
    recipes.mkdir(parents=True, exist_ok=True)
    mark_kept_copy(recipes, f"{repo_id}@{commit}")
    prefixes = [f"recipes/{name}/{folder}".rstrip("/") for folder in folders]
    single = [f"recipes/{name}.yaml", f"recipes/{name}.manifest.json"]
    check_download(repo_id, _sizes(api, repo_id, commit, single, prefixes))
    patterns = [*single, *(f"{prefix}/**" for prefix in prefixes)]
    with hub_errors(repo_id, "download the recipe of"):
        snapshot_download(
            repo_id, repo_type="dataset", revision=commit, local_dir=local_dir, allow_patterns=patterns,
            token=api.token,
        )  # fmt: skip
    return recipes / f"{name}.yaml"


def check_download(repo_id: str, sizes: Iterable[tuple[str, int]]) -> None:
    """HubError when the files to download are more than the bounds allow, naming the biggest."""
    files = total = 0
    biggest = ("", 0)
    for path, size in sizes:
        files, total = files + 1, total + size
        biggest = max(biggest, (path, size), key=lambda item: item[1])
        if files > DOWNLOAD_FILES or total > DOWNLOAD_BYTES:
            raise HubError(
                f"{repo_id}: refusing to download more than {DOWNLOAD_FILES:,} files or {DOWNLOAD_BYTES:,} "
                f"bytes for one config (the biggest so far: {printable(biggest[0])}, {biggest[1]:,} bytes)"
            )


def _sizes(
    api: HfApi, repo_id: str, commit: str, single: Sequence[str], prefixes: Sequence[str]
) -> Iterator[tuple[str, int]]:
    from huggingface_hub.errors import EntryNotFoundError

    with hub_errors(repo_id, "list the recipe files of"):
        for info in api.get_paths_info(repo_id, list(single), revision=commit, repo_type="dataset"):
            yield info.path, int(getattr(info, "size", 0) or 0)
        for prefix in prefixes:
            try:
                for entry in api.list_repo_tree(
                    repo_id, prefix, recursive=True, revision=commit, repo_type="dataset"
                ):
                    yield entry.path, int(getattr(entry, "size", 0) or 0)
            except EntryNotFoundError:
                continue  # nothing published there


def published_json(api: HfApi, repo_id: str, commit: str, path: str) -> dict[str, Any] | None:
    """A JSON object published at ``path`` (None when absent); HubError when it is larger than
    :data:`~eagle3_raw.limits.RECIPE_BYTES` (checked before it is fetched) or not a JSON object."""
    from huggingface_hub import hf_hub_download

    with hub_errors(repo_id, f"read {path} of"):
        found = list(api.get_paths_info(repo_id, [path], revision=commit, repo_type="dataset"))
        if not found:
            return None
        size = int(getattr(found[0], "size", 0) or 0)
        if size > RECIPE_BYTES:
            raise HubError(f"{repo_id}: {path} is {size:,} bytes; at most {RECIPE_BYTES:,} are read")
        local = Path(hf_hub_download(repo_id, path, repo_type="dataset", revision=commit, token=api.token))
    try:
        data = orjson.loads(local.read_bytes()[: RECIPE_BYTES + 1])
    except orjson.JSONDecodeError as exc:
        raise HubError(f"{repo_id}: {path} is not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise HubError(f"{repo_id}: {path} is not a JSON object")
    return data


def published_vocab_size(value: Any, where: str) -> int:
    """A vocabulary size a stranger published: a positive int of at most
    :data:`~eagle3_raw.limits.VOCAB_IDS` (an array of that many entries is made from it)."""
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= VOCAB_IDS:
        raise HubError(
            f"{where} gives a vocabulary of {printable(repr(value), limit=40)} ids; expected 1 to "
            f"{VOCAB_IDS:,} (pass --target-vocab-size to give it yourself)"
        )
    return value


# --- the rows ----------------------------------------------------------------------------------------


def load_published_rows(
    api: HfApi, repo_id: str, name: str | None, commit: str, cache_dir: Path | str | None,
    split: str = "train",
) -> datasets.Dataset:  # fmt: skip
    """Config ``name``'s published rows of ``split`` at ``commit`` (the card's ``configs`` checked
    first; None: the repo's only or default config)."""
    import datasets

    check_data_files(api, repo_id, commit)
    try:
        dataset = _load_rows(api, repo_id, name, commit, cache_dir, split)
    except HubError:
        raise
    except Exception as exc:  # a stranger's files: corrupt Parquet, a schema datasets refuses, ...
        cause = f"{type(exc).__name__}: {_first_line(exc)}"
        raise HubError(f"cannot load the published rows of {repo_id}: {cause}") from exc
    if not isinstance(dataset, datasets.Dataset):
        kind = type(dataset).__name__
        raise HubError(f"{repo_id}: expected one split, got {kind}")
    check_row_columns(repo_id, dataset)
    return dataset


def _load_rows(
    api: HfApi, repo_id: str, name: str | None, commit: str, cache_dir: Path | str | None, split: str
) -> Any:
    import datasets

    with hub_errors(repo_id, "load the published rows of"):  # the Hub's own errors, named
        try:
            return datasets.load_dataset(
                repo_id, name, revision=commit, split=split, token=api.token,
                cache_dir=str(cache_dir) if cache_dir is not None else None,
            )  # fmt: skip
        except ValueError as exc:  # e.g. an unknown config, a split that is not there
            raise HubError(f"cannot load {repo_id}: {_first_line(exc)}") from exc


_ROW_COLUMNS = {
    "id": "string", "source_id": "string", "turn": "integer", "sample": "integer",
    "input_ids": "list of integers", "loss_mask": "list of integers", "prompt_len": "integer",
    "finish_reason": "string", "sampling_seed": "integer",
}  # fmt: skip
"""The columns every command reads from a set, and the kind of Arrow type each must have."""


def check_row_columns(repo_id: str, dataset: datasets.Dataset) -> None:
    """HubError unless ``dataset`` has eagle3_raw's row columns, each of its kind (so that no
    command fails on a published set with a raw traceback), naming the first one that is not."""
    import pyarrow as pa

    schema = dataset.data.schema
    kinds = {
        "string": lambda t: pa.types.is_string(t) or pa.types.is_large_string(t),
        "integer": pa.types.is_integer,
        "list of integers": lambda t: pa.types.is_list(t) and pa.types.is_integer(t.value_type),
    }
    for name, kind in _ROW_COLUMNS.items():
        index = schema.get_field_index(name)
        if index < 0 or not kinds[kind](schema.field(index).type):
            got = "missing" if index < 0 else f"of type {schema.field(index).type}"
            raise HubError(
                f"{repo_id} is not an eagle3_raw set: its column {name!r} is {got}, expected a {kind}"
            )
        if dataset.data.column(name).null_count:  # a card declaring a column its files lack
            raise HubError(f"{repo_id} is not an eagle3_raw set: its column {name!r} has null values")


def check_data_files(api: HfApi, repo_id: str, revision: str | None) -> None:
    """HubError unless every ``data_files`` and ``data_dir`` of the card's ``configs`` is a path
    inside the repo (:func:`eagle3_raw.source.datafiles.card_problem`)."""
    with hub_errors(repo_id, "read the dataset card of"):
        problem = card_problem(api, repo_id, revision)
    if problem is not None:
        raise HubError(f"{repo_id}: {problem}")


def _first_line(exc: BaseException) -> str:
    return printable((str(exc).strip().splitlines() or [type(exc).__name__])[0], limit=300)
