"""Loading a recipe: find its file (a path, or a bundled recipe's name), read its YAML, apply the
``--set`` overrides, refuse a stranger's kept copy, and parse it (:func:`parse_recipe`)."""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from eagle3_raw.errors import RecipeError, RecipeFileError
from eagle3_raw.limits import check_plain_values, check_recipe_file, check_yaml_size
from eagle3_raw.printable import printable
from eagle3_raw.recipe.fingerprint import recipe_to_dict
from eagle3_raw.recipe.parsing import build, declared_fields
from eagle3_raw.recipe.schema import Recipe
from eagle3_raw.resources import builder_scripts_dir
from eagle3_raw.yaml_text import load_yaml

log = logging.getLogger("eagle3_raw")


def load_recipe(
    source: str | Path | Mapping[str, Any] | Recipe,
    overrides: Mapping[str, Any] | Sequence[str] | None = None,
) -> Recipe:
    """Load a recipe from a YAML path, a bundled recipe name, a mapping, or a :class:`Recipe`.

    ``overrides`` is either ``["a.b=yaml-value", ...]`` (the CLI's ``--set``) or a mapping whose keys
    are dotted paths (``{"sampling.temperature": 0}``) or section names with mapping values
    (``{"sampling": {"temperature": 0}}``, merged into the section).
    """
    if isinstance(source, Recipe):
        if not overrides:
            return source  # already validated and fingerprinted: no second pass over the files
        raw, base_dir = recipe_to_dict(source), source.base_dir
    elif isinstance(source, Mapping):
        raw, base_dir = copy.deepcopy(dict(source)), Path.cwd()
    else:
        path = find_recipe_file(source)
        check_not_kept_copy(path)
        check_recipe_file(path)
        raw, base_dir = read_yaml(path), path.parent
        raw.setdefault("name", path.stem)
    items = _override_items(overrides or {})
    recipe = parse_recipe(_one_server_kind(_apply_items(raw, items), items), base_dir=base_dir)
    recipe.fingerprint  # noqa: B018  (computed now, from the files as they are at load time)
    return recipe


KEPT_COPY_MARK = ".eagle3_raw-published-recipes"
"""The file marking a folder of recipes downloaded from the Hub (a stranger's, kept by ``reproduce``)."""


