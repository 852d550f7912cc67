"""Publish a recipe's set on the Hugging Face Hub, and rebuild a published set to compare.

:func:`push`, in this order (each step only once the ones before it succeeded):

1. credentials (``token``, else ``HF_TOKEN`` or the ``huggingface_hub`` login): none is a HubError
   before anything is built;
2. the repo: created if missing (which also checks write access: 401/403 is a HubError naming it),
   the ``revision`` branch created from ``main`` if missing, the ``tag`` checked to be free;
3. the set, built or reused from the ``datasets`` cache (a second push sends no request);
4. the data: ``Dataset.push_to_hub(repo_id, config_name=recipe.name, split="train")``;
5. one commit with ``recipes/<name>.yaml`` (the resolved recipe, secrets scrubbed, a local prompt
   source uploaded beside it under ``recipes/<name>/prompts/`` and pointed at relatively, which
   keeps the fingerprint: checked before anything is uploaded), ``recipes/<name>.manifest.json``
   (:func:`build_manifest`) and ``recipes/<name>.lengths.svg``;
6. the card: the README that step 4 wrote, merged (:mod:`eagle3_raw.card`);
7. the tag, on the card's commit. An existing tag is never moved.

:func:`reproduce` downloads ``recipes/<config>.yaml`` (and its files) at one commit, rebuilds it in
a fresh cache and journal, loads the published rows at the same commit, and compares them by row id
(:func:`compare`).

Secrets: the Hub token goes only into ``Authorization`` headers; nothing is logged with it. Every
text uploaded (recipe, manifest, card, picture, prompt files) is checked not to contain it nor the
server API key, and server facts pass through :func:`scrub` (keys named like secrets dropped,
secret command-line flags and URL credentials redacted).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import orjson
import yaml

from eagle3_raw import card as cards
from eagle3_raw.errors import HubError
from eagle3_raw.recipe import Recipe, load_recipe, tokenizer_path
from eagle3_raw.redact import is_secret_name, public_url, scrub, scrub_args, scrub_text

if TYPE_CHECKING:
    import datasets
    import numpy as np
    import pyarrow as pa
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi

__all__ = [
    "NO_CREDENTIALS", "Built", "Comparison", "PublishedRecipe", "PushResult", "RowDifference", "SetScan",
    "build", "build_manifest", "check_no_secrets", "check_repo_id", "choose_config", "compare",
    "fetch_recipe", "first_differences", "hub_errors", "is_secret_name", "parse_repo_ref", "prepare_repo",
    "public_url", "publish", "publish_recipe", "push", "reproduce", "resolve_token", "row_hashes", "scan_set",
    "scrub", "scrub_args", "scrub_text",
]  # fmt: skip

log = logging.getLogger("eagle3_raw")

NO_CREDENTIALS = "no Hugging Face credentials: set HF_TOKEN or run `hf auth login`"
MANIFEST_FORMAT = 1
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
_WEIGHT_SUFFIXES = frozenset({".safetensors", ".bin", ".pt", ".pth", ".gguf", ".ckpt", ".h5", ".msgpack"})
_CARD_ATTEMPTS = 5
_BATCH = 4096


# --- results ------------------------------------------------------------------------------------


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

    @property
    def revision(self) -> str:
        """What to load it at: the tag, else the commit (both immutable)."""
        return self.tag or self.commit

    def render(self) -> str:
        """A plain-text summary for the terminal."""
        source = "generated now" if self.generated else "reused from the datasets cache (no request sent)"
        lines = [
            f"pushed            {self.repo_id} config {self.config} ({self.rows:,} rows, {source})",
            f"branch            {self.branch} @ {self.commit}",
            f"tag               {self.tag or '-'}",
            f"load with         load_dataset({self.repo_id!r}, {self.config!r}, revision={self.revision!r})",
            *(f"warning           {w}" for w in self.warnings),
        ]
        return "\n".join(lines)


@dataclass(frozen=True)
class RowDifference:
    """The first place where a published row and its rebuild differ."""

    id: str
    position: int
    part: Literal["prompt", "generated"]
    published_len: int
    rebuilt_len: int
    published_ids: tuple[int, ...]
    rebuilt_ids: tuple[int, ...]

    def render(self) -> str:
        return (
            f"{self.id}: first difference at token {self.position} ({self.part}; lengths "
            f"{self.published_len} vs {self.rebuilt_len}): published {list(self.published_ids)} "
            f"rebuilt {list(self.rebuilt_ids)}"
        )


@dataclass(frozen=True)
class Comparison:
    """How a rebuild compares with the published rows (matched by ``id``, ``input_ids`` hashed)."""

    repo_id: str
    config: str
    commit: str
    published_fingerprint: str
    rebuilt_fingerprint: str
    published_rows: int
    rebuilt_rows: int
    common: int
    identical: int
    only_published: tuple[str, ...] = ()
    only_rebuilt: tuple[str, ...] = ()
    only_published_count: int = 0
    only_rebuilt_count: int = 0
    differences: tuple[RowDifference, ...] = field(default_factory=tuple)

    @property
    def identical_share(self) -> float:
        """Published rows whose rebuild has the same ``input_ids`` (1.0 for two empty sets)."""
        return self.identical / self.published_rows if self.published_rows else float(not self.rebuilt_rows)

    @property
    def full_agreement(self) -> bool:
        """Same recipe, same row ids, every ``input_ids`` identical."""
        same_rows = self.published_rows == self.rebuilt_rows == self.common == self.identical
        return same_rows and self.published_fingerprint == self.rebuilt_fingerprint

    def render(self) -> str:
        """A plain-text report for the terminal."""
        same = "same" if self.published_fingerprint == self.rebuilt_fingerprint else "DIFFERENT recipe"
        lines = [
            f"reproduced        {self.repo_id}@{self.commit} config {self.config}",
            f"fingerprint       rebuilt {self.rebuilt_fingerprint}, "
            f"published {self.published_fingerprint} ({same})",
            f"rows              published {self.published_rows:,}, rebuilt {self.rebuilt_rows:,}, "
            f"in common {self.common:,}",
            f"identical         {self.identical:,} of {self.published_rows:,} ({self.identical_share:.1%})",
            *_listed("only published", self.only_published_count, self.only_published),
            *_listed("only rebuilt", self.only_rebuilt_count, self.only_rebuilt),
            *(f"difference        {d.render()}" for d in self.differences),
            f"verdict           {self._verdict()}",
        ]  # fmt: skip
        return "\n".join(lines)

    def _verdict(self) -> str:
        if self.full_agreement:
            return "full agreement: every row regenerated token for token"
        if self.published_fingerprint != self.rebuilt_fingerprint:
            return "the rebuilt recipe is not the published one (an override changed a data field?)"
        return "the rebuild differs (a sampled recipe on a non-deterministic server, or another server)"


def _listed(label: str, count: int, ids: Sequence[str]) -> list[str]:
    if not count:
        return []
    more = f" and {count - len(ids):,} more" if count > len(ids) else ""
    return [f"{label:<18}{count:,}: {', '.join(ids)}{more}"]


# --- credentials and Hub errors ------------------------------------------------------------------


def resolve_token(token: str | None = None) -> str:
    """``token``, else ``HF_TOKEN``, else the ``huggingface_hub`` login; HubError when there is none."""
    from huggingface_hub import get_token

    value = token or get_token()
    if not value:
        raise HubError(NO_CREDENTIALS)
    return value


@contextlib.contextmanager
def hub_errors(repo_id: str, action: str) -> Iterator[None]:
    """Turn the Hub client's errors into a HubError that names ``repo_id`` and what failed."""
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    try:
        yield
    except OfflineModeIsEnabled as exc:
        raise HubError(f"cannot {action} {repo_id}: HF_HUB_OFFLINE is set") from exc
    except HfHubHTTPError as exc:
        raise HubError(_http_message(exc, repo_id, action)) from exc
    except OSError as exc:
        raise HubError(f"cannot {action} {repo_id}: {exc}") from exc


