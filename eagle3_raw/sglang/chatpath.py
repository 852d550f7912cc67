"""SGLang 0.5.23's chat path as a library: a chat request -> the prompt ids its chat API would feed the model.

Used by the reference server's ``/tokenize`` (``messages``) and by a client rendering locally; no
server code here. It follows ``/tokenize``'s route through SGLang (file:line in the 0.5.23 wheel):
``TokenizeRequest.to_chat_completion_request`` (``srt/entrypoints/openai/protocol.py:1776``),
``OpenAIServingChat._validate_request`` (``serving_chat.py:1103``), ``_process_messages`` (``:1793``),
``_apply_jinja_template`` (``:2011``) and ``_render_and_encode_chat_template`` (``:2259``), for a
text-only model served with its Jinja chat template (the case of every model that has one, gpt-oss
included: Harmony only renders ``/v1/responses``).

What the template sees (:func:`normalize_request`):

- messages and tools as SGLang's pydantic models dump them (:mod:`eagle3_raw.sglang.chatrequest`), then
  every top-level ``None`` dropped and ``content: None`` made ``""``
  (``jinja_template_utils.py:212``); a tool call without ``id`` keeps ``"id": None``;
- tool-call ``arguments`` given as a JSON string are parsed into a dict (``serving_chat.py:181``);
  a string that is not a JSON object is refused;
- content given as a list: templates whose content format is ``"openai"`` (a ``for`` loop over
  ``message.content``, or the words image/audio/video/vision anywhere in the template,
  ``jinja_template_utils.py:78``) get the list of ``{"type": "text", "text"}`` parts (thinking
  parts dropped); ``"string"`` templates get the text parts joined with a space; tool messages'
  text parts are joined with a space in both formats;
- tools only when ``tool_choice`` is not ``"none"`` (a named choice passes only that tool); their
  ``parameters`` with DB-style types rewritten (``varchar`` -> ``string``, ``int64`` ->
  ``integer``, ...: ``function_call/utils.py:113``) and checked as a JSON Schema (2020-12);
- with ``add_generation_prompt`` null (the default): a final assistant message with string content
  becomes a **user** message with that content, unless ``continue_final_message``, which removes
  it and appends its encoded text to the ids (BOS stripped) after the generation prompt;
- template kwargs: ``reasoning_effort`` (when given) and ``chat_template_kwargs``;
  ``reasoning_effort`` other than ``"none"`` also sets ``thinking`` and ``enable_thinking`` to
  true (``"none"``: false) unless the kwargs set them.

Encoding (:func:`render_prompt_ids`): the template renders to text, which is encoded with
``add_special_tokens=False`` when the tokenizer adds specials to ``encode("")``, else with the
tokenizer's defaults; the template alone decides BOS. When text and ids disagree on a probe
conversation (tokenizers with control tokens that have no text form), the template is rendered
with ``tokenize=True`` instead. A template that fails is tried once more with function-only tools.

Not covered (SGLang renders them with other code): conversation templates chosen by name or
model path, GLM-5.3's Python template, the DeepSeek V3.2/V4, Kimi K3 and Inkling encoders,
multimodal models, ``--default-chat-template-kwargs``, MiniMax-M3 and Hunyuan request rewriting.
"""

from __future__ import annotations

import copy
import functools
import re
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from eagle3_raw.sglang.chatrequest import (
    ChatRequestError,
    dump_messages,
    dump_tools,
    effective_tools,
    invalid,
    reasoning_effort_value,
    tool_choice_value,
)
from eagle3_raw.sglang.chatschema import check_tool_schemas

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = [
    "ChatRender",
    "ChatRequestError",
    "body_options",
    "normalize_request",
    "read_template_file",
    "render_ids",
    "render_prompt_ids",
    "resolve_template",
    "template_content_format",
]

_MEDIA_TYPES = ("image_url", "video_url", "audio_url")