def mark_kept_copy(folder: Path, origin: str) -> None:
    """Mark ``folder`` (before anything is downloaded into it) as holding a stranger's recipes from
    ``origin`` (``org/name@commit``): :func:`load_recipe` refuses every recipe file below it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / KEPT_COPY_MARK).write_text(origin + "\n", encoding="utf-8")


def check_not_kept_copy(path: Path) -> None:
    """RecipeFileError when ``path`` lies in a folder :func:`mark_kept_copy` marked: a published
    recipe runs only through ``reproduce``, whose rules keep its server, key, launcher and code out."""
    for folder in path.absolute().parents:
        mark = folder / KEPT_COPY_MARK
        if mark.is_file() and not mark.is_symlink() and mark.stat().st_uid == os.getuid():  # ours only
            origin = mark.read_bytes()[:200].decode("utf-8", errors="replace").strip() or "the Hub"
            raise RecipeFileError(
                str(path),
                f"a published recipe (from {printable(origin)}) kept by `eagle3-raw reproduce`; a stranger's "
                f"recipe is data and runs only as `eagle3-raw reproduce {printable(origin)}` (with your "
                "server). To make it your own recipe, copy it out of that folder, read its server, "
                "model.trust_remote_code and paths, and build the copy",
            )  # fmt: skip


def find_recipe_file(source: str | Path) -> Path:
    """A recipe path as given, else a recipe bundled in ``builder_scripts`` by file name or stem."""
    path = Path(source).expanduser()
    if path.is_file():
        return path.resolve()
    bundled = builder_scripts_dir()
    for candidate in (bundled / path.name, bundled / f"{path.name}.yaml"):
        if not path.parent.parts and candidate.is_file():
            return candidate
    names = ", ".join(sorted(p.stem for p in bundled.glob("*.yaml"))) or "none"
    where = "no such file" if not path.exists() else "not a file"
    raise RecipeFileError(str(source), f"{where}, and no bundled recipe has that name (bundled: {names})")


def read_yaml(path: Path) -> dict[str, Any]:
    """A YAML file holding a mapping; errors name the file (and the line, for bad YAML)."""
    try:
        data = load_yaml(path.read_bytes().decode("utf-8"))
    except OSError as exc:
        raise RecipeFileError(str(path), f"cannot read it ({exc.strerror or exc})") from exc
    except UnicodeDecodeError as exc:
        problem = (
            f"not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}); save it as UTF-8"
        )
        raise RecipeFileError(str(path), problem) from exc
    except yaml.YAMLError as exc:
        raise RecipeFileError(str(path), f"not valid YAML ({yaml_problem(exc)})") from exc
    except (ValueError, OverflowError) as exc:  # a value YAML cannot make (an integer of 5,000 digits)
        raise RecipeFileError(str(path), f"not valid YAML ({printable(exc, limit=200)})") from exc
    if not isinstance(data, dict):
        raise RecipeFileError(
            str(path), f"expected a YAML mapping at the top level, got {type(data).__name__}"
        )
    return data


def yaml_problem(exc: yaml.YAMLError) -> str:
    """One line saying what is wrong with a YAML text, and where (1-based line and column)."""
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        return f"{where}{exc.problem or exc.context or 'cannot parse it'}"
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def apply_overrides(raw: dict[str, Any], overrides: Mapping[str, Any] | Sequence[str]) -> dict[str, Any]:
    """``raw`` with the overrides applied (see :func:`load_recipe`); ``raw`` is not modified."""
    return _apply_items(raw, _override_items(overrides))


def _apply_items(raw: dict[str, Any], items: Sequence[tuple[str, Any]]) -> dict[str, Any]:
    """A copy of ``raw`` with each dotted path set to its value."""
    result = copy.deepcopy(raw)
    for dotted, value in items:
        _set_path(result, dotted.split("."), value)
    return result


def parse_set_args(items: Sequence[str]) -> dict[str, Any]:
    """``["a.b=yaml-value", ...]`` (the CLI's ``--set``) as a mapping of dotted paths to values."""
    return dict(_override_items(items))


def _override_items(overrides: Mapping[str, Any] | Sequence[str]) -> list[tuple[str, Any]]:
    """Overrides (a mapping, or ``--set`` items) as dotted paths and values, in order."""
    if isinstance(overrides, Mapping):
        return [(k, v) for key, value in overrides.items() for k, v in _flatten(key, value)]
    items = []
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise RecipeError("--set", item, "expected KEY=VALUE, e.g. sampling.temperature=0.7")
        try:
            value = load_yaml(text)
        except (yaml.YAMLError, ValueError, OverflowError) as exc:  # ValueError: an int of 5,000 digits
            problem = yaml_problem(exc) if isinstance(exc, yaml.YAMLError) else printable(exc, limit=120)
            allowed = f"VALUE is not valid YAML ({problem}); quote a string, e.g. key='[text'"
            raise RecipeError("--set", printable(item, limit=200), allowed) from exc
        items.append((key.strip(), value))
    return items


_SERVER_KINDS = ("server.endpoints", "server.launch")


def _one_server_kind(raw: dict[str, Any], items: Sequence[tuple[str, Any]]) -> dict[str, Any]:
    """``raw`` where an override of ``server.endpoints`` (or ``server.launch``) replaces the recipe's
    other kind of server: ``--set server.endpoints=[...]`` on a recipe that launches the reference
    server sends every request to the given endpoints, and launches nothing (a notice says so)."""
    given = {key for key, value in items if key in _SERVER_KINDS and value not in (None, [], "")}
    if len(given) != 1:
        return raw
    (kept,) = given
    dropped = next(k for k in _SERVER_KINDS if k != kept).split(".")[1]
    server = raw.get("server")
    if not isinstance(server, dict) or server.get(dropped) in (None, [], ""):
        return raw
    log.info("%s is overridden: the recipe's server.%s (%r) is not used", kept, dropped, server[dropped])
    unused = {name: None for name in ("sglang", "vllm") if kept == "server.endpoints" and name in server}
    return {**raw, "server": {**server, dropped: None, **unused}}


_SECTIONS = frozenset(name for name, spec, _ in declared_fields(Recipe) if spec.section is not None)
"""The recipe's sections: an override ``{"sampling": {...}}`` is merged into its section."""


def _flatten(key: str, value: Any) -> list[tuple[str, Any]]:
    """An override as dotted paths and values (a section's mapping: one path per key)."""
    if isinstance(value, Mapping) and key in _SECTIONS:
        return [(f"{key}.{k}", v) for k, v in value.items()]
    return [(key, value)]


def _set_path(target: dict[str, Any], parts: list[str], value: Any) -> None:
    """``target`` with the value at ``parts`` set (sections made on the way)."""
    for part in parts[:-1]:
        child = target.setdefault(part, {})
        if not isinstance(child, dict):
            raise RecipeError(".".join(parts), value, f"{part!r} is not a section")
        target = child
    target[parts[-1]] = value


def parse_recipe(raw: Mapping[str, Any], *, base_dir: Path) -> Recipe:
    """Validate raw recipe data. Every error names the field, the bad value and what is allowed.

    Bounds (:mod:`eagle3_raw.limits`) come first and last: the data's expanded size before anything
    walks it, numeric maxima and the local files' sizes before any of them is read
    (:meth:`Recipe.check`).
    """
    check_yaml_size(raw, "recipe")
    check_plain_values(raw)
    return build(Recipe, raw, base_dir=base_dir)