def _http_message(exc: Exception, repo_id: str, action: str) -> str:
    from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

    status = _status(exc)
    if isinstance(exc, RevisionNotFoundError):
        return f"cannot {action} {repo_id}: no such revision"
    if isinstance(exc, RepositoryNotFoundError):
        return (
            f"cannot {action} {repo_id}: no such dataset repo, or it is private and the credentials "
            "cannot read it"
        )
    if status == 401:
        return (
            f"cannot {action} {repo_id}: the Hub refused the credentials (HTTP 401); the token is "
            "invalid or expired: set HF_TOKEN or run `hf auth login`"
        )
    if status == 403:
        return (
            f"cannot {action} {repo_id}: the token has no write access to it (HTTP 403); use a token "
            f"with write permission on the {repo_id.split('/')[0]!r} namespace"
        )
    return f"cannot {action} {repo_id}: {_first_line(exc)}"


def _status(exc: BaseException | None) -> int | None:
    while exc is not None:
        response = getattr(exc, "response", None)
        if response is not None:
            return int(response.status_code)
        exc = exc.__context__
    return None


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _api(token: str | None) -> HfApi:
    from huggingface_hub import HfApi

    return HfApi(token=token, library_name="eagle3_raw")


# --- secrets -------------------------------------------------------------------------------------