@dataclass(frozen=True)
class ChatRender:
    """What SGLang hands ``apply_chat_template``, and what it does around it."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    template_kwargs: dict[str, Any]
    add_generation_prompt: bool
    assistant_prefix: str | None = None
    add_special_tokens: bool = False
    """``True`` only when ``add_generation_prompt`` and ``add_special_tokens: true`` were both given."""
    input_ids: list[int] | None = None
    """A request's own ``input_ids`` (an extra key SGLang honours): no rendering at all."""
    tool_choice: Any = field(default="none")


def read_template_file(path: str | Path) -> str:
    """A ``--chat-template FILE`` as SGLang reads it (``template_manager.py:316``): leading and
    trailing newlines stripped, then every two-character ``\\n`` replaced by a newline."""
    with open(path, encoding="utf-8") as f:
        text = "".join(f.readlines()).strip("\n")
    return text.replace("\\n", "\n")


def resolve_template(tokenizer: PreTrainedTokenizerBase, chat_template: str | None = None) -> str | None:
    """The template SGLang renders with: ``chat_template`` if given, else the tokenizer's, the first
    of a tokenizer's named templates (``template_manager.py:431``: never the ``tool_use`` one)."""
    if chat_template is not None:
        return chat_template
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, Mapping):
        return next(iter(template.values()), None)
    return template if isinstance(template, str) else None


@functools.lru_cache(maxsize=64)
def template_content_format(template: str | None) -> str:
    """``"openai"`` or ``"string"``, detected as ``detect_jinja_template_content_format`` does."""
    if template is None:
        return "string"
    if any(word in template for word in ("image", "audio", "video", "vision")):
        return "openai"
    import jinja2.nodes

    ast = _parse(template)
    if ast is None:
        return "string"
    for loop in ast.find_all(jinja2.nodes.For):
        if any(_reads_content(loop.iter, name) for name in ("message", "msg", "m")):
            return "openai"
    return "string"


def _parse(template: str) -> Any:
    from transformers.utils.chat_template_utils import _cached_compile_jinja_template

    try:  # parsed in transformers' environment, not compiled: compiling folds constants, unbounded
        return _cached_compile_jinja_template("").environment.parse(template)
    except Exception:  # SGLang treats any failure as "no AST"
        return None


def _reads_content(node: Any, name: str) -> bool:
    """``name.content`` / ``name['content']``, possibly under filters, tests or a slice."""
    import jinja2.nodes as n

    if isinstance(node, n.Filter):
        return node.node is not None and _reads_content(node.node, name)
    if isinstance(node, n.Test) or (isinstance(node, n.Getitem) and isinstance(node.arg, n.Slice)):
        return _reads_content(node.node, name)
    if isinstance(node, n.Getitem):
        return _is_name(node.node, name) and isinstance(node.arg, n.Const) and node.arg.value == "content"
    return isinstance(node, n.Getattr) and _is_name(node.node, name) and node.attr == "content"


def _is_name(node: Any, name: str) -> bool:
    import jinja2.nodes as n

    return isinstance(node, n.Name) and node.ctx == "load" and node.name == name


