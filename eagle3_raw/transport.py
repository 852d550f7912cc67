"""HTTP for every engine's client: one session per run, bounded reads, no redirects followed.

What a server sends is bounded: a body is read incrementally and refused once it passes its cap
(:func:`eagle3_raw.limits.response_cap` for a generation), so a server cannot make the client hold
more than that per request. Redirects are never followed (a 3xx is an error naming its Location):
the request, and the API key with it, would go to a server that was never checked. A status other
than 200 is raised as the error :func:`~eagle3_raw.statuses.http_error` chooses for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

import aiohttp
import orjson

from eagle3_raw import limits
from eagle3_raw.errors import ConnectError, InvalidResponse, RequestTimeout, ServerMismatch, ServerUnreachable
from eagle3_raw.redact import public_url
from eagle3_raw.statuses import http_error


def new_session(*, connect_timeout: float, api_key: str | None, limit: int = 0) -> aiohttp.ClientSession:
    """An HTTP session for one run. ``limit`` 0 means no connection cap (the pool bounds requests)."""
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=limit, force_close=False),
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout),
        headers=headers,
        json_serialize=lambda obj: orjson.dumps(obj).decode(),
    )


async def post(
    session: aiohttp.ClientSession, url: str, body: bytes, timeout: float, *, cap: int, shown: str,
    engine: str = "SGLang",
) -> bytes:  # fmt: skip
    """POST ``body``; the 200 body (at most ``cap`` bytes), else the error raised for the status
    (``engine``: the server's engine, as error messages name it)."""
    try:
        async with asyncio.timeout(timeout):
            async with session.post(url, data=body, allow_redirects=False) as response:
                return await read_ok(response, cap, shown, engine)
    except TimeoutError as exc:
        raise RequestTimeout(f"no response from {shown} within {timeout:g} s", url=shown) from exc
    except aiohttp.ClientError as exc:  # refused, reset, malformed HTTP: all worth another try
        raise ConnectError(f"connection to {shown} failed: {reason(exc, timeout)}", url=shown) from exc


async def read_ok(response: aiohttp.ClientResponse, cap: int, shown: str, engine: str = "SGLang") -> bytes:
    """The body of a 200 answer, read within ``cap`` bytes; any other status raised as its error
    (its body read only up to :data:`~eagle3_raw.limits.ERROR_BODY_BYTES`)."""
    if response.status != HTTPStatus.OK:
        payload = await read_prefix(response, limits.ERROR_BODY_BYTES)
        location = response.headers.get("Location")
        raise http_error(response.status, payload, shown, location=location, engine=engine)
    if response.content_length is not None:  # aiohttp reads exactly that many bytes, no more
        if response.content_length > cap:
            raise too_large(shown, cap, f"announces {response.content_length:,}")
        return await response.read()
    body = bytearray()
    async for chunk in response.content.iter_chunked(1 << 16):
        body += chunk
        if len(body) > cap:
            raise too_large(shown, cap, "sent more")
    return bytes(body)


async def read_prefix(response: aiohttp.ClientResponse, size: int) -> bytes:
    """The first ``size`` bytes of the body (all of it if shorter); the rest is left unread."""
    body = bytearray()
    while len(body) < size and (chunk := await response.content.read(size - len(body))):
        body += chunk
    return bytes(body)


def too_large(shown: str, cap: int, what: str) -> InvalidResponse:
    return InvalidResponse(
        f"the response of {shown} {what} than the {cap:,} bytes a reply to this request can need "
        "(from max_new_tokens and the prompt); not read further",
        url=shown,
    )


def reason(exc: BaseException, timeout: float) -> str:
    """What went wrong, never empty (``str(TimeoutError())`` and some aiohttp errors are ``""``).

    A timeout with a message of its own (aiohttp's connect timeout) keeps it: ``timeout`` is not its limit.
    """
    if str(exc):
        return str(exc)
    return f"no answer within {timeout:g} s" if isinstance(exc, TimeoutError) else type(exc).__name__


def decode_object(payload: bytes, url: str) -> Mapping[str, Any]:
    try:
        result = orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        raise InvalidResponse(f"response from {url} is not JSON: {exc}", url=url) from exc
    if not isinstance(result, dict):
        raise InvalidResponse(f"response from {url} is not one JSON object", url=url)
    return result


async def get_json(
    session: aiohttp.ClientSession, url: str, timeout: float, *, engine: str = "SGLang"
) -> Any:
    """GET a JSON document (at most :data:`~eagle3_raw.limits.SIDE_BODY_BYTES`); connection problems
    raise ServerUnreachable, other statuses their :func:`~eagle3_raw.statuses.http_error`."""
    shown = public_url(url)
    try:
        async with asyncio.timeout(timeout):
            async with session.get(url, allow_redirects=False) as response:
                payload = await read_ok(response, limits.SIDE_BODY_BYTES, shown, engine)
    except (TimeoutError, aiohttp.ClientError) as exc:
        raise ServerUnreachable(f"cannot reach {shown}: {reason(exc, timeout)}") from exc
    except InvalidResponse as exc:
        raise ServerMismatch(str(exc)) from exc
    try:
        return orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        raise ServerUnreachable(f"{shown} did not answer JSON: is it an {engine} server?") from exc


async def health(session: aiohttp.ClientSession, url: str, timeout: float) -> bool:
    """True when ``/health`` answers 200 (SGLang runs a one-token generation for it, vLLM none)."""
    try:
        async with asyncio.timeout(timeout):
            async with session.get(f"{url}/health", allow_redirects=False) as response:
                await read_prefix(response, limits.ERROR_BODY_BYTES)
                return response.status == HTTPStatus.OK
    except (TimeoutError, aiohttp.ClientError):
        return False
