"""YAML as recipes read it: PyYAML's safe loader, stricter where a silent choice would hurt.

- A mapping key given twice (a second ``sampling:`` section, a repeated field) is refused with the
  line of the second one: PyYAML would silently keep the last, replacing the whole first section.
- A value that looks like a date but is none (``2024-13-45``) stays a string for the recipe's own
  check to name, instead of a ``ValueError`` from inside PyYAML.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import yaml

__all__ = ["load_yaml"]


class _RecipeLoader(yaml.SafeLoader):
    """:class:`yaml.SafeLoader` that refuses duplicate keys and keeps impossible dates as text."""


def _mapping(loader: _RecipeLoader, node: yaml.MappingNode) -> Iterator[dict[Any, Any]]:
    """SafeConstructor's ``construct_yaml_map`` (a generator: aliases may refer to the mapping)
    after the duplicate check: of the mapping's own keys (one merged in with ``<<`` may be
    overridden on purpose)."""
    seen: dict[Any, yaml.Node] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            first = seen.get(key)
        except TypeError:  # an unhashable key: construct_mapping says so, with its mark
            break
        if first is not None:
            raise yaml.constructor.ConstructorError(
                "while reading a mapping", node.start_mark,
                f"the key {key!r} is given twice (first on line {first.start_mark.line + 1}); a repeated "
                "key would silently replace the first one: merge them into one",
                key_node.start_mark,
            )  # fmt: skip
        seen[key] = key_node
    data: dict[Any, Any] = {}
    yield data
    data.update(loader.construct_mapping(node))


def _timestamp(loader: _RecipeLoader, node: yaml.ScalarNode) -> Any:
    try:
        return loader.construct_yaml_timestamp(node)
    except ValueError:  # 2024-13-45: date-shaped, not a date; the field's own check names it
        return loader.construct_scalar(node)


_RecipeLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)
_RecipeLoader.add_constructor("tag:yaml.org,2002:timestamp", _timestamp)


def load_yaml(text: str) -> Any:
    """``text`` parsed as :func:`yaml.safe_load` does, with the rules in the module docstring; raises
    :class:`yaml.YAMLError` (a :class:`yaml.MarkedYAMLError` with the line) for bad YAML."""
    return yaml.load(text, Loader=_RecipeLoader)  # a SafeLoader subclass: no tags that run code