def normalize_request(
    messages: Any,
    tools: Any = None,
    *,
    chat_template: str | None,
    tool_choice: Any = None,
    reasoning_effort: Any = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    continue_final_message: bool = False,
    add_generation_prompt: bool | None = None,
    add_special_tokens: bool | None = None,
    extra: Mapping[str, Any] | None = None,
) -> ChatRender:
    """The template's inputs for a ``/tokenize`` chat request, as SGLang 0.5.23 builds them.

    ``chat_template`` is the template that will render (it decides the content format and the
    effort keyword); ``add_special_tokens`` is None when not given; ``extra`` holds the other keys
    of the body (``reasoning``, ``input_ids``, ``max_completion_tokens``, ... are read as SGLang's
    chat request reads them). Raises :class:`ChatRequestError` with SGLang's message.
    """
    extra = dict(extra or {})
    dumped = dump_messages(messages)
    request_tools = None if tools is None else dump_tools(tools)
    choice = _default_tool_choice(tool_choice_value(tool_choice), request_tools, messages)
    effort, kwargs = _reasoning(reasoning_effort_value(reasoning_effort), chat_template_kwargs, extra)
    _validate(dumped, request_tools, choice, kwargs, extra)
    _check_generation_prompt(add_generation_prompt, continue_final_message)
    fmt = template_content_format(chat_template)
    prepared = [_prepare(_parse_arguments(m), fmt) for m in dumped]
    prefix = None
    if add_generation_prompt is None or continue_final_message:
        prepared, prefix = _last_assistant(prepared, continue_final_message)
    return ChatRender(
        messages=prepared,
        tools=_template_tools(request_tools, dumped, choice),
        template_kwargs=_template_kwargs(effort, kwargs, chat_template),
        add_generation_prompt=add_generation_prompt is not False,
        assistant_prefix=prefix,
        add_special_tokens=add_generation_prompt is not None and add_special_tokens is True,
        input_ids=_input_ids(extra.get("input_ids")),
        tool_choice=choice,
    )


def _default_tool_choice(choice: Any, tools: list[Any] | None, messages: Any) -> Any:
    """``set_tool_choice_default``: "none" without request tools or message-level tools, else "auto"."""
    if choice is not None:
        return choice
    message_tools = any(
        isinstance(m, Mapping) and isinstance(m.get("role"), str)
        and m["role"].lower() in ("root", "system", "developer") and bool(m.get("tools"))
        for m in messages
    )  # fmt: skip
    return "none" if tools is None and not message_tools else "auto"


def _reasoning(
    effort: str | float | None, kwargs: Mapping[str, Any] | None, extra: Mapping[str, Any]
) -> tuple[str | float | None, dict[str, Any] | None]:
    """``normalize_reasoning_inputs`` (``protocol.py:1108``): effort and ``reasoning`` set thinking."""
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise invalid("chat_template_kwargs", "Input should be a valid dictionary")
    thinking: bool | None = None
    effort, thinking = _reasoning_object(extra.get("reasoning"), effort)
    if effort is not None:
        thinking = effort != "none"
    ctk = None if kwargs is None else dict(kwargs)
    if thinking is not None:
        ctk = ctk or {}
        ctk.setdefault("thinking", thinking)
        ctk.setdefault("enable_thinking", thinking)
    return effort, ctk


def _reasoning_object(reasoning: Any, effort: str | float | None) -> tuple[str | float | None, bool | None]:
    if not isinstance(reasoning, Mapping):
        return effort, None
    given = reasoning.get("effort")
    given = reasoning.get("reasoning_effort") if given is None else given
    if given is not None:
        effort = reasoning_effort_value(given, "reasoning.effort")
    enabled = reasoning.get("enabled")
    enabled = reasoning.get("enable", False) if enabled is None else enabled
    if isinstance(enabled, str):
        enabled = enabled.strip().lower() in {"1", "true", "yes", "y", "on"}
    return effort, True if enabled else None


def _validate(
    messages: list[dict[str, Any]], tools: list[Any] | None, choice: Any,
    kwargs: Mapping[str, Any] | None, extra: Mapping[str, Any],
) -> None:  # fmt: skip
    """``_validate_request`` (``serving_chat.py:1103``) for a text-only Jinja-template model."""
    if not messages:
        raise ChatRequestError("Messages cannot be empty.")
    if kwargs and "chat_template" in kwargs:
        raise ChatRequestError(
            "Request-supplied chat_template is not allowed. Start the server "
            "with --trust-request-chat-template to permit it."
        )
    _validate_flags(extra)
    _validate_media(messages)
    everything = effective_tools(tools, messages)
    _validate_tool_choice(choice, everything)
    if any(m["role"] in ("root", "system", "developer") and m.get("tools") for m in messages):
        names = [tool["function"]["name"] for tool in everything]
        if len(names) != len(set(names)):
            raise ChatRequestError("Tool names must be unique across request and message tools.")
    check_tool_schemas(everything)


