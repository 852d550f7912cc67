"""vLLM 0.33's chat path for ``/tokenize`` with ``messages`` (``serve/tokenize/serving.py``): the
messages and tools as its request models dump them, then the chat template through transformers'
``apply_chat_template(messages, tools=..., add_generation_prompt=..., continue_final_message=...,
**chat_template_kwargs)``, then the text encoded (``add_special_tokens`` false by default).

Unlike SGLang's chat path (:mod:`eagle3_raw.sglang.chatpath`) nothing is added to a tool (a
function's ``description`` and ``parameters`` are always there, null when not given; ``strict``
only when given), and a final assistant message stays an assistant message. An assistant tool
call's JSON-string ``arguments`` become an object (``_postprocess_messages``); a list ``content``
becomes its text parts joined by newlines (the template's ``string`` content format).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

from eagle3_raw.reference.server.model import Model
from eagle3_raw.reference.vllmapi.errors import VLLMError, invalid_body


def render_ids(model: Model, body: Mapping[str, Any]) -> list[int]:
    """The prompt ids vLLM's ``/tokenize`` gives a chat body (VLLMError: 400)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, Mapping) for m in messages):
        raise invalid_body("messages", "Input should be a valid list")
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, Mapping):
        raise invalid_body("chat_template_kwargs", "Input should be a valid dictionary")
    add_generation_prompt = _flag(body, "add_generation_prompt", True)
    continue_final = _flag(body, "continue_final_message", False)
    if add_generation_prompt and continue_final:
        raise VLLMError("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
    try:
        text = model.chat_tokenizer.apply_chat_template(
            [_message(m) for m in messages], tools=_tools(body.get("tools")),
            add_generation_prompt=add_generation_prompt, continue_final_message=continue_final,
            tokenize=False, chat_template=model.chat_template, **kwargs,
        )  # fmt: skip
    except (ValueError, TypeError, KeyError) as exc:
        raise VLLMError(str(exc)) from exc
    except Exception as exc:  # jinja2's errors: vLLM answers them as a bad request too
        raise VLLMError(f"{type(exc).__name__}: {exc}") from exc
    return model.encode(str(text), _flag(body, "add_special_tokens", False))


def _message(message: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dict(message))
    content = out.get("content")
    if isinstance(content, list):
        out["content"] = "\n".join(
            str(p.get("text", "")) for p in content if isinstance(p, Mapping) and p.get("type") == "text"
        )
    if out.get("role") == "assistant" and isinstance(out.get("tool_calls"), list):
        for call in out["tool_calls"]:
            _check_call(call)
            call["function"]["arguments"] = _arguments(call["function"]["arguments"])
    return out


def _check_call(call: Any) -> None:
    """A history's tool call as OpenAI's message types have it (vLLM validates them): an ``id``,
    ``type: function``, a ``function`` with a ``name`` and its ``arguments`` as a string; else a 400
    (seen on the real vLLM: ``tests/real_vllm/test_routes.py``)."""
    function = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(call, Mapping) or not isinstance(call.get("id"), str) or call.get("type") != "function":
        raise invalid_body(
            "messages", "a tool call needs an id, type function and a function: Field required"
        )
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise invalid_body("messages", "a tool call's function needs a name: Field required")
    if not isinstance(function.get("arguments"), str):
        raise invalid_body("messages", "a tool call's arguments: Input should be a valid string")


def _arguments(text: str) -> Any:
    """The arguments as an object: a string that is no JSON object becomes ``{}``, as vLLM coerces it
    (``_postprocess_messages``: a history's malformed call must not fail every later turn)."""
    try:
        parsed = json.loads(text) if text else {}
    except json.JSONDecodeError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _tools(tools: Any) -> list[dict[str, Any]] | None:
    """``[tool.model_dump() for tool in request.tools]``: ``ChatCompletionToolsParam``'s fields."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise invalid_body("tools", "Input should be a valid list")
    return [_tool(tool) for tool in tools]


def _tool(tool: Any) -> dict[str, Any]:
    function = tool.get("function") if isinstance(tool, Mapping) else None
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise invalid_body("tools", "a tool needs a function with a name")
    dumped: dict[str, Any] = {"name": function["name"], "description": function.get("description"),
                              "parameters": function.get("parameters")}  # fmt: skip
    for optional in ("strict", "defer_loading"):
        if function.get(optional) is not None:
            dumped[optional] = function[optional]
    return {"type": "function", "function": dumped}


def _flag(body: Mapping[str, Any], key: str, default: bool) -> bool:
    value = body.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid_body(key, "Input should be a valid boolean")
    return value
