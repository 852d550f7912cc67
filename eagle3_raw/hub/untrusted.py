"""A recipe somebody else wrote is data, never instructions.

``eagle3-raw reproduce`` runs a recipe downloaded from the Hub, and ``inspect`` decodes a published
set with the tokenizer its recipe names (:func:`read_stranger_recipe`); a kept copy is refused by
``build`` and ``push`` (:func:`eagle3_raw.recipe.check_not_kept_copy`). What that recipe may decide
is the data: prompts, turns, tokenizer, template, sampling. What it may not:

- **where requests go and with which key.** Its whole ``server`` section is dropped (endpoints,
  ``api_key_env``, ``launch``, ``launch_args``, limits, timeouts); the server is the user's:
  ``--set server.endpoints=...`` (and ``server.*`` settings), or the built-in reference server
  when asked for explicitly (:attr:`Trust.reference_server`). Without either, nothing is sent.
- **which local files are read.** Every path it names (``prompts.source``, ``model.tokenizer``,
  ``model.chat_template``) resolves inside the downloaded folder: absolute paths, ``~``, ``..``
  and symbolic links that lead out are refused, naming the path; a Hub id that also names a path
  in the current folder is refused too (``datasets`` and ``transformers`` would read that folder).
- **which code runs.** ``model.trust_remote_code: true`` is honoured only with
  :attr:`Trust.trust_remote_code` and a pinned revision (a commit), and the plan says which code.

Settings the user gives (``--set``) are the user's own and apply as given; their relative paths
resolve from the current folder. :func:`describe` says, before anything is generated, what will
be sent where.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from eagle3_raw.errors import HubError, RecipeError
from eagle3_raw.limits import WALK_ENTRIES, check_recipe_file, check_yaml_size
from eagle3_raw.printable import printable
from eagle3_raw.recipe import (
    REFERENCE_TOKENIZER,
    Recipe,
    apply_overrides,
    parse_recipe,
    parse_set_args,
    read_yaml,
)
from eagle3_raw.redact import public_url

PATH_FIELDS = (("prompts", "source"), ("model", "tokenizer"), ("model", "chat_template"))
"""The recipe fields that name local files."""

_COMMIT = re.compile(r"[0-9a-f]{40}")
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


@dataclass(frozen=True)
class Trust:
    """What the user allows a stranger's recipe beyond its data (nothing, by default)."""

    reference_server: bool = False
    """Start the built-in reference server for the run (the recipe's ``launch`` is never read)."""
    trust_remote_code: bool = False
    """Honour the recipe's ``model.trust_remote_code: true`` (needs a pinned revision)."""
    pinned_commit: str | None = None
    """The commit the user named, if they named one (the recipe's own files are at it)."""


def load_stranger_recipe(
    path: Path, overrides: Mapping[str, Any] | Sequence[str] | None, trust: Trust
) -> Recipe:
    """The recipe file at ``path`` (a download), as data only: see the module docstring.

    RecipeError naming the field for a path that leads out of ``path``'s folder or for remote code
    not allowed; HubError when the user named no server.
    """
    check_recipe_file(path)
    raw = read_yaml(path)
    raw.setdefault("name", path.stem)
    check_yaml_size(raw, "recipe")
    folder = path.parent
    data = {key: value for key, value in raw.items() if key != "server"}
    for section, key in PATH_FIELDS:
        value = _section(data, section).get(key)
        if isinstance(value, str):
            confine(folder, f"{section}.{key}", value, may_be_hub_id=key != "chat_template")
    users = _users_settings(overrides)
    merged = _merge(data, users, trust)
    _check_remote_code(data, users, merged, trust, folder)
    recipe = parse_recipe(merged, base_dir=folder)
    recipe.fingerprint  # noqa: B018  (the downloaded files, digested now)
    return recipe


def read_stranger_recipe(path: Path, trust: Trust) -> Recipe:
    """The recipe file at ``path`` (a download) under the same rules, to read its set (``inspect``):
    its tokenizer and template only; nothing is built, so no server is named and none is started
    (the one in the result is a placeholder, the built-in reference server's)."""
    return load_stranger_recipe(path, None, Trust(True, trust.trust_remote_code, trust.pinned_commit))