def _validate_flags(extra: Mapping[str, Any]) -> None:
    for flag in ("return_sampling_mask", "return_flat_raw_output_top_logprobs"):
        if extra.get(flag) and not extra.get("return_meta_info"):
            raise ChatRequestError(f"{flag} requires return_meta_info=true.")


def _validate_media(messages: list[dict[str, Any]]) -> None:
    for message in messages:
        for part in message["content"] if isinstance(message["content"], list) else []:
            if part["type"] in _MEDIA_TYPES:
                raise ChatRequestError(
                    f"Model only supports text input; received unsupported content type '{part['type']}'."
                )


def _validate_tool_choice(choice: Any, tools: list[Any]) -> None:
    if isinstance(choice, str):
        if choice == "required" and not tools:
            raise ChatRequestError("Tools cannot be empty if tool choice is set to required.")
        return
    if not tools:
        raise ChatRequestError("Tools cannot be empty if tool choice is set to a specific tool.")
    name = choice["function"]["name"]
    if not any(tool["function"]["name"] == name for tool in tools):
        raise ChatRequestError(f"Tool '{name}' not found in tools list.")


def _check_generation_prompt(add_generation_prompt: bool | None, continue_final_message: bool) -> None:
    """``_tokenize_chat_request`` (``serving_tokenize.py:104``) for a Jinja template."""
    if add_generation_prompt is False and continue_final_message:
        raise ChatRequestError(
            "continue_final_message needs add_generation_prompt to open the assistant turn."
        )


def _template_tools(tools: list[Any] | None, messages: list[dict[str, Any]], choice: Any) -> list[Any] | None:
    """The tools the template sees (``serving_chat.py:1866``): none under ``tool_choice: "none"``."""
    if not effective_tools(tools, messages) or choice == "none":
        return None
    if isinstance(choice, Mapping):
        name = choice["function"]["name"]
        return [copy.deepcopy(t) for t in tools or [] if t["function"]["name"] == name] or None
    return copy.deepcopy(tools) if tools else None


def _parse_arguments(message: dict[str, Any]) -> dict[str, Any]:
    """``normalize_assistant_tool_call_arguments`` (strict): JSON-string arguments become dicts."""
    if message["role"] != "assistant" or not isinstance(message.get("tool_calls"), list):
        return message
    for call in message["tool_calls"]:
        arguments = call["function"]["arguments"]
        if isinstance(arguments, str):
            call["function"]["arguments"] = _json_object(arguments)
    return message


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise ChatRequestError("Assistant tool call function.arguments must be valid JSON.") from exc
    if not isinstance(value, dict):
        raise ChatRequestError("Assistant tool call function.arguments must be a JSON object.")
    return value


def _prepare(message: dict[str, Any], fmt: str) -> dict[str, Any]:
    """``process_content_for_template_format`` and ``normalize_tool_content`` on one message."""
    message = copy.deepcopy(message)
    if message.get("content") is None:
        message["content"] = ""
    content = message["content"]
    if not isinstance(content, list):
        return {k: v for k, v in message.items() if v is not None}
    if fmt == "string":
        texts = [p["text"] for p in content if p["type"] == "text"]
        return {k: v for k, v in {**message, "content": " ".join(texts)}.items() if v is not None}
    kept = [_openai_part(p) for p in content if p["type"] in ("text", "tool_reference")]
    prepared = {k: v for k, v in message.items() if v is not None and k != "content"}
    if prepared["role"] == "tool" and all(p["type"] == "text" for p in kept):
        prepared["content"] = " ".join(p["text"] for p in kept)
    else:
        prepared["content"] = kept
    return prepared


def _openai_part(part: dict[str, Any]) -> dict[str, Any]:
    return {"type": "text", "text": part["text"]} if part["type"] == "text" else part


