"""``POST /tokenize`` (a ``prompt`` text, or chat ``messages`` through :mod:`.chat`) and
``POST /detokenize`` in vLLM mode: ``TokenizeResponse`` ``{"count", "max_model_len", "tokens",
"token_strs"}`` and ``DetokenizeResponse`` ``{"prompt"}``.
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from eagle3_raw.reference.server.replies import json_response
from eagle3_raw.reference.server.state import ServerState
from eagle3_raw.reference.vllmapi.chat import render_ids
from eagle3_raw.reference.vllmapi.errors import VLLMError, error_reply, invalid_body
from eagle3_raw.reference.vllmapi.requests import check_model


class Tokens:
    """The token routes over the shared :class:`ServerState`."""

    def __init__(self, state: ServerState) -> None:
        self.state = state

    async def tokenize(self, request: web.Request) -> web.StreamResponse:
        try:
            return json_response(self._tokenize(await _body(request)))
        except VLLMError as exc:
            return error_reply(exc)

    def _tokenize(self, body: dict[str, Any]) -> dict[str, Any]:
        check_model(self.state, body.get("model"))
        model = self.state.model
        if "messages" in body:
            ids = render_ids(model, body)
        else:
            prompt, special = body.get("prompt"), body.get("add_special_tokens", True)
            if not isinstance(prompt, str):
                raise invalid_body(
                    "prompt", "Field required" if prompt is None else "Input should be a valid string"
                )
            if not isinstance(special, bool):
                raise invalid_body("add_special_tokens", "Input should be a valid boolean")
            ids = model.encode(prompt, special)
        strs = None
        if body.get("return_token_strs"):
            assert model.tokenizer is not None
            strs = [model.tokenizer.id_to_token(i) for i in ids]
        return {"count": len(ids), "max_model_len": model.context_len, "tokens": ids, "token_strs": strs}

    async def detokenize(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await _body(request)
            check_model(self.state, body.get("model"))
            tokens = body.get("tokens")
            if not isinstance(tokens, list) or not all(type(t) is int and 0 <= t < 2**63 for t in tokens):
                raise invalid_body("tokens", "Input should be a valid list of non-negative integers")
            if tokens and max(tokens) >= self.state.model.vocab_size:
                raise VLLMError(f"Token id {max(tokens)} is out of vocabulary", param="tokens")
        except VLLMError as exc:
            return error_reply(exc)
        return json_response(
            {"prompt": self.state.model.decode(tokens, False)}
        )  # tokenizer.decode(ids): specials kept


async def _body(request: web.Request) -> dict[str, Any]:
    try:
        body = orjson.loads(await request.read() or b"{}")
    except orjson.JSONDecodeError:
        raise VLLMError("Expecting value: the body is not JSON") from None
    if not isinstance(body, dict):
        raise invalid_body("body", "Input should be a valid dictionary or object to extract fields from")
    return body
