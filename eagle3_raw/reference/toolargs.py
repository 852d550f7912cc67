"""The request's tools as the reference engine reads them from a prompt, and arguments built from a schema.

The engine sees only ids: it decodes the prompt and reads the ``<tools>`` block the chat template
wrote (one JSON tool per line, as SGLang's normalized ``Tool`` dump or a bare function), so its tool
calls name one of those tools, with arguments that fit the tool's ``parameters`` schema: every
required property and about half of the optional ones, each value drawn by type (an ``enum``
member, a short phrase, an integer, a number, a boolean, a list of 1-3 items, a nested object;
depth-limited). The call is written as the reference template writes one back:
``{"name": "<name>", "arguments": <arguments | tojson>}``, so a parsed call renders to the same text.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

_TOOLS_BLOCK = re.compile(r"<tools>\n(.*?)\n</tools>", re.DOTALL)
_WORDS = ("river", "north", "blue", "garden", "seven", "quiet", "market", "report", "Paris", "summer",
          "engine", "small", "data", "cloud", "stone", "today")  # fmt: skip
_MAX_DEPTH = 3


@dataclass(frozen=True)
class OfferedTool:
    name: str
    parameters: Any


def offered_tools(prompt_text: str) -> list[OfferedTool]:
    """The tools of the first ``<tools>`` block of ``prompt_text`` (lines that are not tools are skipped)."""
    match = _TOOLS_BLOCK.search(prompt_text)
    tools = []
    for line in match.group(1).split("\n") if match else []:
        try:
            tool = json.loads(line)
        except json.JSONDecodeError:
            continue
        function = tool.get("function", tool) if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str) and function["name"]:
            tools.append(OfferedTool(function["name"], function.get("parameters")))
    return tools


def call_text(tool: OfferedTool, rng: random.Random) -> str:
    """``{"name": ..., "arguments": {...}}`` with arguments drawn from the tool's schema."""
    arguments = value_for(tool.parameters, rng, 0)
    if not isinstance(arguments, dict):
        arguments = {}
    return (
        '{"name": '
        + json.dumps(tool.name, ensure_ascii=False)
        + ', "arguments": '
        + (json.dumps(arguments, ensure_ascii=False) + "}")
    )


def value_for(schema: Any, rng: random.Random, depth: int) -> Any:
    """A value that fits ``schema`` (JSON Schema, the common keywords)."""
    if not isinstance(schema, dict):
        return {} if depth == 0 else _phrase(rng)
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return rng.choice(schema["enum"])
    if "const" in schema:
        return schema["const"]
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            return value_for(rng.choice(schema[key]), rng, depth)
    return _typed(_type_of(schema, rng, depth), schema, rng, depth)


def _type_of(schema: dict[str, Any], rng: random.Random, depth: int) -> str:
    kind = schema.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if isinstance(k, str) and k != "null"]
        kind = rng.choice(kinds) if kinds else "null"
    if isinstance(kind, str):
        return kind
    return "object" if depth == 0 or "properties" in schema else "string"


def _typed(kind: str, schema: dict[str, Any], rng: random.Random, depth: int) -> Any:
    if kind == "object":
        return _object(schema, rng, depth)
    if kind == "array":
        if depth >= _MAX_DEPTH:
            return []
        return [
            value_for(schema.get("items", {"type": "string"}), rng, depth + 1)
            for _ in range(rng.randint(1, 3))
        ]
    if kind == "integer":
        return _bounded(schema, rng, integer=True)
    if kind == "number":
        return _bounded(schema, rng, integer=False)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    return _phrase(rng)


def _object(schema: dict[str, Any], rng: random.Random, depth: int) -> dict[str, Any]:
    properties = schema.get("properties")
    if not isinstance(properties, dict) or depth >= _MAX_DEPTH:
        return {}
    required = set(schema.get("required") or []) if isinstance(schema.get("required"), list) else set()
    chosen = [key for key in properties if key in required or rng.random() < 0.5]
    return {key: value_for(properties[key], rng, depth + 1) for key in chosen}


def _bounded(schema: dict[str, Any], rng: random.Random, *, integer: bool) -> int | float:
    low, high = schema.get("minimum", 0), schema.get("maximum", 100)
    low, high = (low, high) if isinstance(low, int | float) and isinstance(high, int | float) else (0, 100)
    low, high = min(low, high), max(low, high)
    if integer:
        return rng.randint(int(-(-low // 1)), max(int(-(-low // 1)), int(high // 1)))
    return round(rng.uniform(low, high), 2)


def _phrase(rng: random.Random) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 3)))


def names(tools: Sequence[OfferedTool]) -> list[str]:
    return [tool.name for tool in tools]