def confine(folder: Path, field: str, value: str, *, may_be_hub_id: bool) -> None:
    """RecipeError unless ``value`` names something inside ``folder`` (a link that leads out
    included), or, where allowed, a Hub id that names nothing local."""
    if may_be_hub_id and value == REFERENCE_TOKENIZER and field == "model.tokenizer":
        return
    relative = PurePosixPath(value)
    if value.startswith("~") or relative.is_absolute() or ".." in relative.parts or "\\" in value:
        _outside(field, value, "a published recipe names files inside its own folder only")
    root = folder.resolve()
    target = folder / value
    if target.exists() or target.is_symlink():
        _check_inside(root, target, field, value)
        if field != "model.tokenizer" or target.is_dir():
            return  # used from the download (a tokenizer only as a folder)
    if not may_be_hub_id:
        return  # nothing there: the run reports the missing file
    here = Path(value)  # datasets and transformers look in the current folder for what is not local
    if here.exists() and not here.resolve().is_relative_to(root):
        _outside(field, value, "it is not in the download but is a path in your current folder")


def _check_inside(root: Path, target: Path, field: str, value: str) -> None:
    if not target.resolve().is_relative_to(root):
        _outside(field, value, "it is a link that leads out of the published recipe's folder")
    if not target.is_dir():
        return
    for count, (base, dirs, files) in enumerate(os.walk(target), start=1):
        if count > WALK_ENTRIES:
            _outside(field, value, f"a folder with more than {WALK_ENTRIES:,} subfolders")
        for name in (*dirs, *files):
            entry = Path(base, name)
            if not entry.resolve().is_relative_to(root):
                inner = entry.relative_to(target.parent).as_posix()
                _outside(field, inner, "it is a link that leads out of the published recipe's folder")


def _outside(field: str, value: str, why: str) -> None:
    raise RecipeError(field, printable(value, limit=200), f"refused: {why}")


def _users_settings(overrides: Mapping[str, Any] | Sequence[str] | None) -> dict[str, Any]:
    """The user's overrides as dotted paths, their relative local paths made absolute (from the
    current folder: they are the user's files, not the download's)."""
    items = parse_set_args(overrides) if isinstance(overrides, Sequence) else _dotted(overrides or {})
    for section, key in PATH_FIELDS:
        value = items.get(f"{section}.{key}")
        if isinstance(value, str) and value != REFERENCE_TOKENIZER and Path(value).expanduser().exists():
            items[f"{section}.{key}"] = str(Path(value).expanduser().absolute())
    return items


def _dotted(overrides: Mapping[str, Any]) -> dict[str, Any]:
    items: dict[str, Any] = {}
    for key, value in overrides.items():
        if isinstance(value, Mapping) and "." not in key:
            items.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            items[key] = value
    return items


def _merge(data: dict[str, Any], users: Mapping[str, Any], trust: Trust) -> dict[str, Any]:
    """The published data, the user's settings on top, and the user's server as the only one."""
    server = {k.split(".", 1)[1]: v for k, v in users.items() if k.startswith("server.")}
    if trust.reference_server:
        if server.get("endpoints"):
            raise HubError("--reference-server and --set server.endpoints: give one of them")
        server.setdefault("launch", "reference")
    if not server.get("endpoints") and server.get("launch") is None:
        raise HubError(
            "reproduce sends requests only to a server you name: --set server.endpoints=http://HOST:PORT "
            "(your SGLang server, serving the recipe's model), or --reference-server for the built-in one; "
            "the published recipe's server settings are never used"
        )
    merged = apply_overrides(data, {k: v for k, v in users.items() if not k.startswith("server.")})
    merged["server"] = server
    return merged


def _check_remote_code(
    data: Mapping[str, Any], users: Mapping[str, Any], merged: Mapping[str, Any], trust: Trust, folder: Path
) -> None:
    """RecipeError when the published ``trust_remote_code: true`` would run code not allowed."""
    model, published = _section(merged, "model"), _section(data, "model")
    if model.get("trust_remote_code") is not True or "model.trust_remote_code" in users:
        return  # off, or the user's own setting
    if not published.get("trust_remote_code"):
        return
    tokenizer = printable(str(model.get("tokenizer") or ""))
    if not trust.trust_remote_code:
        raise RecipeError(
            "model.trust_remote_code", True,
            f"the published recipe asks to run the Python code that comes with tokenizer {tokenizer!r}; "
            "refused unless you pass --trust-remote-code (read that code first), or "
            "--set model.trust_remote_code=false",
        )  # fmt: skip
    if not _pinned(model, trust, folder):
        raise RecipeError(
            "model.trust_remote_code", True,
            "--trust-remote-code needs the code pinned to a commit: a Hub tokenizer needs model.revision set "
            "to a 40-hex commit (--set model.revision=<commit>), a tokenizer inside the published repo "
            "needs the repo at a commit (reproduce org/name@<commit>)",
        )  # fmt: skip


