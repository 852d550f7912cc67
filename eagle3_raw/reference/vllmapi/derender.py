"""``POST /v1/chat/completions/derender``: a generation's ids -> a ``ChatCompletionResponse``,
split by the server's ``--reasoning-parser`` and ``--tool-call-parser`` (``scale_out/derender``,
``renderers/online_derenderer.py``).

Per choice: the id that stopped the generation is dropped (EOS, or the ``stop_reason`` id), the
rest decoded (``skip_special_tokens`` from the chat request, true by default), then split:

- reasoning (``qwen3``, ``deepseek_r1``): a leading ``<think>`` is dropped; reasoning runs to the
  first ``</think>`` and the content follows it, nothing trimmed (``"<think>\\nA\\n</think>\\n\\nB"``
  gives ``"\\nA\\n"`` and ``"\\n\\nB"``). Without ``</think>``: ``deepseek_r1`` (and ``qwen3`` when
  the text opened with ``<think>``) is all reasoning, else all content;
- tool calls (``hermes``; only with the chat request's ``tools``, ``tool_choice`` auto and
  ``--enable-auto-tool-choice``, as vLLM): ``<tool_call>{json}</tool_call>`` blocks (the last may be
  unclosed) become calls of any name, ``arguments`` a JSON string; the content is the text before the
  first block, untrimmed (null when empty), the text after is dropped; a block that is not JSON
  leaves the whole text as content and no calls.

``finish_reason`` stays the generation's own (``stop``), never ``tool_calls``. Without a
``chat_request`` while a parser is configured: vLLM's 400. The message's ``content`` is null when
empty, and ``tool_calls`` is left out when there are none (as the real 0.32 sends it); a call's
``id`` is 16 random hex digits, as there.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Mapping
from typing import Any

import orjson
from aiohttp import web

from eagle3_raw.reference.server.replies import json_response
from eagle3_raw.reference.server.state import ServerState
from eagle3_raw.reference.vllmapi.errors import VLLMError, error_reply, invalid_body, missing
from eagle3_raw.reference.vllmapi.requests import check_model

THINK_START, THINK_END = "<think>", "</think>"
_CALL = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)
_NEEDS_CHAT_REQUEST = (
    "chat_request is required when a tool or reasoning parser is configured because plain "
    "detokenization would leak raw parser markup into content."
)


class Derender:
    """The derender route over the shared :class:`ServerState`."""

    def __init__(self, state: ServerState) -> None:
        self.state = state

    async def chat(self, request: web.Request) -> web.StreamResponse:
        try:
            body = orjson.loads(await request.read() or b"{}")
            return json_response(self.response(body))
        except orjson.JSONDecodeError:
            return error_reply(VLLMError("Expecting value: the body is not JSON"))
        except VLLMError as exc:
            return error_reply(exc)

    def response(self, body: Any) -> dict[str, Any]:
        """The ``ChatCompletionResponse`` for a ``DerenderChatRequest`` body (VLLMError: 400/404)."""
        if not isinstance(body, dict):
            raise invalid_body("body", "Input should be a valid dictionary", body, "dict_type")
        if body.get("generate_response") is None:
            raise missing("generate_response", body)
        if not isinstance(body["generate_response"], dict):
            raise invalid_body(
                "generate_response", "Input should be a valid dictionary", body["generate_response"]
            )
        check_model(self.state, body.get("model"))
        gen, chat = body["generate_response"], body.get("chat_request")
        c = self.state.config
        if chat is None and (c.reasoning_parser or c.tool_call_parser):
            raise VLLMError(_NEEDS_CHAT_REQUEST)
        if chat is not None and not isinstance(chat, dict):
            raise invalid_body("chat_request", "Input should be an object")
        choices = gen.get("choices")
        if not isinstance(choices, list) or not all(isinstance(ch, dict) for ch in choices):
            raise invalid_body("generate_response.choices", "Input should be a valid list")
        out = [self._choice(ch, chat or {}) for ch in choices]
        completion = sum(len(ch.get("token_ids") or []) for ch in choices)
        prompt = body.get("prompt_tokens") or 0
        return {
            "id": str(gen.get("request_id", "")), "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model") or self.state.served_model_name, "choices": out,
            "service_tier": None, "system_fingerprint": None,
            "usage": {"prompt_tokens": prompt, "total_tokens": prompt + completion,
                      "completion_tokens": completion, "prompt_tokens_details": None,
                      "completion_tokens_details": None},
            "prompt_logprobs": None, "prompt_token_ids": None, "prompt_text": None,
            "kv_transfer_params": None, "ec_transfer_params": None, "metrics": None,
        }  # fmt: skip

    def _choice(self, choice: dict[str, Any], chat: Mapping[str, Any]) -> dict[str, Any]:
        ids = choice.get("token_ids") or []
        if not all(type(t) is int and 0 <= t < self.state.model.vocab_size for t in ids):
            raise VLLMError("token_ids must be ids of the model's vocabulary", param="token_ids")
        finish, stop_reason = choice.get("finish_reason", "stop"), choice.get("stop_reason")
        ids = self._without_stop(list(ids), finish, stop_reason, chat)
        text = self.state.model.decode(ids, chat.get("skip_special_tokens", True) is not False)
        reasoning, content = self._reasoning(text)
        calls: list[dict[str, Any]] = []
        if content is not None and self._parses_tools(chat):
            content, calls = hermes_calls(content)
        message = {
            "role": "assistant", "content": content or None, "refusal": None, "annotations": None,
            "audio": None, "function_call": None, **({"tool_calls": calls} if calls else {}),
            "reasoning": reasoning,
        }  # fmt: skip
        return {"index": choice.get("index", 0), "message": message, "logprobs": None,
                "finish_reason": finish, "stop_reason": stop_reason, "token_ids": None,
                "routed_experts": None}  # fmt: skip

    def _without_stop(
        self, ids: list[int], finish: Any, stop_reason: Any, chat: Mapping[str, Any]
    ) -> list[int]:
        """``_drop_stop_token``: the id that ended a ``stop`` generation is not decoded."""
        if finish != "stop" or isinstance(stop_reason, str) or not ids:
            return ids
        last = ids[-1]
        if stop_reason is None:
            stops = chat.get("stop_token_ids") or []
            stopped = (
                not chat.get("ignore_eos") and last == self.state.model.engine.eos_token_id
            ) or last in stops
        else:
            stopped = last == stop_reason
        return ids[:-1] if stopped and not chat.get("include_stop_str_in_output") else ids

    def _reasoning(self, text: str) -> tuple[str | None, str | None]:
        parser = self.state.config.reasoning_parser
        if parser is None:
            return None, text
        opened = text.startswith(THINK_START)
        body = text.partition(THINK_START)[2] if THINK_START in text else text
        if THINK_END in body:
            reasoning, _, content = body.partition(THINK_END)
            return reasoning, content or None
        if parser == "deepseek_r1" or opened:
            return body, None
        return None, text

    def _parses_tools(self, chat: Mapping[str, Any]) -> bool:
        options = self.state.config.vllm
        choice = chat.get("tool_choice", "auto")
        return bool(
            self.state.config.tool_call_parser and chat.get("tools") and choice in ("auto", None)
            and options is not None and options.enable_auto_tool_choice
        )  # fmt: skip


def hermes_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """``Hermes2ProToolParser.extract_tool_calls``: (content, calls)."""
    if "<tool_call>" not in text:
        return text, []
    try:
        found = [json.loads(closed or open_ended) for closed, open_ended in _CALL.findall(text)]
        calls = [
            {"id": uuid.uuid4().hex[:16], "type": "function",
             "function": {"name": call["name"],
                          "arguments": json.dumps(call["arguments"], ensure_ascii=False)}}
            for call in found
        ]  # fmt: skip
    except (json.JSONDecodeError, KeyError, TypeError):
        return text, []
    return text[: text.find("<tool_call>")] or None, calls