def check_no_secrets(payloads: Mapping[str, bytes | Path], secrets: Sequence[str]) -> None:
    """HubError when a payload (repo path -> bytes or local file) contains one of ``secrets``."""
    needles = [s.encode() for s in secrets if s and len(s) >= 4]
    for path, payload in payloads.items():
        data = payload.read_bytes() if isinstance(payload, Path) else payload
        if any(needle in data for needle in needles):
            raise HubError(f"refusing to upload {path}: it contains a credential (the Hub token or API key)")


def _secrets(token: str, recipe: Recipe) -> list[str]:
    import os

    name = recipe.server.api_key_env
    return [token, os.environ.get(name, "") if name else ""]


# --- the published recipe ------------------------------------------------------------------------


@dataclass(frozen=True)
class PublishedRecipe:
    """The recipe as uploaded: scrubbed, local files rewritten to paths beside it, and those files."""

    name: str
    data: Mapping[str, Any]
    files: Mapping[str, Path]
    prompt_source: Literal["local", "hub"]

    @property
    def path(self) -> str:
        return f"recipes/{self.name}.yaml"

    def to_yaml(self) -> str:
        header = "# Published by eagle3_raw; local paths resolve relative to this file.\n"
        return header + yaml.safe_dump(dict(self.data), sort_keys=False, allow_unicode=True)


def publish_recipe(recipe: Recipe) -> PublishedRecipe:
    """What :func:`push` uploads for ``recipe``; the published recipe keeps its fingerprint.

    A local prompt source (file or folder) goes to ``recipes/<name>/prompts/<its name>``, a chat
    template override to ``recipes/<name>/chat_template/<its name>``; the recipe points at them
    relatively. A local tokenizer folder is not uploaded (a warning says how to reproduce).
    """
    data = recipe.to_dict()
    data["server"] = _public_server(data["server"])
    files: dict[str, Path] = {}
    source = recipe.resolve_path(recipe.prompts.source)
    if source.exists():
        data["prompts"]["source"] = _ship(files, source, f"{recipe.name}/prompts")
    if recipe.model.chat_template is not None:
        template = recipe.resolve_path(recipe.model.chat_template)
        data["model"]["chat_template"] = _ship(files, template, f"{recipe.name}/chat_template")
    kind: Literal["local", "hub"] = "local" if source.exists() else "hub"
    published = PublishedRecipe(recipe.name, data, files, kind)
    _check_fingerprint(recipe, published)
    return published


def _public_server(server: dict[str, Any]) -> dict[str, Any]:
    """The server section without secrets; ``api_key_env`` stays (a variable's name, not its value)."""
    kept = {"api_key_env"}
    public = {
        k: v if k in kept else scrub(v) for k, v in server.items() if k in kept or not is_secret_name(k)
    }
    public["endpoints"] = [public_url(url) for url in server.get("endpoints") or []]
    return public


