"""The aiohttp application: the routes, FastAPI's JSON bodies for unknown paths and wrong methods,
the ``--api-key`` check (health probes stay open), and :func:`serve`, which runs it all.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from eagle3_raw.reference.server import parsing
from eagle3_raw.reference.server.config import ServerConfig
from eagle3_raw.reference.server.generate import Generate
from eagle3_raw.reference.server.info import Info
from eagle3_raw.reference.server.model import Model
from eagle3_raw.reference.server.replies import json_response
from eagle3_raw.reference.server.state import ServerState
from eagle3_raw.reference.server.utility import Utility
from eagle3_raw.sglang import protocol as p

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_OPEN_PATHS = ("/health", "/ready", "/metrics")


def _auth_middleware(api_key: str) -> Any:
    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method != "OPTIONS" and not request.path.startswith(_OPEN_PATHS):
            scheme, _, token = request.headers.get("Authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not secrets.compare_digest(token, api_key):
                return json_response({"error": "Unauthorized"}, 401)
        return await handler(request)

    return check


@web.middleware
async def _json_bodies_only(request: web.Request, handler: Handler) -> web.StreamResponse:
    """FastAPI reads a body as JSON only without a ``Content-Type`` or with a JSON one
    (``application/json``, ``application/*+json``); any other body is bytes, which no endpoint's
    model takes: a 400 validation error (seen from the real SGLang: tests/real_sglang)."""
    declared = request.headers.get("Content-Type")
    if request.method in ("POST", "PUT") and declared and request.content_length != 0:
        kind, _, subtype = request.content_type.partition("/")
        if kind != "application" or not (subtype == "json" or subtype.endswith("+json")):
            error = p.validation_error("model_attributes_type", (), "Input should be a valid dict", declared)
            return json_response(error.body, 400)
    return await handler(request)


@web.middleware
async def _fastapi_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """FastAPI's JSON bodies for unknown paths and wrong methods."""
    try:
        return await handler(request)
    except web.HTTPNotFound:
        return json_response({"detail": "Not Found"}, 404)
    except web.HTTPMethodNotAllowed:
        return json_response({"detail": "Method Not Allowed"}, 405)


def build_app(state: ServerState) -> web.Application:
    """The aiohttp application serving the routes over ``state``."""
    middlewares = [_fastapi_errors]
    if state.config.api_key:
        middlewares.append(_auth_middleware(state.config.api_key))
    middlewares.append(_json_bodies_only)  # after the key check, as FastAPI's body parsing is
    app = web.Application(middlewares=middlewares, client_max_size=1 << 30)
    generate, info, utility = Generate(state).handle, Info(state), Utility(state)
    routes: list[tuple[str, str, Handler]] = [
        ("POST", "/generate", generate), ("PUT", "/generate", generate),
        ("GET", "/health", info.health), ("GET", "/health_generate", info.health),
        ("GET", "/model_info", info.model_info), ("GET", "/get_model_info", info.model_info),
        ("GET", "/server_info", info.server_info), ("GET", "/get_server_info", info.server_info),
        ("GET", "/v1/models", info.models), ("GET", "/v1/loads", info.loads),
        ("POST", "/tokenize", utility.tokenize), ("POST", "/v1/tokenize", utility.tokenize),
        ("POST", "/detokenize", utility.detokenize), ("POST", "/v1/detokenize", utility.detokenize),
        ("GET", "/flush_cache", utility.flush_cache), ("POST", "/flush_cache", utility.flush_cache),
        ("POST", "/abort_request", utility.abort_request),
        ("POST", "/separate_reasoning", parsing.separate_reasoning),
        ("POST", "/parse_function_call", parsing.parse_function_call),
        ("GET", "/reference/stats", info.stats), ("POST", "/reference/stats/reset", info.reset_stats),
    ]  # fmt: skip
    for method, path, handler in routes:
        app.router.add_route(method, path, handler)
    return app


async def serve(
    config: ServerConfig,
    *,
    ready: Callable[[str], None] | None = None,
    build: Callable[[ServerState], web.Application] = build_app,
) -> None:
    """Load the model, serve ``build``'s application (SGLang's routes unless told) until cancelled
    (SIGINT/SIGTERM), then close cleanly."""
    model = Model(
        config.model_path,
        tokenizer=not config.skip_tokenizer_init,
        context_length=config.context_length,
        chat_template=config.chat_template,
        weight_version=config.weight_version,
        trust_remote_code=config.trust_remote_code,
    )
    state = ServerState(config, model)
    runner = web.AppRunner(build(state), handler_cancellation=True, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    try:
        await web.TCPSite(runner, config.host, config.port, reuse_address=True).start()
        if ready is not None:
            ready(f"http://{config.host}:{config.port}")
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
        state.close()
