"""Pushing a recipe's set: the repo, the data, the recipe commit, the card, the tag, in that order.

See :mod:`eagle3_raw.hub` for the steps. Each commit says what it carries; the card commit is made
on top of exactly the head it read (retried when the branch moved), and a tag is never moved.
"""

from __future__ import annotations

import logging
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from eagle3_raw import card as cards
from eagle3_raw.builder import Built, build
from eagle3_raw.errors import HubError, JournalError
from eagle3_raw.export.published import publish_vocab
from eagle3_raw.hub.acceptance import plot_path, publish_acceptance
from eagle3_raw.hub.client import (
    check_ref_name,
    check_repo_id,
    full_repo_id,
    hub_api,
    hub_errors,
    resolve_token,
    status,
)
from eagle3_raw.hub.manifest import build_manifest, split_counts
from eagle3_raw.hub.published import (
    PublishedRecipe,
    check_no_secrets,
    check_publishable,
    local_tokenizer_warning,
    publish_recipe,
    upload_secrets,
)
from eagle3_raw.hub.sets import SetScan, scan_set
from eagle3_raw.journal.manifest import update_manifest
from eagle3_raw.printable import printable
from eagle3_raw.recipe import Recipe, load_recipe
from eagle3_raw.run.render import Renderer

if TYPE_CHECKING:
    import datasets
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi

_CARD_ATTEMPTS = 5

_log = logging.getLogger("eagle3_raw")


@dataclass(frozen=True)
class PushResult:
    """What :func:`push` published, and where."""

    repo_id: str
    config: str
    fingerprint: str
    branch: str
    commit: str
    tag: str | None
    rows: int
    generated: bool
    warnings: tuple[str, ...] = ()
    validation_rows: int | None = None
    """Rows of the held-out ``validation`` split (``rows`` is then the ``train`` split's), or None."""

    def _rows(self) -> str:
        if self.validation_rows is None:
            return f"{self.rows:,} rows"
        return f"{self.rows:,} train and {self.validation_rows:,} validation rows"

    @property
    def revision(self) -> str:
        """What to load it at: the tag, else the commit (both immutable)."""
        return self.tag or self.commit

    def render(self) -> str:
        """A plain-text summary for the terminal."""
        source = "generated now" if self.generated else "reused from the datasets cache (no request sent)"
        lines = [
            f"pushed            {self.repo_id} config {self.config} ({self._rows()}, {source})",
            f"branch            {self.branch} @ {self.commit}",
            f"tag               {self.tag or '-'}",
            f"load with         load_dataset({self.repo_id!r}, {self.config!r}, revision={self.revision!r})",
            *(f"warning           {w}" for w in self.warnings),
        ]
        return "\n".join(lines)


def push(
    recipe: str | Path | Mapping[str, Any] | Recipe,
    repo_id: str,
    *,
    tag: str | None = None,
    private: bool = False,
    revision: str | None = None,
    token: str | None = None,
    overrides: Mapping[str, Any] | Sequence[str] | None = None,
    cache_dir: Path | None = None,
    run_options: Mapping[str, Any] | None = None,
    partial: bool = False,
    announce: Callable[[str], None] | None = None,
) -> PushResult:
    """Build (or reuse) ``recipe``'s set and publish it as config ``recipe.name`` of ``repo_id``.

    See :mod:`eagle3_raw.hub` for the steps and their order. ``repo_id`` without an org goes to the
    token's user (as the Hub does). ``revision`` is a branch (created from ``main`` if missing);
    ``tag`` must not exist yet; both are checked to be valid names before anything is built or
    uploaded. A set is published whole: missing rows are generated first. With ``partial``,
    nothing is generated: the set is what the journal holds, and if some shard has not finished it
    is published marked partial (manifest and card say what is missing). Every file to upload is
    listed to ``announce`` (default: standard error) before the first upload (:func:`upload_plan`).
    Raises HubError (credentials, names, permissions, existing tag, Hub failures) and the build's
    own errors.
    """
    token = resolve_token(token)
    loaded = load_recipe(recipe, overrides)
    check_repo_id(repo_id, bare_name=True)
    check_ref_name("--revision", revision, branch=True)
    check_ref_name("--tag", tag)
    check_publishable(loaded)  # a file outside the recipe's folder: refused before anything is built
    api = hub_api(token)
    repo_id = full_repo_id(api, repo_id)
    prepare_repo(api, repo_id, private=private, revision=revision, tag=tag)
    options = {**(run_options or {}), **({"generate": False, "partial": True} if partial else {})}
    built = build(loaded, cache_dir=cache_dir, run_options=options)
    return publish(
        api, loaded, built, repo_id, token=token, tag=tag, revision=revision, private=private,
        announce=announce,
    )  # fmt: skip


