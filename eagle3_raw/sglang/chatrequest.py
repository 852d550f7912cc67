"""SGLang 0.5.23's chat request models, as plain functions: what its pydantic models keep, drop and add.

``/tokenize`` with ``messages`` validates the body as ``TokenizeRequest``, dumps it with
``exclude_none=True`` and validates the dump again as ``ChatCompletionRequest``
(``srt/entrypoints/openai/protocol.py:1744-1793``); the serving code then works on ``model_dump()``
of those models. The functions here return exactly those dumps, as fresh dicts (the caller's data is
never mutated):

- a user message keeps only ``role`` and ``content`` (``ChatCompletionMessageUserParam``,
  ``protocol.py:790``): ``name`` and every other key are dropped; any other role is one of
  ``system, assistant, tool, function, developer, latest_reminder, root`` (case-insensitive and
  lowercased, while ``user`` must be lowercase) and keeps ``role, content, tool_call_id, name,
  phase, reasoning_content, tool_calls, tools, prefix``, in that order, ``None`` where missing;
- a tool call is ``{"id", "index", "type": "function", "function": {"name", "arguments"}}`` with
  ``None`` for what is missing (``protocol.py:732-745``); a content part keeps only its model's
  fields (``{"type", "text"}`` for text);
- a tool is ``{"type", "function": {...}, "defer_loading"}`` (``protocol.py:810-860``): the function
  keeps its known keys (``name``, ``description``, ``parameters``, ``strict``, ``defer_loading``) in
  the order the client sent them, drops unknown ones, leaves out ``strict``/``defer_loading`` when
  null, and appends ``"description": None`` / ``"parameters": None`` when missing (the
  ``exclude_none`` round trip moves a null one to the end too); the tool level always carries
  ``"defer_loading"`` (null unless given, and then copied into the function).

Pydantic's messages are not reproduced word for word: a refusal here raises
:class:`ChatRequestError` with ``kind="validation"`` and a message naming the field, where SGLang
answers FastAPI's 400 (``{"type": "Bad Request"}``) with pydantic's own text.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

GENERIC_ROLES = ("system", "assistant", "tool", "function", "developer", "latest_reminder", "root")
_GENERIC_FIELDS = ("tool_call_id", "name", "phase", "reasoning_content", "tool_calls", "tools", "prefix")
_FUNCTION_FIELDS = ("description", "name", "parameters", "strict", "defer_loading")
_EFFORT_TIERS = ("none", "minimal", "low", "medium", "high", "xhigh", "ultra", "max")
_MEDIA_PARTS = {"image_url": "image_url", "video_url": "video_url", "audio_url": "audio_url"}


class ChatRequestError(ValueError):
    """A chat request SGLang refuses: ``message`` is its text, ``status`` the HTTP status.

    ``kind``: ``"validation"`` (its pydantic models refuse the body: FastAPI's 400, type
    ``"Bad Request"``), ``"request"`` (a ``ValueError`` of the serving code: 400, type
    ``"BadRequestError"``) or ``"internal"`` (another exception while rendering: 500).
    """

    def __init__(self, message: str, *, kind: str = "request") -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind

    @property
    def status(self) -> int:
        return 500 if self.kind == "internal" else 400


def invalid(where: str, problem: str) -> ChatRequestError:
    return ChatRequestError(f"1 validation error: {where}: {problem}", kind="validation")


def dump_messages(messages: Any) -> list[dict[str, Any]]:
    """``[m.model_dump() for m in request.messages]`` after SGLang's validation (see module docs)."""
    if not isinstance(messages, list):
        raise invalid("messages", "Input should be a valid list")
    return [_dump_message(m, f"messages.{i}") for i, m in enumerate(messages)]


def _dump_message(message: Any, where: str) -> dict[str, Any]:
    if not isinstance(message, Mapping):
        raise invalid(where, "Input should be a valid dictionary")
    role = message.get("role")
    if role == "user":
        content = message.get("content")
        if content is None:
            raise invalid(f"{where}.content", "Field required")
        return {"role": "user", "content": _content(content, f"{where}.content", assistant=False)}
    if not isinstance(role, str) or role.lower() not in GENERIC_ROLES:
        allowed = ", ".join(repr(r) for r in GENERIC_ROLES)
        raise invalid(f"{where}.role", f"'role' must be one of {allowed} (case-insensitive).")
    return _dump_generic(message, role.lower(), where)


