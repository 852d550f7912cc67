"""The one recipe reader: :func:`build` makes a dataclass of :mod:`eagle3_raw.recipe.schema` from a
mapping by walking its declared fields (:mod:`eagle3_raw.recipe.fields`) in order.

For each field it refuses unknown keys (with a did-you-mean), checks the type, bounds and choices,
reads nested sections, fills in defaults, and runs the field's own rules; then the object's
``check()`` (rules over the whole section). Every error is a :class:`RecipeError` naming the field's
dotted path, the value given and what is allowed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeVar, cast

from eagle3_raw.errors import RecipeError
from eagle3_raw.recipe.fields import MISSING, Spec, did_you_mean, is_int, is_number, spec_of

T = TypeVar("T")

REQUIRED: Final = object()
"""The default of a dataclass field that has none."""

SECTION_ALLOWED = "expected a mapping (a YAML section)"


@dataclass(frozen=True)
class At:
    """Where a field is read: its section's prefix (``server.sglang.``), its name, its spec and
    default, the fields of its section read before it, the names its section declares (``own``), and
    what the enclosing section passed down (``context``)."""

    prefix: str
    name: str
    spec: Spec
    default: Any
    parsed: Mapping[str, Any]
    own: frozenset[str]
    context: Mapping[str, Any]

    @property
    def path(self) -> str:
        """The field's dotted path, as errors name it."""
        return f"{self.prefix}{self.name}"

    def as_kind(self, value: Any) -> Any:
        """``value`` read as the spec's kind says (for a field whose own rules start from it)."""
        return read_kind(value, self)

    def build(self, raw: Mapping[str, Any], prefix: str, context: Mapping[str, Any] | None = None) -> Any:
        """The spec's section class built from ``raw`` (its fields named ``prefix`` + name)."""
        assert self.spec.section is not None
        return build(self.spec.section, raw, prefix, context=context)


def declared_fields(cls: type[Any]) -> list[tuple[str, Spec, Any]]:
    """``cls``'s recipe fields in order: name, spec, default (REQUIRED when it has none)."""
    found = []
    for item in dataclasses.fields(cls):
        spec = spec_of(item.metadata)
        if spec is None:
            continue
        default: Any = item.default
        if item.default_factory is not dataclasses.MISSING:
            default = item.default_factory()
        found.append((item.name, spec, REQUIRED if default is dataclasses.MISSING else default))
    return found


def build(
    cls: type[T], raw: Mapping[str, Any], prefix: str = "", *, context: Mapping[str, Any] | None = None,
    **given: Any,
) -> T:  # fmt: skip
    """``cls`` read from ``raw``: each declared field in order, then ``check()`` when ``cls`` has one.

    Keys ``cls`` does not declare are refused unless a field takes the rest (``Spec.rest``);
    ``given`` are fields that are not read from the recipe (``base_dir``).
    """
    fields = declared_fields(cls)
    own = frozenset(name for name, spec, _ in fields if not spec.rest)
    if not any(spec.rest for _, spec, _ in fields):
        check_keys(prefix, raw, own)
    parsed: dict[str, Any] = {}
    for name, spec, default in fields:
        at = At(prefix, name, spec, default, parsed, own, context or {})
        value = {k: v for k, v in raw.items() if k not in own} if spec.rest else raw.get(name, MISSING)
        parsed[name] = spec.convert(value, at) if spec.convert is not None else read_kind(value, at)
        if spec.check is not None:
            spec.check(parsed[name], at)
    made = cast(Callable[..., T], cls)(**parsed, **given)
    check: Callable[[], None] | None = getattr(made, "check", None)
    if check is not None:
        check()
    return made


def check_keys(prefix: str, raw: Mapping[str, Any], allowed: frozenset[str]) -> None:
    """RecipeError for the first key of ``raw`` not in ``allowed`` (with a did-you-mean)."""
    for key in raw:
        if key not in allowed:
            raise RecipeError(
                f"{prefix}{key}", raw[key],
                f"unknown field{did_you_mean(key, allowed)}; allowed: {', '.join(sorted(allowed))}",
            )  # fmt: skip


def read_section(value: Any, at: At, *, required: bool) -> Mapping[str, Any]:
    """A section's mapping: a missing or null one is ``{}`` unless ``required``."""
    if (value is MISSING or value is None) and not required:
        return {}
    if not isinstance(value, Mapping):
        raise RecipeError(at.path, None if value is MISSING else value, SECTION_ALLOWED)
    return value


def read_kind(value: Any, at: At) -> Any:
    """``value`` read as its spec's kind: a missing (or, but for seconds and choices, null) value
    is the default, refused as "required" when there is none."""
    spec = at.spec
    if spec.kind == "section":
        required = spec.required if spec.required is not None else at.default is REQUIRED
        return at.build(read_section(value, at, required=required), f"{at.path}.")
    if spec.kind in ("seconds", "choice"):  # a null here is a value, and refused unless allowed
        value = at.default if value is MISSING else value
    elif value is MISSING or value is None:
        if at.default is REQUIRED or spec.required:
            raise RecipeError(at.path, None, f"required: {spec.allowed}")
        return at.default
    return _READERS[spec.kind](value, at)


def _expect(kind: type[Any]) -> Callable[[Any, At], Any]:
    def read(value: Any, at: At) -> Any:
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            raise RecipeError(at.path, value, f"expected {at.spec.allowed}")
        return value

    return read


def _integer(value: Any, at: At) -> int:
    minimum = at.spec.minimum if at.spec.minimum is not None else 0
    if not is_int(value) or value < minimum:
        raise RecipeError(at.path, value, f"expected an integer >= {minimum}")
    maximum = at.spec.maximum
    if maximum is not None and value > maximum:
        raise RecipeError(at.path, value, f"expected an integer from {minimum} to {maximum}")
    return int(value)


def _seconds(value: Any, at: At) -> float:
    if not is_number(value) or value <= 0:
        raise RecipeError(at.path, value, "expected a positive number of seconds")
    return float(value)


def _choice(value: Any, at: At) -> Any:
    if value not in at.spec.choices:
        shown = ", ".join("null" if a is None else str(a) for a in at.spec.choices)
        raise RecipeError(at.path, value, f"expected one of: {shown}")
    return value


def _strings(value: Any, at: At) -> tuple[str, ...]:
    items = _expect(list)(value, at)
    if not all(isinstance(v, str) for v in items):
        raise RecipeError(at.path, items, 'expected a list of strings (quote numbers: "8")')
    return tuple(items)


def _mapping(value: Any, at: At) -> dict[Any, Any]:
    return dict(_expect(dict)(value, at))


def _custom(value: Any, at: At) -> Any:
    raise AssertionError(f"{at.path}: a custom field has no kind to read it as")


_READERS: Mapping[str, Callable[[Any, At], Any]] = {
    "text": _expect(str),
    "flag": _expect(bool),
    "int": _integer,
    "seconds": _seconds,
    "choice": _choice,
    "mapping": _mapping,
    "list": _expect(list),
    "strings": _strings,
    "custom": _custom,
}
