"""The client of SGLang's native ``/generate``: one request, its checks, and the server's identity.

Every response is checked before it can become a row (``shared/sglang-protocol.md`` §3, §5, §10):
HTTP 200 with ``finish_reason.type == "abort"`` is a failure; ``len(output_ids)`` must equal
``completion_tokens``; ``prompt_tokens`` must equal the ids sent (a server with
``--allow-auto-truncate`` would silently cut the prompt); ids must be inside the vocabulary; the
prompt must not be echoed back. Errors are raised as the classes of :mod:`eagle3_raw.errors`, so
the caller knows whether to retry, record, or stop.
"""

from __future__ import annotations

import asyncio
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy
import orjson

from eagle3_raw.errors import (
    ConnectError,
    FatalError,
    GenerationAborted,
    InvalidResponse,
    RequestRejected,
    RequestTimeout,
    ServerBusy,
    ServerMismatch,
    ServerUnreachable,
)
from eagle3_raw.redact import scrub

SERVER_INFO_KEYS = (
    "version", "model_path", "tokenizer_path", "served_model_name", "context_length", "dtype",
    "quantization", "tp_size", "dp_size", "skip_tokenizer_init", "enable_deterministic_inference",
    "max_running_requests", "max_total_num_tokens", "max_req_input_len", "preferred_sampling_params",
    "allow_auto_truncate", "revision", "chunked_prefill_size", "launch_command", "speculative_algorithm",
)  # fmt: skip
"""``/server_info`` keys worth keeping in the manifest and on the card (server version and flags)."""


class AuthError(FatalError):
    """The server refused our credentials (HTTP 401/403)."""


@dataclass(frozen=True)
class Generation:
    """A checked completion: the ids exactly as returned, and the facts worth keeping."""

    output_ids: list[int]
    finish_reason: str
    meta: Mapping[str, Any]


@dataclass(frozen=True)
class ServerIdentity:
    """What a server says about itself at the start of a run."""

    url: str
    model_path: str
    served_model_name: str
    weight_version: str
    version: str
    context_length: int | None
    max_req_input_len: int | None
    max_running_requests: int | None
    model_info: Mapping[str, Any] = field(default_factory=dict)
    server_info: Mapping[str, Any] = field(default_factory=dict)
    reserved_tokens: int = 0
    """Output slots reserved per request for EAGLE-style speculative decoding; SGLang counts them
    with the prompt against the context length (``compute_num_reserved_tokens``)."""
    preferred_sampling_params: Mapping[str, Any] = field(default_factory=dict)
    """``--preferred-sampling-params``: SGLang applies them to every request that leaves them out."""

    def comparable(self) -> dict[str, Any]:
        """The facts that must not change between a run and its resume (or across endpoints)."""
        return {
            "model_path": self.model_path,
            "served_model_name": self.served_model_name,
            "weight_version": self.weight_version,
            "version": self.version,
        }

    @property
    def token_budget(self) -> int | None:
        """Prompt plus ``max_new_tokens`` the server accepts: the context length less the reserved
        slots (SGLang refuses more with a 400), if known."""
        return None if self.context_length is None else self.context_length - self.reserved_tokens

    @property
    def input_limit(self) -> int | None:
        """The longest prompt the server accepts (``max_req_input_len - 1``; §5, and below the
        token budget), if known."""
        budget = self.token_budget
        if self.max_req_input_len is not None:
            return self.max_req_input_len - 1 if budget is None else min(self.max_req_input_len, budget) - 1
        return None if budget is None else budget - 7


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


# --- /generate -------------------------------------------------------------------------------


async def generate(
    session: aiohttp.ClientSession,
    url: str,
    *,
    rid: str,
    input_ids: Sequence[int],
    sampling_params: Mapping[str, Any],
    vocab_size: int,
    timeout: float,
) -> Generation:
    """Send one ``/generate`` request and return its checked result.

    Raises a :class:`~eagle3_raw.errors.RetryableError` (connection, timeout, 5xx/429, abort, bad
    response), :class:`~eagle3_raw.errors.RequestRejected` (a 400: this row will not work), or a
    fatal error (credentials, no such endpoint).
    """
    body = orjson.dumps({"rid": rid, "input_ids": input_ids, "sampling_params": sampling_params})
    status, payload = await _post(session, f"{url}/generate", body, timeout)
    if status != 200:
        raise _http_error(status, payload, url)
    return check_response(_decode_object(payload, url), input_ids, vocab_size, url)


