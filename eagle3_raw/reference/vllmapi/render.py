"""``POST /v1/chat/completions/render``: a chat request -> the ``GenerateRequest`` vLLM would send
its engine: ``token_ids`` as ``/tokenize`` renders the chat (:mod:`.chat`), ``request_id``
``chatcmpl-<16 hex>``, and ``sampling_params`` with the keys the real 0.32 fills in under the
request's own (``max_tokens`` the rest of the context unless given), the other keys as it sends them.
"""

from __future__ import annotations

import uuid
from typing import Any

import orjson
from aiohttp import web

from eagle3_raw.reference.server.replies import json_response
from eagle3_raw.reference.server.state import ServerState
from eagle3_raw.reference.vllmapi.chat import render_ids
from eagle3_raw.reference.vllmapi.errors import VLLMError, error_reply, invalid_body
from eagle3_raw.reference.vllmapi.requests import check_model
from eagle3_raw.reference.vllmapi.sampling import fit_max_tokens, parse_sampling

_AUTO_TOOLS = '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
_DEFAULTS: dict[str, Any] = {
    "presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0, "temperature": 1.0,
    "top_p": 1.0, "min_p": 0.0, "stop": [], "stop_token_ids": [], "max_tokens": None,
    "skip_special_tokens": False, "output_kind": 2, "skip_clone": True, "bad_words": [],
    "skip_reading_prefix_cache": False,
}  # fmt: skip
"""The ``sampling_params`` keys the real 0.32 renders for a chat request that sets none (``top_k``,
``seed``, ``n``, ... appear only when the request gives them)."""
_SAMPLING_KEYS = (
    "n", "presence_penalty", "frequency_penalty", "repetition_penalty", "temperature", "top_p", "top_k",
    "min_p", "seed", "stop", "stop_token_ids", "ignore_eos", "min_tokens", "logit_bias",
    "skip_special_tokens", "include_stop_str_in_output",
)  # fmt: skip


class Render:
    """The render route over the shared :class:`ServerState`."""

    def __init__(self, state: ServerState) -> None:
        self.state = state

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await render_chat(self.state, request)


async def render_chat(state: ServerState, request: web.Request) -> web.StreamResponse:
    try:
        body = orjson.loads(await request.read() or b"{}")
        return json_response(generate_request(state, body))
    except orjson.JSONDecodeError:
        return error_reply(VLLMError("Expecting value: the body is not JSON"))
    except VLLMError as exc:
        return error_reply(exc)


def generate_request(state: ServerState, body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise invalid_body("body", "Input should be a valid dictionary or object to extract fields from")
    check_model(state, body.get("model"))
    options = state.config.vllm
    if (
        body.get("tools")
        and body.get("tool_choice", "auto") == "auto"
        and not (options is not None and options.enable_auto_tool_choice and state.config.tool_call_parser)
    ):
        raise VLLMError(_AUTO_TOOLS)
    ids = render_ids(state.model, body)
    given = {key: body[key] for key in _SAMPLING_KEYS if body.get(key) is not None}
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    sampling = parse_sampling({**given, "max_tokens": max_tokens}, None)
    fitted = fit_max_tokens(sampling.max_tokens, len(ids), state.model.context_len)
    kwargs = {"cohere_format": "cmd4", "add_generation_prompt": body.get("add_generation_prompt", True),
              "continue_final_message": body.get("continue_final_message", False),
              **(body.get("chat_template_kwargs") or {})}  # fmt: skip
    parser_kwargs = {"chat_template_kwargs": kwargs} if state.config.reasoning_parser else None
    return {
        "request_id": f"chatcmpl-{uuid.uuid4().hex[:16]}", "token_ids": ids, "token_offsets": None,
        "features": None, "content_parts": None,
        "sampling_params": {**_DEFAULTS, **given, "max_tokens": fitted}, "model": None,
        "reasoning_ended": False, "reasoning_parser_kwargs": parser_kwargs, "return_token_ids": None,
        "output_mode": "tokens", "stream": False, "stream_options": None, "cache_salt": None,
        "priority": 0, "kv_transfer_params": None, "ec_transfer_params": None,
    }  # fmt: skip
