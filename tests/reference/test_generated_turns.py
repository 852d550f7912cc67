"""What the reference engine generates for a chat with tools is what a deployed client can take apart:
rendered by the server's chat path (``/tokenize`` with ``messages``), generated, then split by the
server's own parsers (``/separate_reasoning`` qwen3, ``/parse_function_call`` qwen25) into reasoning,
content and calls whose names are among the request's tools and whose arguments fit their schemas."""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonschema

from eagle3_raw.launching.reference import ReferenceProcess
from eagle3_raw.sglang.chatschema import normalize_schema_types
from tests.reference.wire import request

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {
                "type": "object",
                "required": ["city", "unit"],
                "properties": {
                    "city": {"type": "varchar(64)"},
                    "unit": {"enum": ["C", "F"]},
                    "days": {"type": "integer", "minimum": 1, "maximum": 7},
                },
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "book_table",
            "parameters": {
                "type": "object",
                "required": ["guests"],
                "properties": {
                    "guests": {"type": "int32"},
                    "names": {"type": "array", "items": {"type": "string"}},
                    "when": {
                        "type": "object",
                        "properties": {"day": {"type": "string"}, "late": {"type": "boolean"}},
                        "required": ["day"],
                    },
                    "budget": {"type": ["number", "null"]},
                },
            },
        },
    },
    {"type": "function", "function": {"name": "ping"}},
]


def _turn(url: str, i: int, thinking: bool) -> tuple[list[int], dict[str, Any]]:
    body = {
        "messages": [{"role": "system", "content": "Use tools when useful."},
                     {"role": "user", "content": f"Request {i}: plan a dinner and check the weather."}],
        "tools": TOOLS, "chat_template_kwargs": {"enable_thinking": thinking},
    }  # fmt: skip
    prompt = request(url, "/tokenize", body).json()["tokens"]
    sampling = {"max_new_tokens": 3000, "temperature": 0.8, "sampling_seed": i}
    reply = request(url, "/generate", {"input_ids": prompt, "sampling_params": sampling}).json()
    return reply["output_ids"], reply


def test_outputs_split_into_reasoning_content_and_calls_of_the_request_tools(
    server: ReferenceProcess,
) -> None:
    schemas = {t["function"]["name"]: t["function"].get("parameters") or {} for t in copy.deepcopy(TOOLS)}
    for schema in schemas.values():
        normalize_schema_types(schema)  # what the server's chat path printed into the prompt
    seen = {"reasoning": 0, "content": 0, "calls": 0}
    names: set[str] = set()
    for i in range(40):
        _, reply = _turn(server.url, i, thinking=i % 2 == 0)
        text = reply["text"]
        split = request(server.url, "/separate_reasoning", {"text": text, "reasoning_parser": "qwen3"}).json()
        if i % 2:
            assert split["reasoning_text"] == "", "thinking off: no reasoning block"
        parsed = request(
            server.url,
            "/parse_function_call",
            {"text": split["text"], "tools": TOOLS, "tool_call_parser": "qwen25"},
        ).json()
        assert "<tool_call>" not in parsed["normal_text"]
        assert parsed["calls"] or split["text"].count("<tool_call>") == 0, "every written call is parsed"
        for call in parsed["calls"]:
            assert call["name"] == TOOLS[call["tool_index"]]["function"]["name"]
            jsonschema.validate(json.loads(call["parameters"]), schemas[call["name"]])
            names.add(call["name"])
        seen["reasoning"] += bool(split["reasoning_text"].strip())
        seen["content"] += bool(parsed["normal_text"].strip())
        seen["calls"] += len(parsed["calls"])
    assert min(seen.values()) >= 5, seen
    assert len(names) >= 2, names


def test_turns_are_deterministic_and_varied(server: ReferenceProcess) -> None:
    first, _ = _turn(server.url, 7, thinking=True)
    again, _ = _turn(server.url, 7, thinking=True)
    assert first == again
    outputs = {tuple(_turn(server.url, i, thinking=True)[0]) for i in range(8)}
    assert len(outputs) == 8
