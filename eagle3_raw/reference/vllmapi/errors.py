"""vLLM's error replies: ``ErrorResponse`` (``{"error": {"message", "type", "param", "code"}}``,
``entrypoints/serve/exception_handling/error_response.py``) and the refusals the reference raises
as :class:`VLLMError` with vLLM 0.33's own messages.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from eagle3_raw.reference.server.replies import json_response

_TYPES = {400: "BadRequestError", 403: "PermissionDeniedError", 404: "NotFoundError",
          500: "InternalServerError", 503: "ServiceUnavailableError"}  # fmt: skip


class VLLMError(Exception):
    """A refusal: the HTTP status, vLLM's message and the ``param`` it names."""

    def __init__(
        self, message: str, status: int = 400, param: str | None = None, kind: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.param = param
        self.kind = kind

    @property
    def body(self) -> dict[str, Any]:
        return error_body(str(self), self.status, self.param, self.kind)


def error_body(
    message: str, status: int = 400, param: str | None = None, kind: str | None = None
) -> dict[str, Any]:
    """``ErrorResponse`` as vLLM dumps it (``kind``: its ``type``, by default the status's error class)."""
    kind = kind or _TYPES.get(status, "BadRequestError")
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def error_reply(exc: VLLMError) -> web.Response:
    return json_response(exc.body, exc.status)


def validation(message: str, parameter: str | None = None, value: Any = None) -> VLLMError:
    """``VLLMValidationError``: its text gains ``(parameter=..., value=...)``, and ``param`` names it."""
    extras = [f"parameter={parameter}"] if parameter is not None else []
    extras += [f"value={value}"] if value is not None else []
    text = f"{message} ({', '.join(extras)})" if extras else message
    return VLLMError(text, 400, parameter)


def invalid_body(field: str, problem: str, given: Any = None, kind: str = "value_error") -> VLLMError:
    """What vLLM's handler of pydantic's ``RequestValidationError`` answers: 400, ``type`` ``Bad
    Request``, ``param`` the field's location, and the error (its ``input`` summarized as vLLM does:
    a container by its size) in the message."""
    error = {"type": kind, "loc": f"body.{field}", "msg": problem, "input": _summary(given)}
    return VLLMError(f"1 validation error:\n  {error}", 400, f"body.{field}", "Bad Request")


def missing(field: str, body: Any) -> VLLMError:
    """pydantic's ``missing`` error for a required ``field`` of ``body``."""
    return invalid_body(field, "Field required", body, "missing")


def _summary(value: Any) -> Any:
    """``_summarize_error_input``: containers by their size, long texts cut."""
    if isinstance(value, list | tuple | set | frozenset | dict):
        return f"<{type(value).__name__} of {len(value)} items>"
    text = value if isinstance(value, str) else str(value)
    return text[:200] + "...[truncated]" if len(text) > 200 else text


def model_not_found(name: str) -> VLLMError:
    """``OpenAIServingModels.check_model``'s 404."""
    return VLLMError(f"The model `{name}` does not exist.", 404, "model")


SCALE_OUT_DISABLED = VLLMError(
    "Scale-out endpoints are disabled. Restart vllm serve with --enable-scale-out to enable them.", 403
)
"""The 403 of ``/inference/v1/*`` and render/derender without ``--enable-scale-out``
(``entrypoints/scale_out/factories.py``)."""
