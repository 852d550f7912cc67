"""``/tokenize`` with ``messages``: SGLang 0.5.23's chat path (``serving_tokenize.py:52``) over
:mod:`eagle3_raw.sglang.chatpath`, with the model's chat template (or ``--chat-template``'s).

Answers ``{"tokens", "count", "max_model_len"}``. Refusals, as SGLang sends them: a body its
pydantic models refuse gets FastAPI's 400 (``"type": "Bad Request"``); the chat path's
``ValueError``\\ s (``Messages cannot be empty.``, unparsable tool-call arguments, a template that
raises, ...) a 400 ``{"object": "error", "type": "BadRequestError", ...}``; any other failure while
rendering a 500 with ``Internal server error during tokenization: ...``; a body with
``"stream": true`` a 501 (the handler has no streaming path, ``serving_base.py:164``).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from eagle3_raw.reference.server.model import Model
from eagle3_raw.reference.server.replies import json_response
from eagle3_raw.sglang import chatpath
from eagle3_raw.sglang import protocol as p
from eagle3_raw.sglang.chatrequest import ChatRequestError

_NO_STREAM = "OpenAIServingTokenize does not support streaming requests"


def chat_tokenize(model: Model, body: dict[str, Any], max_model_len: int) -> web.Response:
    """The reply to a ``/tokenize`` body that has ``messages``."""
    if body.get("stream"):
        return json_response(p.error_object(_NO_STREAM, "NotImplementedError", 501), 501)
    try:
        ids = render(model, body)
    except ChatRequestError as exc:
        return refusal(exc)
    return json_response({"tokens": ids, "count": len(ids), "max_model_len": max_model_len})


def render(model: Model, body: dict[str, Any]) -> list[int]:
    """The prompt ids SGLang's chat path makes of ``body`` (raises :class:`ChatRequestError`)."""
    messages, tools, options = chatpath.body_options(body)
    tokenizer, template = model.chat_tokenizer, model.chat_template
    request = chatpath.normalize_request(messages, tools, chat_template=template, **options)
    return chatpath.render_ids(tokenizer, request, template)


def refusal(exc: ChatRequestError) -> web.Response:
    if exc.kind == "validation":
        return json_response(p.error_object(exc.message, "Bad Request", 400), 400)
    if exc.kind == "internal":
        message = f"Internal server error during tokenization: {exc.message}"
        return json_response(p.error_object(message, "InternalServerError", 500), 500)
    return json_response(p.error_object(exc.message, "BadRequestError", 400), 400)
