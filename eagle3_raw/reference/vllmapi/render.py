"""``POST /v1/chat/completions/render``: a chat request -> the ``GenerateRequest`` vLLM would send
its engine: ``token_ids`` as ``/tokenize`` renders the chat (:mod:`.chat`), ``request_id``
``chatcmpl-<random>``, and ``sampling_params`` with vLLM's defaults under the request's own keys
(``max_tokens`` the rest of the context unless given).
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
    "n": 1, "presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0,
    "temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "seed": None, "stop": [],
    "stop_token_ids": [], "ignore_eos": False, "min_tokens": 0, "logprobs": None,
    "prompt_logprobs": None, "skip_special_tokens": True, "spaces_between_special_tokens": True,
    "include_stop_str_in_output": False, "logit_bias": None,
}  # fmt: skip


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
    given = {key: body[key] for key in _DEFAULTS if body.get(key) is not None}
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    sampling = parse_sampling({**given, "max_tokens": max_tokens}, None)
    params = {
        **_DEFAULTS,
        **given,
        "max_tokens": fit_max_tokens(sampling.max_tokens, len(ids), state.model.context_len),
    }
    return {
        "request_id": f"chatcmpl-{uuid.uuid4().hex}", "token_ids": ids, "sampling_params": params,
        "model": state.served_model_name, "stream": False, "output_mode": "tokens",
    }  # fmt: skip
