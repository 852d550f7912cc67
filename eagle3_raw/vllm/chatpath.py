"""vLLM's chat path as a library: the prompt ids its ``/tokenize`` (and its chat API) makes of a
chat request, for servers that cannot render and for rendering checked against the server.

What vLLM 0.32 does (``vllm/renderers/chat_utils.py``), for text-only chat requests:

- each message's content parts become one string (text parts joined with newlines) when the
  template reads ``content`` as a string, or stay a list of ``{"type": "text", "text"}`` parts
  when it iterates over them (the same detection as SGLang's, :func:`template_content_format`);
  a null content is empty;
- an assistant's tool call needs an ``id``, ``type: function`` and its ``arguments`` as a string
  (else a 400; eagle3_raw sends its conversations' argument objects as JSON strings,
  :func:`wire_messages`); the arguments reach the template as an object (a string that is not a JSON object
  becomes ``{}``); an empty ``tool_calls`` is dropped;
  an assistant's ``reasoning`` reaches it as ``reasoning`` and ``reasoning_content``;
- a tool message's text parts are joined with newlines;
- each tool is what vLLM's pydantic model keeps of it (``ChatCompletionToolsParam``,
  ``FunctionDefinition``): ``type`` and ``function`` with ``name``, ``description`` and
  ``parameters`` (null when absent), ``strict`` and ``defer_loading`` only when set; any other key
  is dropped;
- the template runs with ``add_generation_prompt`` true, the request's tools and
  ``chat_template_kwargs``, and its text is encoded without adding special tokens.

Unlike SGLang it adds nothing of its own to the tools (no ``defer_loading: null``). Checked against
the real vLLM's ``/tokenize`` (``tests/real_vllm``).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from eagle3_raw.sglang.chatpath import ChatRequestError, template_content_format

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def render_prompt_ids(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    *,
    chat_template: str | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> list[int]:
    """The prompt ids vLLM's ``/tokenize`` returns for this chat request (see the module
    docstring). Raises :class:`~eagle3_raw.sglang.chatpath.ChatRequestError` when the template
    refuses it."""
    import jinja2

    template = chat_template or tokenizer.chat_template
    fmt = template_content_format(template if isinstance(template, str) else None)
    conversation = [_message(dict(m), fmt) for m in messages]
    kwargs = dict(chat_template_kwargs or {})
    try:
        text = tokenizer.apply_chat_template(
            conversation, tools=[_tool(t) for t in tools] if tools else None, chat_template=template,
            add_generation_prompt=True, tokenize=False, **kwargs,
        )  # fmt: skip
    except (jinja2.TemplateError, TypeError, ValueError) as exc:  # vLLM answers a 400
        raise ChatRequestError(str(exc)) from exc
    return list(tokenizer.encode(str(text), add_special_tokens=False))


def _tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    given = tool.get("function")
    function: Mapping[str, Any] = given if isinstance(given, Mapping) else {}
    kept: dict[str, Any] = {key: function.get(key) for key in ("name", "description", "parameters")}
    kept.update({key: function[key] for key in ("strict", "defer_loading") if function.get(key) is not None})
    if tool.get("defer_loading") is not None and kept.get("defer_loading") is None:
        kept["defer_loading"] = tool["defer_loading"]
    out: dict[str, Any] = {"type": tool.get("type", "function"), "function": kept}
    if tool.get("defer_loading") is not None:
        out["defer_loading"] = tool["defer_loading"]
    return out


def _message(message: dict[str, Any], fmt: str) -> dict[str, Any]:
    out = copy.deepcopy(message)
    out["content"] = _content(message.get("content"), fmt, joined=message.get("role") == "tool")
    if message.get("role") == "assistant":
        calls = message.get("tool_calls")
        if isinstance(calls, list) and not calls:
            out.pop("tool_calls")
        elif isinstance(calls, list):
            out["tool_calls"] = [_call(c) for c in calls]
        reasoning = message.get("reasoning", message.get("reasoning_content"))
        out.pop("reasoning_content", None)
        if reasoning is not None:
            out["reasoning"] = out["reasoning_content"] = reasoning
    return out


def _content(content: Any, fmt: str, *, joined: bool) -> Any:
    if content is None:
        content = []
    if isinstance(content, str):
        content = [{"type": "text", "text": content}]
    texts = [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"]
    if fmt == "openai" and not joined:
        return [{"type": "text", "text": t} for t in texts]
    return "\n".join(texts)


def _call(call: Any) -> dict[str, Any]:
    """An assistant's tool call as vLLM validates it (the OpenAI message types: ``id``, ``type``
    ``function``, a ``function`` with a ``name`` and its ``arguments`` as a string) and passes it
    to the template (the arguments as an object)."""
    function = call.get("function") if isinstance(call, dict) else None
    typed = isinstance(call, dict) and isinstance(call.get("id"), str) and call.get("type") == "function"
    if not isinstance(function, dict) or not typed:
        raise ChatRequestError("a tool call needs an id, type function and a function (vLLM's message types)")
    arguments = function.get("arguments")
    if isinstance(arguments, dict):  # eagle3_raw's own form: sent to vLLM as its JSON (wire_messages)
        arguments = json.dumps(arguments)
    if not isinstance(function.get("name"), str) or not isinstance(arguments, str):
        raise ChatRequestError("a tool call's function needs a name and its arguments as a string")
    out: dict[str, Any] = copy.deepcopy(call)
    try:
        parsed = json.loads(arguments) if arguments else {}
    except json.JSONDecodeError:
        parsed = {}
    out["function"]["arguments"] = parsed if isinstance(parsed, dict) else {}
    return out


def wire_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` as an OpenAI client sends them to vLLM: a tool call's arguments as a JSON
    string (eagle3_raw's conversations hold them as objects, :mod:`eagle3_raw.source.prompts`)."""
    return [_wire(dict(m)) for m in messages]


def _wire(message: dict[str, Any]) -> dict[str, Any]:
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        return message
    sent = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict) and isinstance(function.get("arguments"), dict):
            call = {**call, "function": {**function, "arguments": json.dumps(function["arguments"])}}
        sent.append(call)
    return {**message, "tool_calls": sent}