def _section(raw: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = raw.get(name)
    return value if isinstance(value, Mapping) else {}


def _pinned(model: Mapping[str, Any], trust: Trust, folder: Path) -> bool:
    """A Hub tokenizer at a commit, or a tokenizer of the download with the download at one."""
    revision = model.get("revision")
    if isinstance(revision, str) and _COMMIT.fullmatch(revision):
        return True
    in_download = (folder / str(model.get("tokenizer") or "")).is_dir()
    return in_download and trust.pinned_commit is not None


def pinned_commit(revision: str | None, commit: str) -> str | None:
    """``commit`` when the user's revision names exactly it (the files are then the ones they named)."""
    return commit if revision is not None and revision == commit and _COMMIT.fullmatch(commit) else None


# --- what will happen ---------------------------------------------------------------------------------


def describe(recipe: Recipe, repo_id: str, commit: str, folder: Path) -> str:
    """What reproducing ``recipe`` sends where, reads and runs: printed before anything is generated."""
    server = recipe.server
    requests = (
        "the built-in reference server, started on 127.0.0.1 for the run (--reference-server)"
        if server.launch == "reference"
        else ", ".join(printable(public_url(url)) for url in server.endpoints)
        + " (your --set server.endpoints)"
    )
    key = f"from ${server.api_key_env} (yours)" if server.api_key_env else "none"
    lines = [
        f"reproducing       {repo_id}@{commit} config {printable(recipe.name)}",
        f"requests to       {requests}; API key: {key}",
        f"prompts           {_prompts(recipe, folder)}",
        f"tokenizer         {_tokenizer(recipe, folder)}",
        f"chat template     {_template(recipe, folder)}",
        f"code              {_code(recipe, folder)}",
        f"sampling          {printable(dict(recipe.sampling.request_params()), limit=300)}",
        "nothing else      no request to a server the published recipe names, no file read outside the "
        "download but those you named, no code run but the above",
    ]
    return "\n".join(lines)


def _inside(recipe: Recipe, value: str, folder: Path) -> str:
    path = recipe.resolve_path(value)
    try:
        return f"{path.relative_to(folder).as_posix()} (in the download)"
    except ValueError:
        return f"{printable(path)} (yours)"


def _prompts(recipe: Recipe, folder: Path) -> str:
    p = recipe.prompts
    if recipe.resolve_path(p.source).exists():
        return _inside(recipe, p.source, folder)
    return f"Hub dataset {printable(p.source)} (split {printable(p.split)}, revision {printable(p.revision)})"


def _tokenizer(recipe: Recipe, folder: Path) -> str:
    m = recipe.model
    if m.tokenizer == REFERENCE_TOKENIZER:
        return "the reference model's (shipped with eagle3_raw)"
    if recipe.resolve_path(m.tokenizer).is_dir():
        return _inside(recipe, m.tokenizer, folder)
    return f"Hub model {printable(m.tokenizer)} at revision {printable(m.revision or 'main')}"


def _template(recipe: Recipe, folder: Path) -> str:
    template = recipe.model.chat_template
    return "the tokenizer's own" if template is None else _inside(recipe, template, folder)


def _code(recipe: Recipe, folder: Path) -> str:
    m = recipe.model
    if not m.trust_remote_code:
        return "none (trust_remote_code is false)"
    local = recipe.resolve_path(m.tokenizer)
    if local.is_dir():
        files = sorted(local.rglob("*.py"))
        listed = ", ".join(f"{f.relative_to(folder).as_posix()} sha256 {_sha256(f)[:16]}" for f in files)
        return f"RUNS the tokenizer's Python code: {listed or 'no .py file'}"
    return f"RUNS the Python code of Hub model {printable(m.tokenizer)} at commit {printable(m.revision)}"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