async def _post(session: aiohttp.ClientSession, url: str, body: bytes, timeout: float) -> tuple[int, bytes]:
    try:
        async with asyncio.timeout(timeout):
            async with session.post(url, data=body) as response:
                return response.status, await response.read()
    except TimeoutError as exc:
        raise RequestTimeout(f"no response from {url} within {timeout:g} s", url=url) from exc
    except aiohttp.ClientError as exc:  # refused, reset, malformed HTTP: all worth another try
        raise ConnectError(f"connection to {url} failed: {_reason(exc, timeout)}", url=url) from exc


def _reason(exc: BaseException, timeout: float) -> str:
    """What went wrong, never empty (``str(TimeoutError())`` and some aiohttp errors are ``""``).

    A timeout with a message of its own (aiohttp's connect timeout) keeps it: ``timeout`` is not its limit.
    """
    if str(exc):
        return str(exc)
    return f"no answer within {timeout:g} s" if isinstance(exc, TimeoutError) else type(exc).__name__


def _http_error(status: int, payload: bytes, url: str) -> Exception:
    message = error_message(payload)
    text = f"HTTP {status} from {url}: {message}"
    if status in (401, 403):
        return AuthError(
            f"{text} (server.api_key_env must name an environment variable holding the server's "
            "--api-key; if it does, the key it holds was refused)"
        )
    if status == 404:
        return ServerUnreachable(f"{text} (is this an SGLang server? /generate was not found)")
    if status == 429 or status >= 500:
        return ServerBusy(text, url=url, status=status)
    if "Duplicate request ID" in message:
        return ServerBusy(text, url=url, status=status)
    return RequestRejected(text, status=status, url=url)


def error_message(payload: bytes) -> str:
    """The message of any of SGLang's three error body shapes (or the raw text)."""
    try:
        body = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return payload.decode("utf-8", "replace").strip()[:500] or "(empty body)"
    if isinstance(body, dict):
        error = body.get("error", body.get("message"))
        if isinstance(error, dict):
            error = error.get("message")
        if isinstance(error, str):
            return error
    return str(body)[:500]


def _decode_object(payload: bytes, url: str) -> Mapping[str, Any]:
    try:
        result = orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        raise InvalidResponse(f"response from {url} is not JSON: {exc}", url=url) from exc
    if not isinstance(result, dict):
        raise InvalidResponse(f"response from {url} is not one JSON object", url=url)
    return result


def check_response(
    result: Mapping[str, Any], input_ids: Sequence[int], vocab_size: int, url: str
) -> Generation:
    """Check one response object against what was sent; see the module docstring."""
    meta = result.get("meta_info")
    output_ids = result.get("output_ids")
    if not isinstance(meta, dict) or not isinstance(output_ids, list):
        raise InvalidResponse(f"response from {url} lacks output_ids or meta_info", url=url)
    finish = _finish_reason(meta, url)
    _check_counts(meta, output_ids, len(input_ids), url)
    _check_ids(output_ids, vocab_size, url)
    if len(input_ids) > 1 and output_ids[: len(input_ids)] == list(input_ids):
        raise InvalidResponse(f"response from {url} echoes the prompt in output_ids", url=url)
    return Generation(output_ids, finish, _keep_meta(meta, url))


def _finish_reason(meta: Mapping[str, Any], url: str) -> str:
    finish = meta.get("finish_reason")
    kind = finish.get("type") if isinstance(finish, dict) else None
    if kind == "abort":
        message = finish.get("message", "") if isinstance(finish, dict) else ""
        raise GenerationAborted(f"generation aborted by {url}: {message}", url=url)
    if kind not in ("stop", "length"):
        raise InvalidResponse(f"unexpected finish_reason {finish!r} from {url}", url=url)
    return str(kind)


def _check_counts(meta: Mapping[str, Any], output_ids: list[Any], prompt_len: int, url: str) -> None:
    if meta.get("completion_tokens") != len(output_ids):
        raise InvalidResponse(
            f"{url}: completion_tokens={meta.get('completion_tokens')} but {len(output_ids)} output_ids",
            url=url,
        )
    prompt_tokens = meta.get("prompt_tokens")
    if prompt_tokens is not None and prompt_tokens != prompt_len:
        raise RequestRejected(
            f"{url} saw {prompt_tokens} prompt tokens, we sent {prompt_len} "
            "(is the server truncating prompts, e.g. --allow-auto-truncate?)",
            url=url,
        )


