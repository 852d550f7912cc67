"""SGLang 0.5.23's output parsers for ``<think>`` reasoning and ``<tool_call>`` JSON calls, as its native
``/separate_reasoning`` and ``/parse_function_call`` run them (``http_server.py:1734-1830``).

Reasoning (``srt/parser/reasoning_parser.py``; the name is matched lowercased):

- ``qwen3``, ``deepseek-v3``, ``dots``, ``nanbeige``, ``interns1`` (Qwen3's detector): only a text
  that contains ``<think>`` has reasoning; ``qwen3-thinking`` and ``minimax`` force it on (the
  whole text is reasoning until ``</think>``). Leading ``<think>`` tags are stripped; reasoning
  ends at the first ``</think>``, else at the first ``<tool_call>`` (kept in the text), else runs to
  the end. Nothing is trimmed: ``"<think>\\nA\\n</think>\\n\\nB"`` gives ``"\\nA\\n"`` and ``"\\n\\nB"``.
- ``deepseek-r1``, ``step3``, ``step3p5``, ``gigachat35``: always reasoning until ``</think>``, no
  ``<tool_call>`` cut.
- ``return_blocks``: ``[{"type": "reasoning", ...}]`` when there is reasoning, then always a
  ``text`` block.

Tool calls (``function_call/qwen25_detector.py``, ``hermes_detector.py``, ``base_format_detector.py``):

- ``qwen25`` (alias ``qwen``): blocks ``<tool_call>\\n{json}\\n</tool_call>``; a block that is not
  JSON is skipped. ``hermes``: ``<tool_call>{json}</tool_call>`` or an unclosed ``<tool_call>{json}``
  at the end; any bad block voids the parse (the whole text comes back as ``normal_text``, no calls).
- ``normal_text`` is the text before the first ``<tool_call>``, stripped: **text after or between
  calls is dropped**. No ``tools`` in the request: nothing is parsed.
- a call names a request tool or is dropped; ``tool_index`` is that tool's position;
  ``parameters`` is ``json.dumps(call["parameters"] or call["arguments"] or {}, ensure_ascii=False)``,
  so arguments given as a JSON string come back as a quoted string.

Errors as SGLang sends them: an unknown parser name (or none for tool calls) raises inside the
parser's constructor, which FastAPI answers with a plain-text 500; the names of the DeepSeek-V4
adapters get a 400 ``{"object": "error", ...}``. Other SGLang parser names exist but are not
implemented here: :class:`NotImplementedParser` (the server answers 501).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

REASONING_PARSER_NAMES = (
    "apertus2509", "beam", "deepseek-r1", "deepseek-v3", "deepseek-v4", "deepseek-v41", "dots", "glm45",
    "ling3", "hunyuan", "gpt-oss", "k2_horizon", "kimi", "kimi_k2", "kimi_k3", "mimo", "muse",
    "poolside_v1", "qwen3", "qwen3-thinking", "minimax", "minimax-append-think", "minimax-m3", "nanbeige",
    "step3", "step3p5", "mistral", "nemotron_3", "granite_thinking_parser", "interns1", "gemma4",
    "inkling", "iquest_q1", "cohere_command4", "gigachat35", "response_template",
)  # fmt: skip
TOOL_CALL_PARSER_NAMES = (
    "apertus2509", "beam", "cohere_command4", "deepseekv3", "deepseekv31", "deepseekv32", "deepseekv4",
    "deepseekv41", "dots", "glm", "glm45", "glm47", "gpt-oss", "k2_horizon", "kimi_k2", "kimi_k3", "lfm2",
    "ling3", "llama3", "mimo", "minicpm5", "mistral", "muse", "poolside_v1", "pythonic", "qwen", "qwen25",
    "qwen3_coder", "spark25", "step3", "step3p5", "minimax-m2", "minimax-m3", "nanbeige", "trinity",
    "interns1", "hermes", "hunyuan", "gigachat3", "gigachat35", "gemma4", "inkling", "iquest_q1",
    "response_template",
)  # fmt: skip
_ADAPTER_NAMES = ("deepseek-v4", "deepseekv4", "deepseek-v41", "deepseekv41")
_QWEN3_LIKE = {"qwen3": False, "deepseek-v3": False, "dots": False, "nanbeige": False, "interns1": False,
               "qwen3-thinking": True, "minimax": True}  # fmt: skip
_R1_LIKE = ("deepseek-r1", "step3", "step3p5", "gigachat35")
THINK_START, THINK_END, TOOL_START = "<think>", "</think>", "<tool_call>"


class UnknownParser(Exception):
    """SGLang's constructor raises: FastAPI answers a plain-text 500."""


class AdapterParser(Exception):
    """A parser owned by a chat-encoding adapter this server does not serve: 400."""


class NotImplementedParser(Exception):
    """A parser SGLang has and the reference server does not implement."""


@dataclass(frozen=True)
class _Reasoning:
    force: bool
    tool_start: str | None


