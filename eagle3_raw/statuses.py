"""What an HTTP status from a server means for the run: retry, record the row, or stop.

Dispatched on the status code, never on the message, with one exception SGLang forces: a rid
still in flight is a 400 whose only mark is its message ("Duplicate request ID"). vLLM answers
400 for what it refuses (validation, a prompt past the context), 401 without the key, 403 for a
scale-out route it was not started to serve (``--enable-scale-out``), 404 for no such route or
model, 500 for an engine error (``docs/vllm-protocol.md``). The statuses SGLang 0.5.23 itself
answers (``shared/sglang-protocol.md`` §5): 400 (validation, ``ValueError``,
scheduler aborts with status 400), 401 (no or wrong ``--api-key``), 403 (an admin-only route),
404 and 405 (no such route: FastAPI), 500 and 503 (scheduler aborts: queue full, waiting or running
timeouts, retraction without a KV backup, out of memory; ``http_server.py:2246``,
``tokenizer_manager.py:1891``). Proxies and routers in front of it add 408, 413, 429, 502 and 504.

Error bodies are read only up to :data:`~eagle3_raw.limits.ERROR_BODY_BYTES`, and the message
taken from them is escaped (:func:`~eagle3_raw.printable.printable`): it is a stranger's text.
"""

from __future__ import annotations

from http import HTTPStatus

from eagle3_raw.errors import (
    AuthError,
    EndpointNotFound,
    InvalidResponse,
    Redirected,
    RequestRejected,
    ServerBusy,
)
from eagle3_raw.printable import printable

MESSAGE_CHARS = 500
"""How much of a server's error message is kept."""

_RETRYABLE_4XX = frozenset({HTTPStatus.REQUEST_TIMEOUT, HTTPStatus.TOO_EARLY, HTTPStatus.TOO_MANY_REQUESTS})
"""Request Timeout, Too Early, Too Many Requests: the same request can succeed later."""


def http_error(
    status: int, payload: bytes, url: str, *, location: str | None = None, engine: str = "SGLang"
) -> Exception:
    """The exception for a non-200 answer of ``url`` (a full URL, credentials already removed) from
    a server of ``engine`` (its name in messages)."""
    message = error_message(payload)
    text = f"HTTP {status} from {url}: {message}"
    if HTTPStatus.MULTIPLE_CHOICES <= status < HTTPStatus.BAD_REQUEST:
        target = printable(location, limit=MESSAGE_CHARS) if location else "(no Location header)"
        return Redirected(
            f"HTTP {status} from {url} redirects to {target}; eagle3_raw does not follow redirects: "
            "put the URL it should talk to in server.endpoints"
        )
    if status in (HTTPStatus.UNAUTHORIZED, HTTPStatus.FORBIDDEN):
        return AuthError(
            f"{text} (server.api_key_env must name an environment variable holding the server's "
            "--api-key; if it does, the key it holds was refused)"
        )
    if status in (HTTPStatus.NOT_FOUND, HTTPStatus.METHOD_NOT_ALLOWED):
        return EndpointNotFound(_not_found(status, url, message, engine), url=url, status=status)
    if status in _RETRYABLE_4XX or status >= HTTPStatus.INTERNAL_SERVER_ERROR:
        return ServerBusy(text, url=url, status=status)
    # SGLang gives a request id still in flight no status of its own
    if status == HTTPStatus.BAD_REQUEST and "Duplicate request ID" in message:
        return ServerBusy(text, url=url, status=status)
    if HTTPStatus.BAD_REQUEST <= status < HTTPStatus.INTERNAL_SERVER_ERROR:
        return RequestRejected(text, status=status, url=url)
    return InvalidResponse(f"{text} (not a status an {engine} server answers)", url=url)


def _not_found(status: int, url: str, message: str, engine: str) -> str:
    route = url.rsplit("/", 1)[-1]
    what = "has no such route" if status == HTTPStatus.NOT_FOUND else "does not take this method on it"
    return (
        f"HTTP {status} from {url}: {message} (the server answered, but {what}: is it {engine}'s "
        f"API, and does /{route} exist in its version?)"
    )


def error_message(payload: bytes) -> str:
    """The message of any of SGLang's three error body shapes or vLLM's (or the raw text), escaped and cut."""
    import orjson

    try:
        body = orjson.loads(payload)
    except orjson.JSONDecodeError:
        text = payload.decode("utf-8", "replace").strip() or "(empty body)"
        return printable(text, limit=MESSAGE_CHARS)
    if isinstance(body, dict):
        error = body.get("error", body.get("message"))
        if isinstance(error, dict):
            error = error.get("message")
        if isinstance(error, str):
            return printable(error, limit=MESSAGE_CHARS)
    return printable(body, limit=MESSAGE_CHARS)
