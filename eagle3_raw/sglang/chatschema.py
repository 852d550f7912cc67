"""Tool ``parameters`` as SGLang 0.5.23 checks them before rendering (``serving_chat.py:1160``).

Each tool's schema (request tools, then message-level tools) has its DB/ORM-style ``type`` names
rewritten in place (``function_call/utils.py:113``: ``varchar`` -> ``string``, ``int64`` ->
``integer``, ``list[str]`` -> ``array``, ...), which is also what the template then prints, and is
then checked with ``jsonschema``'s Draft 2020-12 meta-schema; an invalid one is refused with
``Tool {i} function has invalid 'parameters' schema: ...``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from eagle3_raw.sglang.chatrequest import ChatRequestError

_STANDARD = {"null", "boolean", "object", "array", "number", "string", "integer"}
_ALIASES = {
    **dict.fromkeys(("str", "text", "varchar", "char", "enum", "uuid", "date", "datetime", "time",
                     "timestamp", "binary", "blob", "bytea", "bytes", "varbinary"), "string"),
    "bool": "boolean", "bigint": "integer", "smallint": "integer", "tinyint": "integer",
    **dict.fromkeys(("double", "decimal", "real", "numeric"), "number"),
    **dict.fromkeys(("arr", "tuple", "set"), "array"), "map": "object",
}  # fmt: skip
_PREFIXES = (
    (("int", "uint", "long", "short", "unsigned"), "integer"),
    (("num", "float"), "number"),
    (("list",), "array"),
    (("dict",), "object"),
)
_BOUNDARY = frozenset("0123456789[<( \t")
_MAP_KEYS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_LIST_KEYS = ("anyOf", "oneOf", "allOf", "prefixItems")
_ONE_KEYS = ("items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames",
             "unevaluatedItems", "unevaluatedProperties")  # fmt: skip


def check_tool_schemas(tools: Sequence[dict[str, Any]]) -> None:
    """Rewrite and check every tool's ``parameters`` in place; raises :class:`ChatRequestError`."""
    from jsonschema import Draft202012Validator, SchemaError

    for i, tool in enumerate(tools):
        parameters = tool["function"].get("parameters")
        if parameters is None:
            continue
        try:
            normalize_schema_types(parameters)
            Draft202012Validator.check_schema(parameters)
        except SchemaError as exc:
            raise ChatRequestError(f"Tool {i} function has invalid 'parameters' schema: {exc}") from exc
        except RecursionError as exc:
            raise ChatRequestError(
                f"Tool {i} function 'parameters' schema is too deeply nested or contains a cycle."
            ) from exc


def normalize_schema_types(schema: Any) -> None:
    """SGLang's ``normalize_json_schema_types``: non-standard ``type`` values rewritten, in place."""
    if isinstance(schema, list):
        for item in schema:
            normalize_schema_types(item)
        return
    if not isinstance(schema, dict):
        return
    kind = schema.get("type")
    if isinstance(kind, str):
        schema["type"] = _one_type(kind)
    elif isinstance(kind, list):
        schema["type"] = _type_list(kind)
    for key in _MAP_KEYS:
        if isinstance(schema.get(key), dict):
            for value in schema[key].values():
                normalize_schema_types(value)
    for key in _LIST_KEYS:
        if isinstance(schema.get(key), list):
            for value in schema[key]:
                normalize_schema_types(value)
    for key in _ONE_KEYS:
        if key in schema:
            normalize_schema_types(schema[key])


def _type_list(kinds: list[Any]) -> list[Any]:
    out: list[Any] = []
    for kind in kinds:
        mapped = _one_type(kind)
        if mapped not in out:
            out.append(mapped)
    return out


def _one_type(raw: Any) -> Any:
    if not isinstance(raw, str) or raw in _STANDARD:
        return raw
    base = raw.split("(", 1)[0].strip().lower()
    if base in _STANDARD:
        return base
    if base in _ALIASES:
        return _ALIASES[base]
    for prefixes, target in _PREFIXES:
        if any(base == p or (base.startswith(p) and len(base) > len(p) and base[len(p)] in _BOUNDARY)
               for p in prefixes):  # fmt: skip
            return target
    return raw