def _dump_generic(message: Mapping[str, Any], role: str, where: str) -> dict[str, Any]:
    raw = message.get("content")
    content = None if raw is None else _content(raw, f"{where}.content", assistant=role == "assistant")
    dumped: dict[str, Any] = {"role": role, "content": content}
    for key in ("tool_call_id", "name", "reasoning_content"):
        dumped[key] = _optional_str(message.get(key), f"{where}.{key}")
    dumped["phase"] = _phase(message.get("phase"), f"{where}.phase")
    calls = message.get("tool_calls")
    dumped["tool_calls"] = None if calls is None else _tool_calls(calls, f"{where}.tool_calls")
    tools = message.get("tools")
    dumped["tools"] = None if tools is None else dump_tools(tools, f"{where}.tools")
    dumped["prefix"] = _optional_bool(message.get("prefix"), f"{where}.prefix")
    return {key: dumped[key] for key in ("role", "content", *_GENERIC_FIELDS)}


def _content(content: Any, where: str, *, assistant: bool) -> Any:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid(where, "Input should be a valid string or list")
    parts = [_part(part, f"{where}.{i}") for i, part in enumerate(content)]
    if not assistant and any(p["type"] in ("thinking", "reasoning") for p in parts):
        raise invalid(where, "thinking content parts are only valid in assistant messages")
    return parts


def _part(part: Any, where: str) -> dict[str, Any]:
    kind = part.get("type") if isinstance(part, Mapping) else None
    if kind == "text":
        return {"type": "text", "text": _required_str(part.get("text"), f"{where}.text")}
    if kind in ("thinking", "reasoning"):
        thinking = _optional_str(part.get("thinking"), f"{where}.thinking")
        text = _optional_str(part.get("text"), f"{where}.text")
        if (thinking is None) == (text is None):
            raise invalid(where, "thinking parts require exactly one of 'thinking' or 'text'")
        return {"type": kind, "thinking": thinking, "text": text}
    if kind == "tool_reference":
        return {"type": kind, "name": _required_str(part.get("name"), f"{where}.name")}
    if kind in _MEDIA_PARTS or kind == "input_audio":
        return {"type": "audio_url" if kind == "input_audio" else kind}  # refused later on text models
    raise invalid(where, "Input should be a valid content part (text, thinking, image_url, ...)")


def _tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise invalid(where, "Input should be a valid list")
    return [_tool_call(call, f"{where}.{i}") for i, call in enumerate(calls)]


def _tool_call(call: Any, where: str) -> dict[str, Any]:
    if not isinstance(call, Mapping) or not isinstance(call.get("function"), Mapping):
        raise invalid(f"{where}.function", "Field required")
    if call.get("type", "function") != "function":
        raise invalid(f"{where}.type", "Input should be 'function'")
    function = call["function"]
    arguments = function.get("arguments")
    if arguments is not None and not isinstance(arguments, str | dict):
        raise invalid(f"{where}.function.arguments", "Input should be a valid string or dictionary")
    return {
        "id": _optional_str(call.get("id"), f"{where}.id"),
        "index": _optional_int(call.get("index"), f"{where}.index"),
        "type": "function",
        "function": {"name": _optional_str(function.get("name"), f"{where}.function.name"),
                     "arguments": _plain(arguments)},
    }  # fmt: skip


def dump_tools(tools: Any, where: str = "tools") -> list[dict[str, Any]]:
    """``[tool.model_dump() for tool in tools]`` after SGLang's round trip (see module docs)."""
    if not isinstance(tools, list):
        raise invalid(where, "Input should be a valid list")
    return [_dump_tool(tool, f"{where}.{i}") for i, tool in enumerate(tools)]