def prepare_repo(api: HfApi, repo_id: str, *, private: bool, revision: str | None, tag: str | None) -> None:
    """Create the repo if missing, check write access, create the branch if missing, check the tag is free.

    HubError naming the repo when the token cannot write to it (401/403), before anything is built.
    """
    with hub_errors(repo_id, "create or write"):
        api.create_repo(repo_id, repo_type="dataset", private=private, exist_ok=True)
        _check_write_access(api, repo_id)
        if revision is not None:
            api.create_branch(repo_id, branch=revision, repo_type="dataset", exist_ok=True)
        tags = {t.name: t.target_commit for t in api.list_repo_refs(repo_id, repo_type="dataset").tags}
    if tag is not None and tag in tags:
        raise HubError(_tag_exists(repo_id, tag, tags[tag]))


def _check_write_access(api: HfApi, repo_id: str) -> None:
    """Raise the Hub's 403 (401, 404) unless the token may write to ``repo_id``, leaving nothing behind.

    ``create_repo(exist_ok=True)`` proves nothing for an existing repo: ``huggingface_hub`` turns its
    401/403 into success when the repo is readable. A write the Hub must authorize does: creating a
    uniquely named branch at ``main``'s head (no commit), deleted at once.
    """
    branch = f"eagle3-raw-write-check-{uuid.uuid4().hex[:12]}"
    api.create_branch(repo_id, branch=branch, repo_type="dataset")
    api.delete_branch(repo_id, branch=branch, repo_type="dataset")


def _tag_exists(repo_id: str, tag: str, commit: str | None) -> str:
    at = f" (at commit {commit})" if commit else ""
    return f"tag {tag!r} already exists on {repo_id}{at}; tags are never moved: choose another tag"


def publish(
    api: HfApi,
    recipe: Recipe,
    built: Built,
    repo_id: str,
    *,
    token: str,
    tag: str | None = None,
    revision: str | None = None,
    private: bool = False,
    announce: Callable[[str], None] | None = None,
) -> PushResult:
    """Steps 4-7 of :func:`push` for a set already built (see :mod:`eagle3_raw.hub`); what will
    be uploaded goes to ``announce`` (default: standard error) first."""
    published = publish_recipe(recipe)
    scan = scan_set(built.dataset)
    missing = built.run_result.partial if built.run_result is not None else None
    if built.partial and missing is None:
        missing = "some shards had not finished"
    rule = recipe.splits.rule
    splits = split_counts(rule, built.splits) if rule is not None and built.validation is not None else None
    manifest = build_manifest(recipe, published, scan, built.journal_dir, partial=missing, splits=splits)
    accepted = publish_acceptance(built.dataset, recipe, (manifest.get("target") or {}).get("drafter"))
    manifest["acceptance"] = accepted.manifest
    vocab = publish_vocab(recipe, built.dataset)
    payloads = {**_recipe_payloads(published, manifest, scan), **accepted.files, **vocab.files}
    check_no_secrets(payloads, upload_secrets(token, recipe))
    example = _example(recipe, built.dataset)  # before any upload: no half-published config
    held = len(built.validation) if built.validation is not None else None
    (announce or _to_stderr)(upload_plan(repo_id, recipe.name, scan.rows, payloads, validation_rows=held))
    _push_data(built.splits, recipe, repo_id, token=token, revision=revision, private=private)
    recipe_commit = _push_recipe(api, repo_id, recipe.name, payloads, revision)
    section = cards.CardSection(
        repo_id, recipe.name, tag or recipe_commit, published.data, manifest, example, vocab.summary
    )
    commit, warnings = _write_card(api, repo_id, section, revision, upload_secrets(token, recipe))
    if tag is not None:
        _create_tag(api, repo_id, tag, commit)
    _record_push(built.journal_dir, f"{repo_id}@{tag or commit}")
    return PushResult(
        repo_id, recipe.name, recipe.fingerprint, revision or "main", commit, tag, scan.rows, built.generated,
        tuple(local_tokenizer_warning(recipe) + warnings) + accepted.warnings, validation_rows=held,
    )  # fmt: skip


