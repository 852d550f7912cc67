"""The generic recipe reader (issue 23): a field declared once (type, default, what it allows) is
read, checked and defaulted by :func:`eagle3_raw.recipe.parsing.build` with no parsing code of its
own; and every field of the recipe's sections is declared."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import pytest

from eagle3_raw.errors import RecipeError
from eagle3_raw.recipe import schema
from eagle3_raw.recipe.fields import choice, flag, integer, mapping, seconds, section, spec_of, strings, text
from eagle3_raw.recipe.parsing import build


@dataclass(frozen=True)
class Inner:
    size: int = field(default=2, metadata=integer(minimum=1, maximum=8))


@dataclass(frozen=True)
class Example:
    source: str = field(metadata=text("a path"))
    mode: str = field(default="a", metadata=choice(("a", "b")))
    quiet: bool = field(default=False, metadata=flag())
    wait: float = field(default=5.0, metadata=seconds())
    tags: tuple[str, ...] = field(default=(), metadata=strings())
    extra: dict[str, Any] = field(default_factory=dict, metadata=mapping())
    inner: Inner = field(default_factory=Inner, metadata=section(Inner, required=False))


def _error(raw: dict[str, Any]) -> str:
    with pytest.raises(RecipeError) as caught:
        build(Example, raw, "ex.")
    return str(caught.value)


def test_a_declared_field_is_read_with_its_default() -> None:
    assert build(Example, {"source": "p"}, "ex.") == Example(source="p")
    made = build(Example, {"source": "p", "mode": "b", "tags": ["x"], "wait": 1, "inner": {"size": 8}}, "ex.")
    assert (made.mode, made.tags, made.wait, made.inner.size) == ("b", ("x",), 1.0, 8)
    assert build(Example, {"source": "p", "quiet": None, "extra": None}, "ex.").extra == {}


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({}, "recipe field 'ex.source': got None; required: a path"),
        ({"source": 3}, "recipe field 'ex.source': got 3; expected a path"),
        ({"source": "p", "mod": "a"}, "recipe field 'ex.mod': got 'a'; unknown field (did you mean 'mode'?); "
         "allowed: extra, inner, mode, quiet, source, tags, wait"),
        ({"source": "p", "mode": None}, "recipe field 'ex.mode': got None; expected one of: a, b"),
        ({"source": "p", "quiet": 1}, "recipe field 'ex.quiet': got 1; expected true or false"),
        ({"source": "p", "wait": 0}, "recipe field 'ex.wait': got 0; expected a positive number of seconds"),
        ({"source": "p", "tags": [1]}, "recipe field 'ex.tags': got [1]; expected a list of strings (quote "
         'numbers: "8")'),
        ({"source": "p", "inner": 3}, "recipe field 'ex.inner': got 3; expected a mapping (a YAML section)"),
        ({"source": "p", "inner": {"size": 0}}, "recipe field 'ex.inner.size': got 0; expected an integer "
         ">= 1"),
        ({"source": "p", "inner": {"size": 9}}, "recipe field 'ex.inner.size': got 9; expected an integer "
         "from 1 to 8"),
        ({"source": "p", "inner": {"size": True}}, "recipe field 'ex.inner.size': got True; expected an "
         "integer >= 1"),
    ],
)  # fmt: skip
def test_a_declared_field_refuses_what_it_does_not_allow(raw: dict[str, Any], message: str) -> None:
    assert _error(raw) == message


SECTIONS = [
    schema.PromptsConfig, schema.ModelConfig, schema.SGLangLaunch, schema.ServerConfig,
    schema.MixtureComponent, schema.SamplingConfig, schema.RolloutConfig, schema.ExportConfig, schema.Recipe,
]  # fmt: skip


@pytest.mark.parametrize("cls", SECTIONS, ids=[cls.__name__ for cls in SECTIONS])
def test_every_recipe_field_is_declared(cls: type[Any]) -> None:
    undeclared = [f.name for f in dataclasses.fields(cls) if spec_of(f.metadata) is None]
    assert undeclared == (["base_dir"] if cls is schema.Recipe else [])
