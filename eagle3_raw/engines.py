"""The engines eagle3_raw speaks to, by name, and which one a server is.

``server.engine`` names it (``sglang`` or ``vllm``); left out, :func:`detect` asks the server:
both engines list their model on ``/v1/models``, vLLM as ``owned_by: vllm`` (SGLang says
``sglang``). A set is one engine's: the engine is part of its target (:class:`~eagle3_raw.identity.Target`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal

from eagle3_raw.errors import EndpointNotFound, ServerMismatch
from eagle3_raw.serving import Engine, ServerIdentity
from eagle3_raw.sglang.engine import SGLANG
from eagle3_raw.transport import get_json
from eagle3_raw.vllm.engine import VLLM

if TYPE_CHECKING:
    from aiohttp import ClientSession

EngineName = Literal["sglang", "vllm"]

ENGINES: Mapping[str, Engine] = {"sglang": SGLANG, "vllm": VLLM}


def engine_named(name: str) -> Engine:
    """The engine called ``name`` (``sglang`` or ``vllm``)."""
    try:
        return ENGINES[name]
    except KeyError:
        raise ServerMismatch(f"no engine named {name!r}: eagle3_raw speaks {', '.join(ENGINES)}") from None


async def detect(session: ClientSession, url: str, timeout: float) -> str:
    """Which engine the server at ``url`` is: ``vllm`` when ``/v1/models`` says its model is owned
    by vllm, else ``sglang`` (whose own identity routes then say whether it is one)."""
    try:
        models = await get_json(session, f"{url}/v1/models", timeout)
    except (EndpointNotFound, ServerMismatch):
        return "sglang"
    data = models.get("data") if isinstance(models, dict) else None
    first = data[0] if isinstance(data, list) and data else None
    return "vllm" if isinstance(first, dict) and first.get("owned_by") == "vllm" else "sglang"


async def identify(session: ClientSession, url: str, timeout: float, engine: str | None) -> ServerIdentity:
    """The identity of the server at ``url``, asked as ``engine`` (None: :func:`detect` it first)."""
    name = engine if engine is not None else await detect(session, url, timeout)
    return await engine_named(name).server_identity(session, url, timeout)