def upload_plan(
    repo_id: str, name: str, rows: int, payloads: Mapping[str, bytes | Path], *,
    validation_rows: int | None = None,
) -> str:  # fmt: skip
    """Every file a push uploads, one per line: the rows (each split's), then each payload (a local
    file with where it comes from and its size), then the card."""
    held = [f"{name}/validation-*.parquet"] if validation_rows is not None else []
    width = max(len(path) for path in [f"{name}/train-*.parquet", *held, *payloads])
    lines = [
        f"uploading to      {printable(repo_id)} config {printable(name)}:",
        f"  {f'{name}/train-*.parquet':<{width}}  the set's {rows:,} rows"
        + (" (train split)" if validation_rows is not None else ""),
    ]
    if validation_rows is not None:
        lines.append(f"  {f'{name}/validation-*.parquet':<{width}}  the {validation_rows:,} held-out rows")
    for path, payload in payloads.items():
        what = (
            f"from {printable(payload)} ({payload.stat().st_size:,} bytes)"
            if isinstance(payload, Path)
            else f"made by eagle3_raw ({len(payload):,} bytes)"
        )
        lines.append(f"  {printable(path):<{width}}  {what}")
    lines.append(f"  {'README.md':<{width}}  the dataset card, this config's section merged in")
    return "\n".join(lines)


def _to_stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _record_push(journal_dir: Path, where: str) -> None:
    """Note in the set's journal that it was pushed (``eagle3-raw journals prune`` then keeps it)."""
    if not (journal_dir / "manifest.json").exists():
        return  # built from another journal: nothing to note here
    try:
        update_manifest(journal_dir, lambda m: m.update(pushed=sorted({*(m.get("pushed") or []), where})))
    except JournalError as exc:  # the push itself succeeded; only the note is missing
        _log.warning("could not note the push in %s: %s", journal_dir, exc)


def _recipe_payloads(
    published: PublishedRecipe, manifest: Mapping[str, Any], scan: SetScan
) -> dict[str, bytes | Path]:
    name = published.name
    svg = cards.lengths_svg(
        [(f"{name}: generated tokens per row", scan.generated_lengths),
         (f"{name}: total tokens per row (len(input_ids))", scan.total_lengths)]
    )  # fmt: skip
    return {
        published.path: published.to_yaml().encode(),
        f"recipes/{name}.manifest.json": _json(manifest),
        f"recipes/{name}.lengths.svg": svg.encode(),
        **published.files,
    }


def _json(data: Any) -> bytes:
    return orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS, default=str) + b"\n"


def _example(recipe: Recipe, dataset: datasets.Dataset) -> cards.Example | None:
    if len(dataset) == 0:
        return None

    return cards.decode_example(Renderer(recipe).tokenizer, dataset[0])


# --- the commits ---------------------------------------------------------------------------------------


def _push_data(
    splits: Mapping[str, datasets.Dataset],
    recipe: Recipe,
    repo_id: str,
    *,
    token: str,
    revision: str | None,
    private: bool,
) -> None:
    """The rows of every split (``train``, and ``validation`` when held out) as config ``recipe.name``,
    pushed as one ``DatasetDict``: the config then has exactly these splits (a split an earlier push
    of the config had, and this set has not, is removed with its files, never left to be loaded)."""
    import datasets

    _log.info("pushing %s rows of %s to %s", f"{sum(map(len, splits.values())):,}", recipe.name, repo_id)
    with hub_errors(repo_id, "push the data to"):
        datasets.DatasetDict(splits).push_to_hub(
            repo_id, config_name=recipe.name, revision=revision, private=private, token=token,
            commit_message=f"eagle3_raw: rows of {recipe.name} ({recipe.fingerprint})",
        )  # fmt: skip