def _ship(files: dict[str, Path], local: Path, folder: str) -> str:
    """Add ``local`` (a file, or a folder's data files) under ``recipes/<folder>/``; the relative path."""
    # the name as the recipe gives it (a symlink keeps its own name): digest_path hashes file names
    name = local.name if local.name not in ("", ".", "..") else local.resolve().name
    local = local.absolute()
    relative = f"{folder}/{name}"
    if local.is_file():
        files[f"recipes/{relative}"] = local
    for path in sorted(local.rglob("*")) if local.is_dir() else ():
        inner = path.relative_to(local)
        if _shipped(path, inner):
            files[f"recipes/{relative}/{inner.as_posix()}"] = path
    return relative


def _shipped(path: Path, inner: Path) -> bool:
    hidden = any(part.startswith(".") or part == "__pycache__" for part in inner.parts)
    return path.is_file() and not hidden and path.suffix not in _WEIGHT_SUFFIXES


def _check_fingerprint(recipe: Recipe, published: PublishedRecipe) -> None:
    """Lay the published files out as on the Hub (links) and check the recipe's fingerprint holds."""
    with tempfile.TemporaryDirectory(prefix="eagle3_raw-publish-") as tmp:
        root = Path(tmp)
        path = root / published.path
        path.parent.mkdir(parents=True)
        path.write_text(published.to_yaml(), encoding="utf-8")
        for repo_path, local in published.files.items():
            (root / repo_path).parent.mkdir(parents=True, exist_ok=True)
            (root / repo_path).symlink_to(local)
        fingerprint = load_recipe(path).fingerprint
    if fingerprint != recipe.fingerprint:
        raise HubError(
            f"the published recipe {published.path} would have fingerprint {fingerprint}, not "
            f"{recipe.fingerprint}: its prompt files would not reproduce the set (please report this)"
        )


def _local_tokenizer_warning(recipe: Recipe) -> list[str]:
    if recipe.model.tokenizer == "reference" or tokenizer_path(recipe) is None:
        return []
    return [
        f"model.tokenizer {recipe.model.tokenizer!r} is a local folder and is not uploaded; reproducing "
        "needs --set model.tokenizer=<the same tokenizer> (the fingerprint follows its content)"
    ]


# --- building ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Built:
    """A built set, where its journal is, and whether this call generated it."""

    dataset: datasets.Dataset
    journal_dir: Path
    generated: bool


def build(
    recipe: Recipe, *, cache_dir: Path | None = None, run_options: Mapping[str, Any] | None = None
) -> Built:
    """Build ``recipe``'s set, or reuse it from the ``datasets`` cache (then no request is sent).

    ``run_options`` are the builder's run options (``journal_dir``, ``progress``, ...).
    """
    import datasets

    from eagle3_raw.builder import our_errors
    from eagle3_raw.registry import register
    from eagle3_raw.run import journal_dir_for

    register()
    options = dict(run_options or {})
    builder = datasets.load_dataset_builder(
        "eagle3_raw", recipe=recipe, cache_dir=str(cache_dir) if cache_dir else None, **options
    )
    with our_errors():
        builder.download_and_prepare()
    dataset = builder.as_dataset(split="train")
    result = builder.run_result
    journal = (
        result.journal_dir if result is not None else journal_dir_for(recipe, options.get("journal_dir"))
    )
    return Built(dataset, Path(journal), result is not None)


# --- the manifest --------------------------------------------------------------------------------


@dataclass(frozen=True)
class SetScan:
    """What one pass over a set gives: counts from the rows themselves, and every row's lengths."""

    rows: int
    finish_reasons: Mapping[str, int]
    prompt_lengths: np.ndarray
    total_lengths: np.ndarray

    @property
    def generated_lengths(self) -> np.ndarray:
        generated: np.ndarray = self.total_lengths - self.prompt_lengths
        return generated

    def length_stats(self) -> dict[str, dict[str, float | int]]:
        return {
            "prompt": cards.length_stats(self.prompt_lengths),
            "generated": cards.length_stats(self.generated_lengths),
            "total": cards.length_stats(self.total_lengths),
        }


