"""Reproducing a published set: its recipe downloaded, rebuilt in a fresh cache, compared by row id.

Everything is read at one commit, the revision resolved first, so a branch that moves meanwhile
does not mix two versions. The published recipe is a stranger's: it is loaded as data only
(:mod:`eagle3_raw.hub.untrusted`): the server, the key and what may run are the user's, and what
will be sent where is announced before anything is generated.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from eagle3_raw.builder import build
from eagle3_raw.hub.client import hub_api, parse_repo_ref
from eagle3_raw.hub.comparison import Comparison, compare
from eagle3_raw.hub.strangers import choose_config, download_config, load_published_rows, resolve_config
from eagle3_raw.hub.untrusted import Trust, describe, load_stranger_recipe, pinned_commit
from eagle3_raw.limits import RECIPE_BYTES
from eagle3_raw.recipe import Recipe

if TYPE_CHECKING:
    import datasets
    from huggingface_hub import HfApi

__all__ = ["choose_config", "fetch_recipe", "reproduce"]


def reproduce(
    ref: str,
    *,
    config: str | None = None,
    revision: str | None = None,
    overrides: Mapping[str, Any] | Sequence[str] | None = None,
    token: str | None = None,
    work_dir: Path | None = None,
    run_options: Mapping[str, Any] | None = None,
    max_differences: int = 5,
    reference_server: bool = False,
    trust_remote_code: bool = False,
    announce: Callable[[str], None] | None = None,
) -> Comparison:
    """Rebuild config ``config`` of ``ref`` (``org/name[@revision]``) from its published recipe and compare.

    Everything is read at one commit (the revision resolved first). The rebuild runs in a fresh
    cache and journal under ``work_dir`` (a temporary folder, removed after, when None), so it
    really regenerates. The published recipe gives the data only: requests go to the server the
    user names in ``overrides`` (``server.endpoints=...``; other ``overrides`` change data fields
    as given), or to the built-in reference server with ``reference_server``; the published
    ``trust_remote_code`` needs ``trust_remote_code`` and a commit (:mod:`.untrusted`). What will be
    sent where goes to ``announce`` (default: standard error) before generating. Without
    ``config``, a repo with one recipe uses it; with several, HubError lists them.
    """
    repo_id, ref_revision = parse_repo_ref(ref)
    from huggingface_hub import get_token

    api = hub_api(token or get_token())
    asked = revision or ref_revision
    commit, name = resolve_config(api, repo_id, asked, config)
    trust = Trust(reference_server, trust_remote_code, pinned_commit(asked, commit))
    with _work_dir(work_dir) as root:
        recipe, manifest = fetch_recipe(api, repo_id, commit, name, root / "hub", overrides, trust)
        (announce or _to_stderr)(describe(recipe, repo_id, commit, root / "hub" / "recipes"))
        fingerprint = recipe.fingerprint  # now: it digests the downloaded files, gone after the block
        options = {**(run_options or {}), "journal_dir": root / "journals"}
        rebuilt = build(recipe, cache_dir=root / "cache", run_options=options)
        published = _published_splits(api, repo_id, name, commit, root / "published", list(rebuilt.splits))
        result = compare(published, _joined(rebuilt.splits.values()), max_differences=max_differences)
        del published, rebuilt
    return Comparison(repo_id, name, commit, str(manifest.get("fingerprint", "?")), fingerprint, **result)


def _published_splits(
    api: HfApi, repo_id: str, name: str, commit: str, cache_dir: Path, splits: Sequence[str]
) -> datasets.Dataset:
    """The published rows of every split the rebuilt set has (``train``, and ``validation`` when
    the recipe holds one out), one after the other: rows are compared by id."""
    return _joined(load_published_rows(api, repo_id, name, commit, cache_dir, split) for split in splits)


def _joined(parts: Iterable[datasets.Dataset]) -> datasets.Dataset:
    import datasets

    splits = list(parts)
    return splits[0] if len(splits) == 1 else datasets.concatenate_datasets(splits)


def _to_stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@contextlib.contextmanager
def _work_dir(work_dir: Path | None) -> Iterator[Path]:
    if work_dir is not None:
        work_dir.mkdir(parents=True, exist_ok=True)
        yield work_dir
        return
    with tempfile.TemporaryDirectory(prefix="eagle3_raw-reproduce-") as tmp:
        yield Path(tmp)


def fetch_recipe(
    api: HfApi, repo_id: str, commit: str, name: str, local_dir: Path,
    overrides: Mapping[str, Any] | Sequence[str] | None = None, trust: Trust | None = None,
) -> tuple[Recipe, dict[str, Any]]:  # fmt: skip
    """Download config ``name``'s recipe, files and manifest at ``commit`` (within the bounds of
    :func:`~eagle3_raw.hub.strangers.download_config`, the copy marked a stranger's); the recipe
    loaded from there as a stranger's (:func:`~eagle3_raw.hub.untrusted.load_stranger_recipe`:
    ``overrides`` must name the server, unless ``trust`` asks for the reference server)."""
    path = download_config(api, repo_id, commit, name, local_dir)
    manifest = _manifest(path.with_name(f"{name}.manifest.json"))
    return load_stranger_recipe(path, overrides, trust or Trust()), manifest


def _manifest(path: Path) -> dict[str, Any]:
    """The published manifest (only its fingerprint is used), or nothing when absent or unusable."""
    if not path.is_file() or path.stat().st_size > RECIPE_BYTES:
        return {}
    try:
        manifest = orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError:
        return {}
    return manifest if isinstance(manifest, dict) else {}