def _push_recipe(
    api: HfApi, repo_id: str, name: str, payloads: Mapping[str, bytes | Path], revision: str | None
) -> str:
    """One commit with the recipe, its files, the manifest and the picture; stale files removed."""
    from huggingface_hub import CommitOperationAdd

    with hub_errors(repo_id, "upload the recipe to"):
        existing = api.list_repo_files(repo_id, repo_type="dataset", revision=revision)
        adds: list[CommitOperationAdd | CommitOperationDelete] = [
            CommitOperationAdd(path, str(data) if isinstance(data, Path) else data)
            for path, data in payloads.items()
        ]
        info = api.create_commit(
            repo_id, operations=adds + _stale(existing, name, payloads), repo_type="dataset",
            revision=revision, commit_message=f"eagle3_raw: recipe and manifest of {name}",
        )  # fmt: skip
    return str(info.oid)


def _stale(existing: Sequence[str], name: str, keep: Mapping[str, Any]) -> list[CommitOperationDelete]:
    from huggingface_hub import CommitOperationDelete

    prefix, plot = f"recipes/{name}/", plot_path(name)  # a set no longer speculated: its old plot goes
    return [
        CommitOperationDelete(path)
        for path in existing
        if (path.startswith(prefix) or path == plot) and path not in keep
    ]


def _write_card(
    api: HfApi, repo_id: str, section: cards.CardSection, revision: str | None, secrets: Sequence[str]
) -> tuple[str, list[str]]:
    """Merge ``section`` into the README at the branch head; retried when the branch moved meanwhile."""
    for attempt in range(1, _CARD_ATTEMPTS + 1):
        try:
            with hub_errors(repo_id, "write the dataset card of"):
                return _commit_card(api, repo_id, section, revision, secrets)
        except HubError as exc:
            if status(exc.__cause__) not in (409, 412) or attempt == _CARD_ATTEMPTS:
                raise
        time.sleep(0.5 * attempt)
    raise AssertionError("unreachable")


def _commit_card(
    api: HfApi, repo_id: str, section: cards.CardSection, revision: str | None, secrets: Sequence[str]
) -> tuple[str, list[str]]:
    """Read the README at the head, merge, commit on top of exactly that head (412 if it moved)."""
    from huggingface_hub import CommitOperationAdd

    head = str(api.repo_info(repo_id, repo_type="dataset", revision=revision).sha)
    text, warnings = cards.update_card(_read_readme(api, repo_id, head), section)
    check_no_secrets({"README.md": text.encode()}, secrets)
    info = api.create_commit(
        repo_id, operations=[CommitOperationAdd("README.md", text.encode())], repo_type="dataset",
        revision=revision, parent_commit=head, commit_message=f"eagle3_raw: card section of {section.name}",
    )  # fmt: skip
    return str(info.oid), warnings


def _read_readme(api: HfApi, repo_id: str, commit: str) -> str:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError

    try:
        path = hf_hub_download(repo_id, "README.md", repo_type="dataset", revision=commit, token=api.token)
    except EntryNotFoundError:
        return ""
    return Path(path).read_text(encoding="utf-8")


def _create_tag(api: HfApi, repo_id: str, tag: str, commit: str) -> None:
    from huggingface_hub.errors import HfHubHTTPError

    try:
        api.create_tag(
            repo_id, tag=tag, revision=commit, repo_type="dataset", tag_message=f"eagle3_raw {tag}"
        )
    except HfHubHTTPError as exc:
        if status(exc) == 409:
            raise HubError(_tag_exists(repo_id, tag, None)) from exc
        with hub_errors(repo_id, f"create tag {tag!r} on"):
            raise