def _check_ids(output_ids: list[Any], vocab_size: int, url: str) -> None:
    try:
        ids = array("q", output_ids)  # in C: refuses floats, strings and nulls
    except (TypeError, OverflowError) as exc:
        raise InvalidResponse(f"{url} returned a token id that is not an int64 ({exc})", url=url) from exc
    values = numpy.frombuffer(ids, dtype=numpy.int64)  # min/max in C too, no Python int per id
    if len(values) and (values.min() < 0 or values.max() >= vocab_size):
        token = next(t for t in ids if not 0 <= t < vocab_size)
        raise InvalidResponse(
            f"{url} returned token id {token} outside the vocabulary (0..{vocab_size - 1})", url=url
        )


def _keep_meta(meta: Mapping[str, Any], url: str) -> dict[str, Any]:
    return {
        "prompt_tokens": meta.get("prompt_tokens"),
        "completion_tokens": meta.get("completion_tokens"),
        "cached_tokens": meta.get("cached_tokens"),
        "e2e_latency": meta.get("e2e_latency"),
        "weight_version": meta.get("weight_version"),
        "endpoint": url,
    }


# --- side endpoints --------------------------------------------------------------------------


async def get_json(session: aiohttp.ClientSession, url: str, timeout: float) -> Any:
    """GET a JSON document; connection problems and non-200s raise, naming the URL."""
    try:
        async with asyncio.timeout(timeout):
            async with session.get(url) as response:
                payload = await response.read()
    except (TimeoutError, aiohttp.ClientError) as exc:
        raise ServerUnreachable(f"cannot reach {url}: {_reason(exc, timeout)}") from exc
    if response.status != 200:
        raise _http_error(response.status, payload, url)
    try:
        return orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        raise ServerUnreachable(f"{url} did not answer JSON: is it an SGLang server?") from exc


async def health(session: aiohttp.ClientSession, url: str, timeout: float) -> bool:
    """True when ``/health`` answers 200 (SGLang runs a one-token generation for it)."""
    try:
        async with asyncio.timeout(timeout):
            async with session.get(f"{url}/health") as response:
                await response.read()
                return response.status == 200
    except (TimeoutError, aiohttp.ClientError):
        return False


async def server_identity(session: aiohttp.ClientSession, url: str, timeout: float) -> ServerIdentity:
    """Read ``/model_info``, ``/server_info`` and ``/v1/models`` (older aliases as fallbacks)."""
    model_info = await _first_json(session, url, ("/model_info", "/get_model_info"), timeout)
    server_info = await _first_json(session, url, ("/server_info", "/get_server_info"), timeout)
    max_model_len = await _max_model_len(session, url, timeout)
    return identity_from(url, model_info, server_info, max_model_len)


def identity_from(
    url: str, model_info: Mapping[str, Any], server_info: Mapping[str, Any], max_model_len: int | None
) -> ServerIdentity:
    """The :class:`ServerIdentity` of what a server answered on its three info routes."""
    return ServerIdentity(
        url=url,
        model_path=str(model_info.get("model_path") or server_info.get("model_path") or ""),
        served_model_name=str(model_info.get("served_model_name") or ""),
        weight_version=str(model_info.get("weight_version") or "default"),
        version=str(server_info.get("version") or "unknown"),
        context_length=max_model_len or _int_or_none(server_info.get("context_length")),
        max_req_input_len=_scheduler_value(server_info, "max_req_input_len"),
        max_running_requests=_max_running_requests(server_info),
        model_info=scrub(dict(model_info)),
        server_info=scrub({k: server_info[k] for k in SERVER_INFO_KEYS if k in server_info}),
        reserved_tokens=_reserved_tokens(server_info),
        preferred_sampling_params=_preferred(model_info.get("preferred_sampling_params"), url),
    )


async def _first_json(
    session: aiohttp.ClientSession, url: str, paths: Sequence[str], timeout: float
) -> Mapping[str, Any]:
    last: Exception | None = None
    for path in paths:
        try:
            value = await get_json(session, f"{url}{path}", timeout)
        except ServerUnreachable as exc:
            last = exc
            if "HTTP 404" not in str(exc):
                raise
            continue
        return value if isinstance(value, dict) else {}
    raise ServerUnreachable(f"{url} answers none of {', '.join(paths)}: is it an SGLang server?") from last


