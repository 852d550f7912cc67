"""``POST /separate_reasoning`` and ``POST /parse_function_call`` (``shared/sglang-protocol.md`` §14.2),
over :mod:`eagle3_raw.sglang.parsers`. A body that does not fit SGLang's request struct gets
FastAPI's 400; an unknown parser name a plain-text 500, as SGLang's uncaught constructor error.
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from eagle3_raw.reference.server.replies import json_response
from eagle3_raw.sglang import parsers
from eagle3_raw.sglang import protocol as p
from eagle3_raw.sglang.chatrequest import ChatRequestError, dump_tools


async def separate_reasoning(request: web.Request) -> web.StreamResponse:
    """``{text, reasoning_parser, return_blocks?}`` → ``{reasoning_text, text}`` (+ blocks)."""
    body = await _body(request)
    text: Any = body.get("text")
    name: Any = body.get("reasoning_parser")
    blocks: Any = body.get("return_blocks", False)
    for field, value, kind in (
        ("text", text, str),
        ("reasoning_parser", name, str),
        ("return_blocks", blocks, bool),
    ):
        if not isinstance(value, kind):
            return _invalid(field, value)
    return _answer(lambda: parsers.separate_reasoning(text, name, blocks))


async def parse_function_call(request: web.Request) -> web.StreamResponse:
    """``{text, tools, tool_call_parser}`` → ``{normal_text, calls: [{tool_index, name, parameters}]}``."""
    body = await _body(request)
    text, name = body.get("text"), body.get("tool_call_parser")
    if not isinstance(text, str):
        return _invalid("text", text)
    if name is not None and not isinstance(name, str):
        return _invalid("tool_call_parser", name)
    try:
        tools = dump_tools(body.get("tools", []))
    except ChatRequestError as exc:
        return json_response(p.error_object(exc.message, "Bad Request", 400), 400)
    return _answer(lambda: parsers.parse_function_call(text, tools, name))


def _answer(parse: Any) -> web.Response:
    try:
        return json_response(parse(), 200)
    except parsers.AdapterParser as exc:
        return json_response(p.error_object(str(exc), "400", 400), 400)
    except parsers.NotImplementedParser as exc:
        return json_response(p.error_object(str(exc), "NotImplementedError", 501), 501)
    except Exception:  # what SGLang does not catch: FastAPI's plain-text 500
        return web.Response(status=500, text="Internal Server Error")


async def _body(request: web.Request) -> dict[str, Any]:
    try:
        body = orjson.loads(await request.read() or b"{}")
    except orjson.JSONDecodeError:
        return {}
    return body if isinstance(body, dict) else {}


def _invalid(field: str, value: Any) -> web.Response:
    kind = "missing" if value is None else "value_error"
    return json_response(p.validation_error(kind, (field,), "Input should be valid", value).body, 400)
