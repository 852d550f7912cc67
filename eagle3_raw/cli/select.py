"""``eagle3-raw select RECIPE --name NEW --out FILE [rules]``: write a derived recipe, the recipe with
a ``select`` section (:mod:`eagle3_raw.selection`); ``eagle3-raw build``/``push``/``export`` of the
file then make, publish and export the derived set. One option per rule, from the rules' own
declarations (:class:`~eagle3_raw.recipe.schema.SelectConfig`), checked as the recipe checks them."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import yaml

from eagle3_raw.cli.common import EXIT_OK, add_recipe_arguments
from eagle3_raw.errors import LocalFileError, RecipeError
from eagle3_raw.printable import printable
from eagle3_raw.recipe import apply_overrides, find_recipe_file, parse_recipe, read_yaml
from eagle3_raw.recipe.parsing import declared_fields
from eagle3_raw.recipe.schema import SelectConfig
from eagle3_raw.yaml_text import load_yaml

_PATHS = (("prompts", "source"), ("model", "tokenizer"), ("model", "chat_template"))
"""The recipe fields that name local files, relative to the recipe's folder."""


def add_select(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``select`` subcommand."""
    parser = sub.add_parser(
        "select",
        help="write a derived recipe: the recipe's set, only the rows some rules keep",
        description="Write OUT: RECIPE with a select section (and the name NEW), whose set holds the "
        "rows of RECIPE's set that every rule keeps; build, push or export OUT like any recipe.",
    )
    add_recipe_arguments(parser)
    parser.add_argument("--name", required=True, help="the derived recipe's name (its config name)")
    parser.add_argument("--out", type=Path, required=True, help="the derived recipe file to write")
    parser.add_argument("--force", action="store_true", help="replace OUT if it exists")
    for name, spec, _default in declared_fields(SelectConfig):
        flag = "--" + name.replace("_", "-")
        if spec.kind == "flag":
            parser.add_argument(flag, dest=f"rule_{name}", action="store_true", default=None, help=spec.help)
        elif name == "finish_reasons":
            parser.add_argument(flag, dest=f"rule_{name}", nargs="+", choices=spec.choices, help=spec.help)
        else:
            parser.add_argument(flag, dest=f"rule_{name}", type=load_yaml, metavar="VALUE", help=spec.help)
    parser.set_defaults(handler=_select_command)


def _select_command(args: argparse.Namespace) -> int:
    source = find_recipe_file(args.recipe)
    rules = {name.removeprefix("rule_"): value for name, value in vars(args).items()
             if name.startswith("rule_") and value is not None}  # fmt: skip
    text = derived_recipe(source, args.out, args.name, rules, args.overrides)
    if args.out.exists() and not args.force:
        raise LocalFileError(f"{args.out} exists: choose another --out, or --force to replace it")
    args.out.write_text(text, encoding="utf-8")
    shown = ", ".join(f"{key}={value}" for key, value in rules.items()) or "none"
    print(f"wrote {printable(args.out)}: recipe {printable(args.name)}, the rows of "
          f"{printable(source.stem)}'s set that these rules keep: {printable(shown)}")  # fmt: skip
    print(f"build it: eagle3-raw build {printable(args.out)}")
    return EXIT_OK


def derived_recipe(
    source: Path, out: Path, name: str, rules: dict[str, Any], overrides: list[str] | None = None
) -> str:
    """The YAML of ``source``'s recipe named ``name`` with ``rules`` over its ``select`` section, to
    be written at ``out`` (relative local paths rewritten to resolve from there). Checked: a bad
    rule is a RecipeError naming ``select.<rule>``, and a set of rules that selects nothing is refused."""
    raw = apply_overrides(read_yaml(source), overrides or [])
    raw["name"] = name
    raw["select"] = {**(raw.get("select") or {}), **rules}
    recipe = parse_recipe(raw, base_dir=source.parent)
    if not recipe.select.active:
        raise RecipeError(
            "select",
            {},
            "give at least one rule (eagle3-raw select -h lists them): without "
            "one the derived set is its parent",
        )
    for section, key in _PATHS:
        value = (raw.get(section) or {}).get(key)
        if isinstance(value, str) and (source.parent / value).exists() and not Path(value).is_absolute():
            target = (source.parent / value).resolve()
            raw[section][key] = os.path.relpath(target, out.absolute().parent)
    return yaml.safe_dump(raw, sort_keys=False, allow_unicode=True)
