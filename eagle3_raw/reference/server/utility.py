"""The utility endpoints (``shared/sglang-protocol.md`` §5, §6, §14.1): ``/tokenize`` (prompts, or
chat ``messages`` through :mod:`.tokenize`) and ``/detokenize`` (also under ``/v1``),
``/flush_cache`` and ``/abort_request``.

Their bodies are small pydantic models in SGLang: a body that does not fit gets FastAPI's 400
validation body; without a tokenizer (``--skip-tokenizer-init``) the token endpoints answer 500.
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from eagle3_raw.reference.server.replies import json_response
from eagle3_raw.reference.server.state import ServerState
from eagle3_raw.reference.server.tokenize import chat_tokenize
from eagle3_raw.sglang import protocol as p

_FLUSHED = (
    "Cache flushed.\nPlease check backend logs for more details. "
    "(When there are running or waiting requests, the operation will not be performed.)\n"
)


class Utility:
    """The utility endpoints over the shared :class:`ServerState`."""

    def __init__(self, state: ServerState) -> None:
        self.state = state

    async def tokenize(self, request: web.Request) -> web.StreamResponse:
        """``/tokenize``: ``{"prompt": str | [str], "add_special_tokens": true}`` → tokens, count; or
        ``{"messages": [...], "tools", ...}`` rendered by the chat path (:mod:`.tokenize`)."""
        body = await _json_body(request)
        prompt: Any = body.get("prompt")
        add_special = body.get("add_special_tokens", True)
        if "__invalid__" in body or (prompt is None) == (body.get("messages") is None):
            return _exactly_one(body)
        valid = prompt is None or isinstance(prompt, str) or (
            isinstance(prompt, list) and all(isinstance(t, str) for t in prompt)
        )  # fmt: skip
        if not valid or not isinstance(add_special, bool):
            return _invalid("prompt", prompt)
        model = self.state.model
        if model.tokenizer is None:
            return _no_tokenizer("tokenization")
        limit = model.model_max_length
        limit = limit if isinstance(limit, int) and -(2**63) <= limit < 2**64 else model.context_len
        if prompt is None:
            return chat_tokenize(model, body, limit)
        if isinstance(prompt, str):
            ids = model.encode(prompt, add_special)
            return json_response({"tokens": ids, "count": len(ids), "max_model_len": limit})
        rows = [model.encode(text, add_special) for text in prompt]
        return json_response({"tokens": rows, "count": [len(ids) for ids in rows], "max_model_len": limit})

    async def detokenize(self, request: web.Request) -> web.StreamResponse:
        """``/detokenize``: ``{"tokens": [int] | [[int]], "skip_special_tokens": true}`` → text."""
        body = await _json_body(request)
        tokens: Any = body.get("tokens")
        skip = body.get("skip_special_tokens", True)
        nested = isinstance(tokens, list) and bool(tokens) and isinstance(tokens[0], list)
        rows: list[Any] = tokens if nested else [tokens]
        if not all(_is_id_list(row) for row in rows) or not isinstance(skip, bool):
            return _invalid("tokens", tokens)
        if self.state.model.tokenizer is None:
            return _no_tokenizer("detokenization")
        try:
            texts = [self.state.model.decode(row, skip) for row in rows]
        except (OverflowError, ValueError, TypeError) as exc:
            message = f"Error decoding tokens: {exc}. Input tokens might be invalid for the model."
            return json_response(p.error_object(message, "DecodeError", 400), 400)
        return json_response({"text": texts if nested else texts[0]})

    async def flush_cache(self, request: web.Request) -> web.StreamResponse:
        """``/flush_cache``: clears the prefix cache; refused (400) while generations run or wait."""
        if self.state.running or self.state.waiting:
            return web.Response(status=400, text="Flush cache failed.\n")
        if self.state.cache is not None:
            self.state.cache.clear()
        return web.Response(status=200, text=_FLUSHED)

    async def abort_request(self, request: web.Request) -> web.StreamResponse:
        """``/abort_request``: ``{"rid": ..., "abort_all": false}``; exact rid, in flight only."""
        body = await _json_body(request)
        rid, abort_all = body.get("rid", ""), body.get("abort_all", False)
        if not isinstance(rid, str) or not isinstance(abort_all, bool):
            return _invalid("rid", rid)
        inflight, slots = self.state.inflight, self.state.slots
        tickets = list(inflight.values()) if abort_all else [inflight.get(rid)] if rid else []
        for ticket in tickets:
            if ticket is not None and slots is not None:
                slots.abort(ticket)
        return web.Response(status=200)


async def _json_body(request: web.Request) -> dict[str, Any]:
    """The body as a JSON object: ``{}`` when empty, ``{"__invalid__": True}`` when it is not one."""
    try:
        body = orjson.loads(await request.read() or b"{}")
    except orjson.JSONDecodeError:
        return {"__invalid__": True}
    return body if isinstance(body, dict) else {"__invalid__": True}


def _is_id_list(row: Any) -> bool:
    return isinstance(row, list) and all(type(t) is int for t in row)


def _invalid(field_name: str, value: Any) -> web.Response:
    """FastAPI's 400 for a body that does not fit the endpoint's pydantic model."""
    body = p.validation_error("value_error", (field_name,), "Input should be valid", value).body
    return json_response(body, 400)


def _exactly_one(body: dict[str, Any]) -> web.Response:
    """``TokenizeRequest``'s model validator: exactly one of ``prompt`` and ``messages``."""
    message = "Value error, Exactly one of 'prompt' or 'messages' must be provided."
    error = p.validation_error("value_error", (), message, body).body
    return json_response(error, 400)


def _no_tokenizer(action: str) -> web.Response:
    """The 500 of a token endpoint on a server started with ``--skip-tokenizer-init``."""
    error = f"Internal server error during {action}: the server runs with --skip-tokenizer-init"
    return json_response(p.error_object(error, "InternalServerError", 500), 500)
