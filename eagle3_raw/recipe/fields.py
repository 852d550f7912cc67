"""Declared recipe fields: what each dataclass field of :mod:`eagle3_raw.recipe.schema` takes.

A field is declared once, where its dataclass declares it: ``x: int = field(default=1,
metadata=integer(minimum=1, help=...))``. The :class:`Spec` in its metadata says how
:func:`eagle3_raw.recipe.parsing.build` reads it from a recipe mapping (its kind, what is allowed,
bounds, choices, a nested section) and what ``help`` says of it.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal

if TYPE_CHECKING:  # parsing reads these specs: its At only as a type here, no import circle
    from eagle3_raw.recipe.parsing import At

Kind = Literal["text", "flag", "int", "seconds", "choice", "mapping", "list", "strings", "section", "custom"]
"""How a field's value is read (see :func:`eagle3_raw.recipe.parsing.read_kind`)."""

SPEC: Final = "eagle3_raw.spec"
"""The key of a dataclass field's metadata that holds its :class:`Spec`."""


class _Missing:
    """The value of a field the recipe does not give (unlike ``None``, a YAML null)."""

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Final = _Missing()


@dataclass(frozen=True)
class Spec:
    """How one recipe field is read.

    ``allowed`` completes "required: ..." and "expected ..." in errors; ``required`` (None: when the
    dataclass field has no default) says a missing or null value is refused; ``convert`` replaces
    the kind's reading for a field with rules of its own; ``check`` runs after it, with the
    fields read before it; ``rest``: the field takes every key the section does not declare.
    """

    kind: Kind
    allowed: str = ""
    help: str = ""
    required: bool | None = None
    minimum: int | None = None
    maximum: int | None = None
    choices: tuple[Any, ...] = ()
    section: type[Any] | None = None
    convert: Callable[[Any, At], Any] | None = None
    check: Callable[[Any, At], None] | None = None
    rest: bool = False


def _spec(kind: Kind, **values: Any) -> dict[str, Spec]:
    return {SPEC: Spec(kind, **values)}


def text(allowed: str = "a string", *, help: str = "", **more: Any) -> dict[str, Spec]:
    """A string (``allowed`` names what it means, e.g. "a branch, tag or commit")."""
    return _spec("text", allowed=allowed, help=help, **more)


def flag(*, help: str = "") -> dict[str, Spec]:
    """``true`` or ``false``."""
    return _spec("flag", allowed="true or false", help=help)


def integer(*, minimum: int, maximum: int | None = None, help: str = "") -> dict[str, Spec]:
    """An integer from ``minimum`` (to ``maximum``, when given)."""
    return _spec("int", minimum=minimum, maximum=maximum, help=help)


def seconds(*, help: str = "", **more: Any) -> dict[str, Spec]:
    """A positive number of seconds (a null is refused, not the default)."""
    return _spec("seconds", help=help, **more)


def choice(choices: Iterable[Any], *, help: str = "", **more: Any) -> dict[str, Spec]:
    """One of ``choices`` (a null is refused unless None is one of them)."""
    return _spec("choice", choices=tuple(choices), help=help, **more)


def mapping(allowed: str = "a mapping", *, help: str = "", **more: Any) -> dict[str, Spec]:
    """A YAML mapping (a null: the default)."""
    return _spec("mapping", allowed=allowed, help=help, **more)


def strings(*, help: str = "") -> dict[str, Spec]:
    """A list of strings, kept as a tuple."""
    return _spec("strings", allowed="a list of strings", help=help)


def section(cls: type[Any], *, required: bool = True, help: str = "", **more: Any) -> dict[str, Spec]:
    """A nested section read into ``cls`` (missing and not ``required``: read from ``{}``)."""
    return _spec("section", section=cls, required=required, help=help, **more)


def custom(
    convert: Callable[[Any, At], Any],
    allowed: str = "",
    *,
    kind: Kind = "custom",
    help: str = "",
    **more: Any,
) -> dict[str, Spec]:
    """A field with rules of its own: ``convert(value, at)`` reads it (``value`` may be MISSING);
    ``kind``: the reading ``at.as_kind`` gives it, when its rules start from one."""
    return _spec(kind, allowed=allowed, convert=convert, help=help, **more)


def spec_of(metadata: Mapping[str, Any]) -> Spec | None:
    """The :class:`Spec` in a dataclass field's metadata (None: not a recipe field)."""
    found = metadata.get(SPEC)
    return found if isinstance(found, Spec) else None


def did_you_mean(key: object, known: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for a near miss of one of ``known``, else ``""``."""
    close = difflib.get_close_matches(str(key), list(known), n=1, cutoff=0.75)
    return f" (did you mean {close[0]!r}?)" if close else ""


def is_int(value: Any) -> bool:
    """An integer, not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A finite integer or float, not a bool."""
    return (is_int(value) or isinstance(value, float)) and math.isfinite(value)