def _last_assistant(
    messages: list[dict[str, Any]], continue_final_message: bool
) -> tuple[list[dict[str, Any]], str | None]:
    """``_handle_last_assistant_message`` (``serving_chat.py:513``)."""
    if not messages or messages[-1].get("role") != "assistant":
        return messages, None
    content = messages[-1].get("content")
    if not isinstance(content, str):
        return messages, None
    if continue_final_message:
        return messages[:-1], content
    return [*messages[:-1], {"role": "user", "content": content}], None


def _template_kwargs(
    effort: str | float | None, kwargs: Mapping[str, Any] | None, template: str | None
) -> dict[str, Any]:
    out: dict[str, Any] = {} if effort is None else {"reasoning_effort": effort}
    out.update(kwargs or {})
    effort_kwarg = _effort_kwarg(template)
    if effort_kwarg is not None and effort == "low":
        out.setdefault(effort_kwarg, True)
    return out


@functools.lru_cache(maxsize=64)
def _effort_kwarg(template: str | None) -> str | None:
    """``low_effort`` for templates whose first reasoning rule is Nemotron-3 Super's
    (``template_detection.py:204``), else None: the only rule that adds an effort keyword."""
    if template is None or "low_effort" not in template or "truncate_history_thinking" not in template:
        return None
    earlier = ("<|channel|>", "<ifm|think>", "[gMASK]<sop>", "[THINK]", "reasoning_mode_token")
    if any(marker in template for marker in earlier):
        return None  # an earlier rule may match; not worth deciding exactly here
    default_off = re.search(
        r"{%\s*if\s+not\s+enable_thinking\s+is\s+defined\s*%}.*?{%\s*set\s+enable_thinking\s*=\s*(?:false|False)\s*%}",
        template, re.DOTALL,
    )  # fmt: skip
    return None if default_off else "low_effort"


def _input_ids(value: Any) -> list[int] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(type(i) is int for i in value):
        raise invalid("input_ids", "Input should be a valid list of integers")
    return list(value)


@dataclass(frozen=True)
class _Probe:
    auto_adds_specials: bool
    lossy: bool


_PROBES: weakref.WeakKeyDictionary[Any, dict[str | None, _Probe]] = weakref.WeakKeyDictionary()


def _probe(tokenizer: PreTrainedTokenizerBase, template: str | None) -> _Probe:
    """What ``OpenAIServingChat.__init__`` measures once (``serving_chat.py:455``, ``:475``)."""
    cached = _PROBES.setdefault(tokenizer, {})
    if template not in cached:
        try:
            adds = len(tokenizer.encode("")) > 0
        except Exception:
            adds = True
        cached[template] = _Probe(adds, _round_trip_is_lossy(tokenizer, template, adds))
    return cached[template]


def _round_trip_is_lossy(tokenizer: PreTrainedTokenizerBase, template: str | None, adds: bool) -> bool:
    probe = [{"role": "user", "content": "x"}]
    try:
        text = tokenizer.apply_chat_template(
            probe, tokenize=False, add_generation_prompt=True, return_dict=False, chat_template=template
        )
        via_text = tokenizer.encode(text, **({"add_special_tokens": False} if adds else {}))
        via_ids = tokenizer.apply_chat_template(
            probe, tokenize=True, add_generation_prompt=True, return_dict=False, chat_template=template
        )
        return list(via_text) != list(via_ids)
    except Exception:  # a template that needs kwargs the probe lacks tells nothing (SGLang's rule)
        return False


_OPTION_KEYS = ("tool_choice", "reasoning_effort", "chat_template_kwargs")
_FLAG_KEYS = ("continue_final_message", "add_generation_prompt", "add_special_tokens")


def body_options(body: Mapping[str, Any]) -> tuple[Any, Any, dict[str, Any]]:
    """``(messages, tools, options)`` of a ``/tokenize`` body with ``messages``, for
    :func:`normalize_request` / :func:`render_prompt_ids`; every other key goes to ``extra``
    except ``prompt`` and ``model`` (``TokenizeRequest`` allows extra keys)."""
    options: dict[str, Any] = {key: body[key] for key in _OPTION_KEYS if key in body}
    for key in _FLAG_KEYS:
        value = body.get(key)
        if key not in body or (value is None and key == "add_generation_prompt"):
            continue
        if not isinstance(value, bool):
            raise invalid(key, "Input should be a valid boolean")
        options[key] = value
    taken = {"messages", "tools", "prompt", "model", *_OPTION_KEYS, *_FLAG_KEYS}
    options["extra"] = {key: value for key, value in body.items() if key not in taken}
    return body.get("messages"), body.get("tools"), options