def _reasoning_detector(name: str) -> _Reasoning:
    if name in _ADAPTER_NAMES:
        raise AdapterParser(
            f"{name!r} output is parsed with its model's tokenizer; this server does not serve that model"
        )
    key = name.lower()
    if not key:
        raise UnknownParser("Model type must be specified")
    if key in _QWEN3_LIKE:
        return _Reasoning(_QWEN3_LIKE[key], TOOL_START)
    if key in _R1_LIKE:
        return _Reasoning(True, None)
    if key in REASONING_PARSER_NAMES:
        raise NotImplementedParser(f"reasoning parser {name!r} is not implemented by the reference server")
    raise UnknownParser(f"Unsupported model type: {name}")


def separate_reasoning(text: str, parser: str, return_blocks: bool = False) -> dict[str, Any]:
    """The body of ``/separate_reasoning`` for ``text`` (raises the exceptions above)."""
    reasoning, normal = split_reasoning(text, parser)
    body: dict[str, Any] = {"reasoning_text": reasoning, "text": normal}
    if return_blocks:
        blocks = [{"type": "reasoning", "text": reasoning}] if reasoning else []
        blocks.append({"type": "text", "text": normal})
        body["reasoning_blocks"] = [reasoning] if reasoning else []
        body["text_blocks"] = [normal]
        body["blocks"] = blocks
    return body


def split_reasoning(text: str, parser: str) -> tuple[str, str]:
    """(reasoning, normal text): ``BaseReasoningFormatDetector.detect_and_parse`` without streaming."""
    detector = _reasoning_detector(parser)
    if not (detector.force or THINK_START in text):
        return "", text
    while text.startswith(THINK_START):
        text = text[len(THINK_START) :]
    if THINK_END in text:
        reasoning, normal = text.split(THINK_END, 1)
        return reasoning, normal
    at = text.find(detector.tool_start) if detector.tool_start else -1
    return (text[:at], text[at:]) if at != -1 else (text, "")


def _check_tool_parser(name: str | None) -> str:
    if name in _ADAPTER_NAMES:
        raise AdapterParser(
            f"{name!r} output is parsed with its model's tokenizer; this server does not serve that model"
        )
    if name in ("qwen25", "qwen", "hermes"):
        return name
    if name in TOOL_CALL_PARSER_NAMES:
        raise NotImplementedParser(f"tool-call parser {name!r} is not implemented by the reference server")
    raise UnknownParser(f"Unsupported tool_call_parser: {name}")


def parse_function_call(text: str, tools: Sequence[dict[str, Any]], parser: str | None) -> dict[str, Any]:
    """The body of ``/parse_function_call``; ``tools`` as
    :func:`eagle3_raw.sglang.chatrequest.dump_tools` gives."""
    name = _check_tool_parser(parser)
    normal, calls = parse_calls(text, [tool["function"]["name"] for tool in tools], name)
    return {"normal_text": normal, "calls": calls}


def parse_calls(text: str, names: Sequence[str], parser: str) -> tuple[str, list[dict[str, Any]]]:
    """``FunctionCallParser.parse_non_stream`` for ``qwen25``/``qwen``/``hermes`` over tool ``names``."""
    if not names:
        return text, []
    hermes = parser == "hermes"
    bot = TOOL_START if hermes else TOOL_START + "\n"
    if bot not in text:
        return text, []
    normal = text[: text.find(bot)].strip()
    indices = {name: i for i, name in enumerate(names) if name}
    if hermes:
        try:
            return normal, _hermes_calls(text, indices)
        except Exception:  # SGLang's detector gives up on the whole text
            return text, []
    return normal, _qwen25_calls(text, indices)


def _qwen25_calls(text: str, indices: dict[str, int]) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []
    for block in re.findall(r"<tool_call>\n(.*?)\n</tool_call>", text, re.DOTALL):
        try:
            parsed = json.loads(block.strip())
        except json.JSONDecodeError:
            continue
        calls += _known_calls(parsed, indices)
    return calls


def _hermes_calls(text: str, indices: dict[str, int]) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []
    for closed, open_ended in re.findall(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", text, re.DOTALL):
        raw = closed or open_ended
        if raw:
            calls += _known_calls(json.loads(raw.strip()), indices)
    return calls


def _known_calls(action: Any, indices: dict[str, int]) -> list[dict[str, Any]]:
    """``parse_base_json``: calls of known tools, ``parameters`` as SGLang serializes them."""
    calls = []
    for act in action if isinstance(action, list) else [action]:
        name = act.get("name")  # a non-object raises, as in SGLang (500 for qwen25)
        if not (name and name in indices):
            continue
        arguments = act.get("parameters") or act.get("arguments", {})
        calls.append({"tool_index": indices[name], "name": name,
                      "parameters": json.dumps(arguments, ensure_ascii=False)})  # fmt: skip
    return calls
