"""What a Hub dataset's card can make ``datasets`` read: only files of the repo itself.

``datasets.load_dataset(org/name)`` reads the ``configs`` of the repo's dataset card (the YAML
front matter of ``README.md``) and fetches every ``data_files`` pattern and ``data_dir`` there. A
pattern that is a URL (``https://...``, ``hf://datasets/other/repo``, ``simplecache::...``) makes it
send requests anywhere (with the user's token, for another repo); an absolute path, ``~`` or ``..``
makes it read the user's own files into the rows. A repo somebody else can write is checked first:
:func:`card_problem` says what is wrong, or None. The card is read within bounds
(:data:`~eagle3_raw.limits.CARD_BYTES`, its YAML :data:`~eagle3_raw.limits.YAML_NODES` values).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

import yaml

from eagle3_raw.errors import RecipeError
from eagle3_raw.limits import CARD_BYTES, check_yaml_size
from eagle3_raw.printable import printable

if TYPE_CHECKING:
    from huggingface_hub import HfApi

_FRONT_MATTER = re.compile(r"\A\s*---[ \t]*\r?\n(.*?)\r?\n---[ \t]*(\r?\n|\Z)", re.DOTALL)


def card_problem(api: HfApi, repo_id: str, revision: str | None) -> str | None:
    """What is wrong with dataset ``repo_id``'s card at ``revision`` (too big, bad YAML, a data
    file outside the repo), or None. The Hub client's errors are raised as they are."""
    from huggingface_hub import hf_hub_download

    found = list(api.get_paths_info(repo_id, ["README.md"], revision=revision, repo_type="dataset"))
    if not found:
        return None
    size = int(getattr(found[0], "size", 0) or 0)
    if size > CARD_BYTES:
        return f"its README.md is {size:,} bytes; at most {CARD_BYTES:,} are read"
    path = hf_hub_download(repo_id, "README.md", repo_type="dataset", revision=revision, token=api.token)
    return metadata_problem(Path(path).read_bytes()[:CARD_BYTES].decode("utf-8", errors="replace"))


def metadata_problem(card: str) -> str | None:
    """What is wrong with a card's metadata (see :func:`card_problem`), or None."""
    match = _FRONT_MATTER.match(card)
    if match is None:
        return None
    try:
        metadata = yaml.safe_load(match[1])
        check_yaml_size(metadata, "README.md metadata")
    except yaml.YAMLError:
        return "its README.md metadata is not valid YAML"
    except RecipeError as exc:
        return f"its README.md metadata {exc.allowed}"
    if not isinstance(metadata, Mapping):
        return None
    for config, value in data_paths(metadata):
        problem = outside_repo(value)
        if problem is not None:
            return (
                f"its dataset card's config {printable(config, limit=100)!r} names data file "
                f"{printable(value, limit=200)!r}, {problem}; refused: a Hub dataset's files are read "
                "from its own repo only"
            )
    return None


def data_paths(metadata: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """``(config name, path or pattern)`` of every ``data_files`` and ``data_dir`` of ``configs``."""
    configs = metadata.get("configs")
    for config in configs if isinstance(configs, list) else []:
        if not isinstance(config, Mapping):
            continue
        name = str(config.get("config_name", "default"))
        for value in (config.get("data_dir"), config.get("data_files")):
            yield from ((name, path) for path in _strings(value))


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if key != "split":
                yield from _strings(item)
    elif value is not None:
        yield str(value)


def outside_repo(value: str) -> str | None:
    """Why ``value`` would be read from outside the repo (a URL, an absolute path, ``..``), or None."""
    if "://" in value or "::" in value:
        return "a URL"
    if value.startswith(("/", "~")) or "\\" in value or re.match(r"[A-Za-z]:[\\/]", value):
        return "an absolute path"
    if ".." in PurePosixPath(value).parts:
        return "a path that leads out of the repo ('..')"
    return None