def scan_set(dataset: datasets.Dataset) -> SetScan:
    """Lengths and finish reasons of every row, read in Arrow batches (ids are never materialized)."""
    import pyarrow.compute as pc

    prompts: list[np.ndarray] = []
    totals: list[np.ndarray] = []
    reasons: Counter[str] = Counter()
    columns = dataset.select_columns(["input_ids", "prompt_len", "finish_reason"]).with_format("arrow")
    for table in columns.iter(batch_size=_BATCH):
        totals.append(pc.list_value_length(table["input_ids"]).to_numpy(zero_copy_only=False))
        prompts.append(table["prompt_len"].to_numpy(zero_copy_only=False))
        reasons.update(table["finish_reason"].to_pylist())
    return SetScan(len(dataset), dict(reasons), _joined(prompts), _joined(totals))


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    import numpy as np

    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)


def build_manifest(
    recipe: Recipe, published: PublishedRecipe, scan: SetScan, journal_dir: Path
) -> dict[str, Any]:
    """``recipes/<name>.manifest.json``: identity, server, tokenizer, versions, counts, lengths.

    Counts of rows and tokens come from the set as pushed; skips and failures (and rows dropped for
    ``on_truncation: drop``) from the journal. Server facts are scrubbed. No timestamps of the push,
    so pushing the same set twice changes nothing.
    """
    journal_manifest, stats = _journal_facts(recipe, journal_dir)
    server = (journal_manifest or {}).get("server") or None
    return {
        "format": MANIFEST_FORMAT,
        "name": recipe.name,
        "fingerprint": recipe.fingerprint,
        "config_id": recipe.config_id,
        "recipe_file": published.path,
        "prompt_source": published.prompt_source,
        "prompt_files": sorted(p for p in published.files if "/prompts/" in p),
        "versions": _versions(),
        "request_params": recipe.sampling.request_params(),
        "server": _server_facts(server),
        "tokenizer": scrub((server or {}).get("tokenizer") or _tokenizer_identity(recipe)),
        "counts": _counts(recipe, scan, stats),
        "lengths": scan.length_stats(),
        "journal": _journal_history(journal_manifest),
    }


def _journal_facts(recipe: Recipe, journal_dir: Path) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    from eagle3_raw.errors import JournalError
    from eagle3_raw.journal import Journal

    try:
        with Journal.read(journal_dir, fingerprint=recipe.fingerprint) as journal:
            return dict(journal.manifest), journal.stats()
    except JournalError as exc:
        log.warning("no journal for %s (%s): the card will not show the server or failures", recipe.name, exc)
        return None, None


def _server_facts(server: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if server is None:
        return None
    keys = ("model_path", "served_model_name", "weight_version", "version", "server_info", "model_info")
    facts: dict[str, Any] = scrub({key: server[key] for key in keys if key in server})
    return facts


def _tokenizer_identity(recipe: Recipe) -> dict[str, str]:
    from eagle3_raw.render import Renderer

    return Renderer(recipe).identity()


def _counts(recipe: Recipe, scan: SetScan, stats: Mapping[str, Any] | None) -> dict[str, Any]:
    failures = (stats or {}).get("failures") or {}
    journaled_length = ((stats or {}).get("finish_reasons") or {}).get("length", 0)
    return {
        "rows": scan.rows,
        "prompt_tokens": int(scan.prompt_lengths.sum()),
        "generated_tokens": int(scan.generated_lengths.sum()),
        "finish_reasons": dict(sorted(scan.finish_reasons.items())),
        "dropped_truncated": journaled_length if recipe.on_truncation == "drop" else 0,
        "skipped": scrub(dict(failures.get("skipped") or {})),
        "failed": scrub(dict(failures.get("failed") or {})),
    }


def _journal_history(manifest: Mapping[str, Any] | None) -> dict[str, Any]:
    if manifest is None:
        return {"available": False}
    history = manifest.get("history") or []
    return {"available": True, "created": manifest.get("created"), "server_changes": len(history)}


def _versions() -> dict[str, str]:
    import datasets
    import huggingface_hub

    from eagle3_raw import __version__

    return {
        "eagle3_raw": __version__,
        "datasets": datasets.__version__,
        "huggingface_hub": huggingface_hub.__version__,
    }


def _json(data: Any) -> bytes:
    return orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS, default=str) + b"\n"