def _dump_tool(tool: Any, where: str) -> dict[str, Any]:
    if not isinstance(tool, Mapping) or not isinstance(tool.get("function"), Mapping):
        raise invalid(f"{where}.function", "Field required")
    kind = tool.get("type", "function")
    if not isinstance(kind, str):
        raise invalid(f"{where}.type", "Input should be a valid string")
    defer = _optional_bool(tool.get("defer_loading"), f"{where}.defer_loading")
    function = _dump_function(tool["function"], f"{where}.function", defer)
    return {"type": kind, "function": function, "defer_loading": defer}


def _dump_function(function: Mapping[str, Any], where: str, tool_defer: bool | None) -> dict[str, Any]:
    values = {
        "description": _optional_str(function.get("description"), f"{where}.description"),
        "name": _required_str(function.get("name"), f"{where}.name"),
        "parameters": _plain(function.get("parameters")),
        "strict": _optional_bool(function.get("strict"), f"{where}.strict"),
        "defer_loading": _optional_bool(function.get("defer_loading"), f"{where}.defer_loading"),
    }
    if values["defer_loading"] is None:
        values["defer_loading"] = tool_defer
    sent = [key for key in function if key in _FUNCTION_FIELDS and values[key] is not None]
    rest = [key for key in _FUNCTION_FIELDS if key not in sent]
    dumped = {key: values[key] for key in sent + rest}
    for key in ("strict", "defer_loading"):
        if dumped[key] is None:
            del dumped[key]
    return dumped


def tool_choice_value(choice: Any) -> str | dict[str, Any] | None:
    """``tool_choice``: ``"auto"``, ``"required"``, ``"none"``, ``{"function": {"name"}}`` or None."""
    if choice is None or choice in ("auto", "required", "none"):
        return choice  # type: ignore[no-any-return]
    if isinstance(choice, Mapping) and isinstance(choice.get("function"), Mapping):
        if choice.get("type", "function") != "function":
            raise invalid("tool_choice.type", "Input should be 'function'")
        name = _optional_str(choice["function"].get("name"), "tool_choice.function.name")
        return {"function": {"name": name}, "type": "function"}
    raise invalid("tool_choice", "Input should be 'auto', 'required', 'none' or a ToolChoice object")


def reasoning_effort_value(effort: Any, where: str = "reasoning_effort") -> str | float | None:
    """A tier name or a float in [0.0, 0.99] (numbers and numeric strings coerce, as pydantic's)."""
    if effort is None or effort in _EFFORT_TIERS:
        return effort  # type: ignore[no-any-return]
    if isinstance(effort, bool):
        raise invalid(where, "reasoning_effort must not be a boolean")
    try:
        value = float(effort) if isinstance(effort, int | float | str) else math.nan
    except ValueError:
        value = math.nan
    if not 0.0 <= value <= 0.99:
        raise invalid(where, f"Input should be one of {_EFFORT_TIERS} or a number between 0 and 0.99")
    return value


def _plain(value: Any) -> Any:
    """A deep copy of JSON-like data (what a pydantic dump hands out)."""
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


def _required_str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise invalid(where, "Field required" if value is None else "Input should be a valid string")
    return value


def _optional_str(value: Any, where: str) -> str | None:
    return None if value is None else _required_str(value, where)


def _optional_int(value: Any, where: str) -> int | None:
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise invalid(where, "Input should be a valid integer")


def _optional_bool(value: Any, where: str) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    raise invalid(where, "Input should be a valid boolean")


def _phase(value: Any, where: str) -> str | None:
    if value is None or value in ("commentary", "final_answer"):
        return value  # type: ignore[no-any-return]
    raise invalid(where, "Input should be 'commentary' or 'final_answer'")


def effective_tools(tools: Sequence[dict[str, Any]] | None, messages: Sequence[dict[str, Any]]) -> list[Any]:
    """Request tools, then the tools of ``root``/``system``/``developer`` messages (``_effective_tools``)."""
    found = list(tools or [])
    for message in messages:
        if message["role"] in ("root", "system", "developer") and message.get("tools"):
            found.extend(message["tools"])
    return found
