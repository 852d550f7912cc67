"""``/separate_reasoning`` and ``/parse_function_call`` (§14.2) against SGLang 0.5.23's own parsers,
loaded from its wheel (``tests/support/sglang_oracle.py``), on the edge cases of each parser: no
start or no end tag, forced reasoning, a tool call cutting reasoning short, text after calls,
unknown tools, arguments as a JSON string, bad JSON, unclosed calls."""

from __future__ import annotations

from typing import Any

import pytest

from eagle3_raw.launching.reference import ReferenceProcess
from tests.reference.wire import get, request
from tests.support import sglang_oracle

CALL = '{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}'
CALL2 = '{"name": "search", "arguments": {"q": "Ünï 日本"}}'
REASONING_TEXTS = [
    "<think>\nA plan.\n</think>\n\nThe answer.",
    "A plan.\n</think>\n\nThe answer.",
    "<think>\nunfinished thought",
    f"<think>\nplan\n<tool_call>\n{CALL}\n</tool_call>",
    "<think><think>twice</think>x</think>y",
    "no reasoning at all",
    "",
    "<think></think>",
]
TOOL_TEXTS = [
    f"Let me check.\n<tool_call>\n{CALL}\n</tool_call>\nText after the call.",
    f"<tool_call>\n{CALL}\n</tool_call>\n<tool_call>\n{CALL2}\n</tool_call>",
    '<tool_call>\n{"name": "unknown", "arguments": {}}\n</tool_call>',
    '<tool_call>\n{"name": "search", "arguments": "{\\"q\\": \\"x\\"}"}\n</tool_call>',
    f"<tool_call>\n{{not json}}\n</tool_call>\n<tool_call>\n{CALL2}\n</tool_call>",
    f"<tool_call>{CALL}</tool_call>",
    f"before <tool_call>\n{CALL}",
    f'<tool_call>\n[{CALL}, {{"name": "search", "parameters": {{"q": 1}}}}]\n</tool_call>',
    "plain text, no calls",
    "<tool_call>\n</tool_call>",
]
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "search", "description": "web"}},
]


@pytest.mark.parametrize("parser", ["qwen3", "qwen3-thinking", "deepseek-r1", "DeepSeek-R1", "minimax"])
@pytest.mark.parametrize("blocks", [False, True])
def test_separate_reasoning_matches_sglang(server: ReferenceProcess, parser: str, blocks: bool) -> None:
    sg = sglang_oracle.load()
    for text in REASONING_TEXTS:
        expected = _their_reasoning(sg, text, parser, blocks)
        body = {"text": text, "reasoning_parser": parser, "return_blocks": blocks}
        reply = request(server.url, "/separate_reasoning", body)
        assert reply.status == 200 and reply.json() == expected, text


def _their_reasoning(sg: Any, text: str, parser: str, blocks: bool) -> dict[str, Any]:
    """``separate_reasoning_request``'s body (``http_server.py:1774``), from SGLang's parser."""
    detector = sg.reasoning.ReasoningParser(model_type=parser, request=None)
    if not blocks:
        reasoning, normal = detector.parse_non_stream(text)
        return {"reasoning_text": reasoning, "text": normal}
    parts = detector.parse_non_stream_blocks(text)
    kinds = {kind: [b["text"] for b in parts if b["type"] == kind] for kind in ("reasoning", "text")}
    return {
        "reasoning_text": "".join(kinds["reasoning"]), "text": "".join(kinds["text"]),
        "reasoning_blocks": kinds["reasoning"], "text_blocks": kinds["text"], "blocks": parts,
    }  # fmt: skip


@pytest.mark.parametrize("parser", ["qwen25", "qwen", "hermes"])
@pytest.mark.parametrize("tools", [TOOLS, []], ids=["tools", "no-tools"])
def test_parse_function_call_matches_sglang(server: ReferenceProcess, parser: str, tools: list[Any]) -> None:
    sg = sglang_oracle.load()
    for text in TOOL_TEXTS:
        theirs = sg.function_call.FunctionCallParser(
            tools=[sg.protocol.Tool.model_validate(t) for t in tools], tool_call_parser=parser
        )
        normal, calls = theirs.parse_non_stream(text)
        reply = request(
            server.url, "/parse_function_call", {"text": text, "tools": tools, "tool_call_parser": parser}
        )
        assert reply.status == 200, (text, reply.body)
        assert reply.json() == {"normal_text": normal, "calls": [c.model_dump() for c in calls]}, text


def test_parser_errors_are_sglangs(server: ReferenceProcess) -> None:
    unknown = request(server.url, "/separate_reasoning", {"text": "x", "reasoning_parser": "nope"})
    assert (unknown.status, unknown.body) == (500, b"Internal Server Error")
    no_parser = request(server.url, "/parse_function_call", {"text": "x", "tools": TOOLS})
    assert (no_parser.status, no_parser.body) == (500, b"Internal Server Error")
    adapter = request(server.url, "/separate_reasoning", {"text": "x", "reasoning_parser": "deepseek-v4"})
    assert adapter.status == 400 and adapter.json()["type"] == "400"
    assert request(server.url, "/separate_reasoning", {"text": "x"}).status == 400
    other = request(
        server.url, "/parse_function_call", {"text": "x", "tools": TOOLS, "tool_call_parser": "kimi_k2"}
    )
    assert other.status == 501, "a real SGLang name the reference does not implement is not a silent no-op"


def test_model_info_reports_the_parsers(server: ReferenceProcess, launch: Any) -> None:
    assert get(server.url, "/model_info").json()["reasoning_parser"] is None
    assert get(server.url, "/model_info").json()["tool_call_parser"] is None
    named = launch("--reasoning-parser", "qwen3", "--tool-call-parser", "qwen25")
    info = get(named.url, "/model_info").json()
    assert (info["reasoning_parser"], info["tool_call_parser"]) == (
        "qwen3",
        "qwen",
    )  # as SGLang reports qwen25