async def _max_model_len(session: aiohttp.ClientSession, url: str, timeout: float) -> int | None:
    try:
        models = await get_json(session, f"{url}/v1/models", timeout)
        return _int_or_none(models["data"][0].get("max_model_len"))
    except (ServerUnreachable, KeyError, IndexError, TypeError, AttributeError):
        return None


def _states(server_info: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """``internal_states``: one mapping of resolved settings per DP rank (empty if absent)."""
    states = server_info.get("internal_states")
    return [s for s in states if isinstance(s, Mapping)] if isinstance(states, list) else []


def _scheduler_value(server_info: Mapping[str, Any], key: str) -> int | None:
    value = server_info.get(key)
    states = _states(server_info)
    if value is None and states:
        value = states[0].get(key)
    return _int_or_none(value)


_EAGLE_ALGORITHMS = frozenset({"EAGLE", "EAGLE3", "FROZEN_KV_MTP", "NEXTN"})


def _reserved_tokens(server_info: Mapping[str, Any]) -> int:
    """SGLang's ``compute_num_reserved_tokens``: for EAGLE-style speculative decoding,
    max(eagle_topk x num_steps, num_draft_tokens) output slots per request; else 0. Resolved values
    (``internal_states``) first: the top level has null for what was not passed."""

    state = next(iter(_states(server_info)), {})

    def resolved(key: str) -> Any:
        value = state.get(key)
        return server_info.get(key) if value is None else value

    algorithm = resolved("speculative_algorithm")
    if not isinstance(algorithm, str) or algorithm.upper() not in _EAGLE_ALGORITHMS:
        return 0
    topk, steps = (
        _int_or_none(resolved(k)) or 0 for k in ("speculative_eagle_topk", "speculative_num_steps")
    )
    drafts = [
        _int_or_none(resolved(k)) or 0
        for k in ("speculative_num_draft_tokens", "max_speculative_num_draft_tokens")
    ]
    return max(topk * steps, *drafts)


def _preferred(value: Any, url: str) -> dict[str, Any]:
    """``preferred_sampling_params`` as a mapping (SGLang reports the parsed JSON, or null)."""
    if isinstance(value, str) and value.strip():
        try:
            value = orjson.loads(value)
        except orjson.JSONDecodeError as exc:
            message = f"{url}/model_info: preferred_sampling_params is not JSON ({exc}); cannot tell "
            raise ServerMismatch(message + "which sampling params the server adds to requests") from exc
    return dict(value) if isinstance(value, Mapping) else {}


def _max_running_requests(server_info: Mapping[str, Any]) -> int | None:
    """The batch size the server really runs: the sum over DP ranks of the scheduler's
    ``effective_max_running_requests_per_dp`` (``internal_states``), else the configured value
    (null in ``/server_info`` unless passed on the command line)."""
    states = _states(server_info)
    if states:
        effective = [_int_or_none(s.get("effective_max_running_requests_per_dp")) for s in states]
        if all(e is not None and e > 0 for e in effective):
            return sum(e for e in effective if e is not None)
    return _scheduler_value(server_info, "max_running_requests")


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


async def tokenize(session: aiohttp.ClientSession, url: str, text: str, timeout: float) -> list[int]:
    """The server's own tokenization of ``text`` (``/tokenize``, no special tokens added)."""
    body = orjson.dumps({"prompt": text, "add_special_tokens": False})
    status, payload = await _post(session, f"{url}/tokenize", body, timeout)
    if status != 200:
        raise _http_error(status, payload, url)
    tokens = _decode_object(payload, f"{url}/tokenize").get("tokens")
    if not isinstance(tokens, list):
        raise InvalidResponse(f"{url}/tokenize returned no token list", url=url)
    return tokens


async def abort(session: aiohttp.ClientSession, url: str, rid: str, timeout: float = 2.0) -> None:
    """Ask the server to stop generating ``rid`` (best effort: errors are ignored)."""
    try:
        async with asyncio.timeout(timeout):
            body = orjson.dumps({"rid": rid, "abort_all": False})
            async with session.post(f"{url}/abort_request", data=body) as response:
                await response.read()
    except (TimeoutError, aiohttp.ClientError):
        pass