def render_prompt_ids(
    tokenizer: PreTrainedTokenizerBase,
    messages: Any,
    tools: Any = None,
    *,
    chat_template: str | None = None,
    **options: Any,
) -> list[int]:
    """The prompt ids SGLang 0.5.23's ``/tokenize`` returns for this chat request.

    ``chat_template`` overrides the tokenizer's (e.g. :func:`read_template_file`'s text);
    ``options`` are :func:`normalize_request`'s keywords. Raises :class:`ChatRequestError`.
    """
    template = resolve_template(tokenizer, chat_template)
    render = normalize_request(messages, tools, chat_template=template, **options)
    return render_ids(tokenizer, render, template)


def render_ids(tokenizer: PreTrainedTokenizerBase, render: ChatRender, template: str | None) -> list[int]:
    """The ids for a :class:`ChatRender` (rendered with ``template``), as SGLang encodes them."""
    if render.input_ids is not None:
        return list(render.input_ids)
    probe = _probe(tokenizer, template)
    if render.add_special_tokens and probe.lossy:
        raise ChatRequestError("add_special_tokens is not supported with this tokenizer's chat template")
    encode_kwargs = (
        {"add_special_tokens": render.add_special_tokens}
        if probe.auto_adds_specials or render.add_special_tokens
        else {}
    )
    ids = _render_with_fallback(tokenizer, render, template, probe.lossy, encode_kwargs)
    if render.assistant_prefix:
        ids = ids + _prefix_ids(tokenizer, render.assistant_prefix)
    return ids


def _render_with_fallback(
    tokenizer: PreTrainedTokenizerBase, render: ChatRender, template: str | None,
    lossy: bool, encode_kwargs: dict[str, Any],
) -> list[int]:  # fmt: skip
    """Render; on any failure retry once with function-only tools (``serving_chat.py:2185``)."""
    import jinja2

    try:
        return _render(tokenizer, render, render.tools, template, lossy, encode_kwargs)
    except Exception:
        flat = [t.get("function", t) for t in render.tools] if render.tools else None
    try:
        return _render(tokenizer, render, flat, template, lossy, encode_kwargs)
    except (jinja2.TemplateError, TypeError, ValueError) as exc:  # 400 in SGLang (ValueError: its handler)
        raise ChatRequestError(str(exc)) from exc
    except Exception as exc:  # what SGLang does not catch: its tokenize handler answers 500
        raise ChatRequestError(str(exc), kind="internal") from exc


def _render(
    tokenizer: PreTrainedTokenizerBase, render: ChatRender, tools: list[Any] | None,
    template: str | None, lossy: bool, encode_kwargs: dict[str, Any],
) -> list[int]:  # fmt: skip
    # Keywords passed as SGLang passes them, so a clashing template kwarg fails the same way.
    result = tokenizer.apply_chat_template(
        copy.deepcopy(render.messages), tokenize=lossy, add_generation_prompt=render.add_generation_prompt,
        tools=tools, return_dict=False, chat_template=template, **render.template_kwargs,
    )  # fmt: skip
    if lossy:
        return list(result)
    return list(tokenizer.encode(str(result), **encode_kwargs))


def _prefix_ids(tokenizer: PreTrainedTokenizerBase, prefix: str) -> list[int]:
    """``_append_assistant_prefix_to_prompt_ids``: the prefix encoded with defaults, minus a BOS."""
    ids = list(tokenizer.encode(prefix))
    return ids[1:] if ids and ids[0] == tokenizer.bos_token_id else ids
