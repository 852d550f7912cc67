"""The vLLM-mode aiohttp application: vLLM 0.33's routes over the same :class:`ServerState` as the
SGLang mode's, FastAPI's ``{"detail": "Not Found"}`` for every other path (SGLang's routes
included), the scale-out routes' 403 without ``--enable-scale-out``, the dev-mode routes only with
``VLLM_SERVER_DEV_MODE=1``, and vLLM's API-key check (``serve/middleware/authenticate.py``: only
paths under ``/v1``, ``/v2``, ``/inference``, ``/cohere`` need the key; ``/health``, ``/tokenize``,
``/version`` stay open).
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from eagle3_raw.reference.server.info import Info
from eagle3_raw.reference.server.replies import json_response
from eagle3_raw.reference.server.state import ServerState
from eagle3_raw.reference.vllmapi.derender import Derender
from eagle3_raw.reference.vllmapi.errors import SCALE_OUT_DISABLED, error_reply
from eagle3_raw.reference.vllmapi.generation import Generations
from eagle3_raw.reference.vllmapi.info import VLLMInfo, dev_mode
from eagle3_raw.reference.vllmapi.render import Render
from eagle3_raw.reference.vllmapi.tokens import Tokens

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
GUARDED_PREFIX = ("/v1", "/v2", "/inference", "/cohere")


def _auth_middleware(api_key: str) -> Any:
    expected = hashlib.sha256(api_key.encode()).digest()

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method != "OPTIONS" and request.path.startswith(GUARDED_PREFIX):
            scheme, _, token = request.headers.get("Authorization", "").partition(" ")
            given = hashlib.sha256(token.encode()).digest()
            if scheme.lower() != "bearer" or not secrets.compare_digest(given, expected):
                return json_response({"error": "Unauthorized"}, 401)
        return await handler(request)

    return check


@web.middleware
async def _fastapi_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPNotFound:
        return json_response({"detail": "Not Found"}, 404)
    except web.HTTPMethodNotAllowed:
        return json_response({"detail": "Method Not Allowed"}, 405)


async def _scale_out_disabled(request: web.Request) -> web.StreamResponse:
    return error_reply(SCALE_OUT_DISABLED)


def build_vllm_app(state: ServerState) -> web.Application:
    """The aiohttp application serving vLLM's routes over ``state`` (``state.config.vllm`` set)."""
    assert state.config.vllm is not None
    middlewares = [_fastapi_errors]
    if state.config.api_key:
        middlewares.append(_auth_middleware(state.config.api_key))
    app = web.Application(middlewares=middlewares, client_max_size=1 << 30)
    info, tokens, generations, reference = VLLMInfo(state), Tokens(state), Generations(state), Info(state)
    routes: list[tuple[str, str, Handler]] = [
        ("GET", "/health", info.health), ("GET", "/version", info.version),
        ("GET", "/v1/models", info.models),
        ("POST", "/v1/completions", generations.completions),
        ("POST", "/tokenize", tokens.tokenize), ("POST", "/detokenize", tokens.detokenize),
        ("GET", "/reference/stats", reference.stats),
        ("POST", "/reference/stats/reset", reference.reset_stats),
    ]  # fmt: skip
    scale_out: list[tuple[str, str, Handler]] = [
        ("POST", "/inference/v1/generate", generations.generate),
        ("POST", "/inference/v1/abort_requests", info.abort_requests),
        ("POST", "/v1/chat/completions/render", Render(state).chat),
        ("POST", "/v1/chat/completions/derender", Derender(state).chat),
    ]
    enabled = state.config.vllm.enable_scale_out
    routes += [
        (method, path, handler if enabled else _scale_out_disabled) for method, path, handler in scale_out
    ]
    if dev_mode():
        routes += [
            ("GET", "/server_info", info.server_info), ("GET", "/weight_info", info.weight_info),
            ("POST", "/reset_prefix_cache", info.reset_prefix_cache),
        ]  # fmt: skip
    for method, path, handler in routes:
        app.router.add_route(method, path, handler)
    return app