# --- push ----------------------------------------------------------------------------------------


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
) -> PushResult:
    """Build (or reuse) ``recipe``'s set and publish it as config ``recipe.name`` of ``repo_id``.

    See the module docstring for the steps and their order. ``revision`` is a branch (created from
    ``main`` if missing); ``tag`` must not exist yet. Raises HubError (credentials, permissions,
    existing tag, Hub failures) and the build's own errors.
    """
    token = resolve_token(token)
    loaded = load_recipe(recipe, overrides)
    check_repo_id(repo_id)
    api = _api(token)
    prepare_repo(api, repo_id, private=private, revision=revision, tag=tag)
    built = build(loaded, cache_dir=cache_dir, run_options=run_options)
    return publish(api, loaded, built, repo_id, token=token, tag=tag, revision=revision, private=private)


def check_repo_id(repo_id: str) -> None:
    """HubError unless ``repo_id`` looks like ``org/name``."""
    if not _REPO_ID.fullmatch(repo_id):
        raise HubError(f"repo {repo_id!r}: expected org/name (letters, digits, '.', '_', '-')")


def prepare_repo(api: HfApi, repo_id: str, *, private: bool, revision: str | None, tag: str | None) -> None:
    """Create the repo if missing (checks write access), the branch if missing; check the tag is free."""
    with hub_errors(repo_id, "create or write"):
        api.create_repo(repo_id, repo_type="dataset", private=private, exist_ok=True)
        if revision is not None:
            api.create_branch(repo_id, branch=revision, repo_type="dataset", exist_ok=True)
        tags = {t.name: t.target_commit for t in api.list_repo_refs(repo_id, repo_type="dataset").tags}
    if tag is not None and tag in tags:
        raise HubError(_tag_exists(repo_id, tag, tags[tag]))


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
) -> PushResult:
    """Steps 4-7 of :func:`push` for a set already built (see the module docstring)."""
    published = publish_recipe(recipe)
    scan = scan_set(built.dataset)
    manifest = build_manifest(recipe, published, scan, built.journal_dir)
    payloads = _recipe_payloads(published, manifest, scan)
    check_no_secrets(payloads, _secrets(token, recipe))
    example = _example(recipe, built.dataset)  # before any upload: no half-published config
    _push_data(built.dataset, recipe, repo_id, token=token, revision=revision, private=private)
    recipe_commit = _push_recipe(api, repo_id, recipe.name, payloads, revision)
    section = cards.CardSection(repo_id, recipe.name, tag or recipe_commit, published.data, manifest, example)
    commit, warnings = _write_card(api, repo_id, section, revision, _secrets(token, recipe))
    if tag is not None:
        _create_tag(api, repo_id, tag, commit)
    return PushResult(
        repo_id, recipe.name, recipe.fingerprint, revision or "main", commit, tag, scan.rows, built.generated,
        tuple(_local_tokenizer_warning(recipe) + warnings),
    )  # fmt: skip


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


