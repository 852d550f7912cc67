"""How ``/generate`` refuses: the exceptions that pick a refusal's shape, and the bodies SGLang sends.

SGLang answers an error in one of three JSON shapes (``shared/sglang-protocol.md`` §5), and which
one depends on where the request failed, so each stage raises the exception that stands for its
shape:

- :class:`GateError` (FastAPI/pydantic parsing, the JSON contract): HTTP 400 with the body it
  carries, ``{"object": "error", ...}`` or ``{"error": "<text>"}``;
- :class:`RequestError` (SGLang's ``ValueError``): 400 ``{"error": {"message": ...}}``, or on a
  stream one SSE error event;
- :class:`InternalServerError` (an exception SGLang does not catch): a plain-text 500.
"""

from __future__ import annotations

from typing import Any


class GateError(Exception):
    """A refusal before normalization (pydantic or contract gate): always a plain HTTP 400."""

    def __init__(self, body: dict[str, Any]) -> None:
        super().__init__(str(body))
        self.body = body


class RequestError(ValueError):
    """SGLang's ``ValueError`` path: 400 ``{"error": {"message": ...}}`` (or an SSE error event)."""


class InternalServerError(Exception):
    """Where SGLang raises an uncaught exception: HTTP 500, plain text ``Internal Server Error``."""


def error_object(message: str, err_type: str, code: int) -> dict[str, Any]:
    """The OpenAI-style ``{"object": "error", ...}`` body (FastAPI refusals, ``HTTPException``)."""
    return {"object": "error", "message": message, "type": err_type, "param": None, "code": code}


def value_error_body(message: str) -> dict[str, Any]:
    """Body of a ``ValueError`` refusal (normalization, validation, scheduler 400 aborts)."""
    return {"error": {"message": message}}


def http_exception_body(status: int, message: str) -> dict[str, Any]:
    """Body of an ``HTTPException`` (e.g. the 503 of a full queue)."""
    return error_object(message, str(status), status)


def stream_error_event(message: str) -> dict[str, Any]:
    """The one SSE event a stream carries when validation fails after the stream started."""
    return {"error": {"message": message, "type": "invalid_request_error", "code": 400, "retryable": False}}


def validation_error(kind: str, loc: tuple[Any, ...], msg: str, value: Any) -> GateError:
    """FastAPI's 400 for a body its pydantic model refuses (``{"object": "error", ...}``)."""
    error = {"type": kind, "loc": ("body", *loc), "msg": msg, "input": value}
    return GateError(error_object(f"1 validation error:\n  {error!r}\n [{error!r}]", "Bad Request", 400))