def _push_data(
    dataset: datasets.Dataset,
    recipe: Recipe,
    repo_id: str,
    *,
    token: str,
    revision: str | None,
    private: bool,
) -> None:
    log.info("pushing %s rows of %s to %s", f"{len(dataset):,}", recipe.name, repo_id)
    with hub_errors(repo_id, "push the data to"):
        dataset.push_to_hub(
            repo_id, config_name=recipe.name, split="train", revision=revision, private=private, token=token,
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

    prefix = f"recipes/{name}/"
    return [CommitOperationDelete(path) for path in existing if path.startswith(prefix) and path not in keep]


def _example(recipe: Recipe, dataset: datasets.Dataset) -> cards.Example | None:
    if len(dataset) == 0:
        return None
    from eagle3_raw.render import Renderer

    return cards.decode_example(Renderer(recipe).tokenizer, dataset[0])


def _write_card(
    api: HfApi, repo_id: str, section: cards.CardSection, revision: str | None, secrets: Sequence[str]
) -> tuple[str, list[str]]:
    """Merge ``section`` into the README at the branch head; retried when the branch moved meanwhile."""
    for attempt in range(1, _CARD_ATTEMPTS + 1):
        try:
            with hub_errors(repo_id, "write the dataset card of"):
                return _commit_card(api, repo_id, section, revision, secrets)
        except HubError as exc:
            if _status(exc.__cause__) not in (409, 412) or attempt == _CARD_ATTEMPTS:
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
        if _status(exc) == 409:
            raise HubError(_tag_exists(repo_id, tag, None)) from exc
        with hub_errors(repo_id, f"create tag {tag!r} on"):
            raise


# --- reproduce -----------------------------------------------------------------------------------


def parse_repo_ref(ref: str) -> tuple[str, str | None]:
    """``org/name[@revision]`` as ``(repo_id, revision or None)``."""
    repo_id, _, revision = ref.partition("@")
    check_repo_id(repo_id)
    return repo_id, revision or None


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
) -> Comparison:
    """Rebuild config ``config`` of ``ref`` (``org/name[@revision]``) from its published recipe and compare.

    Everything is read at one commit (the revision resolved first). The rebuild runs in a fresh
    cache and journal under ``work_dir`` (a temporary folder, removed after, when None), so it
    really regenerates. ``overrides`` apply to the published recipe (``server.endpoints=...``).
    Without ``config``, a repo with one recipe uses it; with several, HubError lists them.
    """
    repo_id, ref_revision = parse_repo_ref(ref)
    from huggingface_hub import get_token

    api = _api(token or get_token())
    commit, name = _resolve_config(api, repo_id, revision or ref_revision, config)
    with _work_dir(work_dir) as root:
        recipe, manifest = fetch_recipe(api, repo_id, commit, name, root / "hub", overrides)
        fingerprint = recipe.fingerprint  # now: it digests the downloaded files, gone after the block
        options = {**(run_options or {}), "journal_dir": root / "journals"}
        rebuilt = build(recipe, cache_dir=root / "cache", run_options=options)
        published = _load_published(api, repo_id, name, commit, root / "published")
        result = compare(published, rebuilt.dataset, max_differences=max_differences)
        del published, rebuilt
    return Comparison(repo_id, name, commit, str(manifest.get("fingerprint", "?")), fingerprint, **result)


def _resolve_config(api: HfApi, repo_id: str, revision: str | None, config: str | None) -> tuple[str, str]:
    with hub_errors(repo_id, "read"):
        commit = str(api.dataset_info(repo_id, revision=revision).sha)
        files = api.list_repo_files(repo_id, repo_type="dataset", revision=commit)
    configs = sorted(m[1] for f in files if (m := re.fullmatch(r"recipes/([^/]+)\.yaml", f)))
    return commit, choose_config(repo_id, configs, config)


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
        raise HubError(f"{repo_id} has no config {config!r}; it has: {listed}")
    return config or configs[0]


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
    overrides: Mapping[str, Any] | Sequence[str] | None = None,
) -> tuple[Recipe, dict[str, Any]]:  # fmt: skip
    """Download config ``name``'s recipe, files and manifest at ``commit``; the recipe loaded from there."""
    from huggingface_hub import snapshot_download

    patterns = [f"recipes/{name}.yaml", f"recipes/{name}.manifest.json", f"recipes/{name}/*"]
    with hub_errors(repo_id, "download the recipe of"):
        snapshot_download(
            repo_id, repo_type="dataset", revision=commit, local_dir=local_dir, allow_patterns=patterns,
            token=api.token,
        )  # fmt: skip
    manifest_path = local_dir / "recipes" / f"{name}.manifest.json"
    manifest = orjson.loads(manifest_path.read_bytes()) if manifest_path.is_file() else {}
    return load_recipe(local_dir / "recipes" / f"{name}.yaml", overrides), manifest


def _load_published(api: HfApi, repo_id: str, name: str, commit: str, cache_dir: Path) -> datasets.Dataset:
    import datasets

    with hub_errors(repo_id, "load the published rows of"):
        dataset = datasets.load_dataset(
            repo_id, name, revision=commit, split="train", token=api.token, cache_dir=str(cache_dir)
        )
    assert isinstance(dataset, datasets.Dataset)
    return dataset


# --- comparison ----------------------------------------------------------------------------------


def compare(
    published: datasets.Dataset, rebuilt: datasets.Dataset, *, max_differences: int = 5, max_ids: int = 5
) -> dict[str, Any]:
    """Counts of a by-id comparison, as keyword arguments of :class:`Comparison` (minus identity).

    Memory: one ``{id: 16-byte hash of input_ids}`` of the published set; the rebuilt set streams
    past it. Differing rows are re-read afterwards, only the first ``max_differences`` of them.
    """
    hashes = dict(row_hashes(published))
    published_rows, common, identical = len(published), 0, 0
    only_rebuilt: list[str] = []
    differing: list[str] = []
    rebuilt_rows = 0
    for row_id, digest in row_hashes(rebuilt):
        rebuilt_rows += 1
        theirs = hashes.pop(row_id, None)
        if theirs is None:
            only_rebuilt.append(row_id)
            continue
        common += 1
        identical += theirs == digest
        if theirs != digest and len(differing) < max_differences:
            differing.append(row_id)
    return {
        "published_rows": published_rows, "rebuilt_rows": rebuilt_rows, "common": common,
        "identical": identical, "only_published": tuple(sorted(hashes)[:max_ids]),
        "only_published_count": len(hashes), "only_rebuilt": tuple(only_rebuilt[:max_ids]),
        "only_rebuilt_count": len(only_rebuilt),
        "differences": first_differences(published, rebuilt, differing),
    }  # fmt: skip


def row_hashes(dataset: datasets.Dataset) -> Iterator[tuple[str, bytes]]:
    """``(id, blake2b-128 of input_ids as little-endian int32)`` of every row, read in Arrow batches."""
    for table in dataset.select_columns(["id", "input_ids"]).with_format("arrow").iter(batch_size=_BATCH):
        values, offsets = _flat_ids(table["input_ids"])
        for i, row_id in enumerate(table["id"].to_pylist()):
            data = values[offsets[i] : offsets[i + 1]].tobytes()
            yield row_id, hashlib.blake2b(data, digest_size=16).digest()


def _flat_ids(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    import numpy as np
    import pyarrow as pa

    lists = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    offsets = lists.offsets.to_numpy().astype(np.int64)
    values = lists.values.to_numpy(zero_copy_only=False).astype("<i4", copy=False)
    return values, offsets


def first_differences(
    published: datasets.Dataset, rebuilt: datasets.Dataset, ids: Sequence[str]
) -> tuple[RowDifference, ...]:
    """Where each of the rows ``ids`` first differs between the two sets (ids present in both)."""
    if not ids:
        return ()
    ours, theirs = _rows_by_id(published, ids), _rows_by_id(rebuilt, ids)
    return tuple(_difference(i, ours[i], theirs[i]) for i in ids if i in ours and i in theirs)


def _rows_by_id(dataset: datasets.Dataset, ids: Sequence[str]) -> dict[str, tuple[list[int], int]]:
    """``{id: (input_ids, prompt_len)}`` of the rows ``ids`` (a scan; ``ids`` are few)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    wanted = pa.array(list(ids), pa.string())
    found: dict[str, tuple[list[int], int]] = {}
    rows = dataset.select_columns(["id", "input_ids", "prompt_len"]).with_format("arrow")
    for table in rows.iter(batch_size=_BATCH):
        hits = table.filter(pc.is_in(table["id"], value_set=wanted))
        for row in hits.to_pylist():
            found[row["id"]] = (row["input_ids"], row["prompt_len"])
    return found


def _difference(
    row_id: str, published: tuple[list[int], int], rebuilt: tuple[list[int], int], *, context: int = 8
) -> RowDifference:
    (ours, prompt_len), (theirs, _) = published, rebuilt
    position = next(
        (i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), min(len(ours), len(theirs))
    )
    return RowDifference(
        row_id, position, "prompt" if position < prompt_len else "generated", len(ours), len(theirs),
        tuple(ours[position : position + context]), tuple(theirs[position : position + context]),
    )  # fmt: skip
