"""The client of SGLang's native ``/generate``: one request, its checks, and the server's identity.

Every response is checked before it can become a row (:mod:`eagle3_raw.sglang.responses`;
``shared/sglang-protocol.md`` §3, §5, §10, §14.4). Errors are raised as the classes of
:mod:`eagle3_raw.errors`, chosen by HTTP status (:mod:`eagle3_raw.statuses`), so the caller
knows whether to retry, record, or stop.

What a server sends is bounded and redirects are never followed (:mod:`eagle3_raw.transport`).
URLs in messages and in rows' ``meta.endpoint`` carry no credentials
(:func:`~eagle3_raw.redact.public_url`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp
import orjson

from eagle3_raw import limits
from eagle3_raw.errors import (
    AuthError,
    EndpointNotFound,
    InvalidResponse,
    Redirected,
    ServerMismatch,
    ServerUnreachable,
)
from eagle3_raw.redact import public_url, scrub
from eagle3_raw.serving import Generation, ServerIdentity, ToolCall
from eagle3_raw.sglang.model import DRAFTER_KEYS, DRAFTER_SETTING_KEYS
from eagle3_raw.sglang.responses import check_response
from eagle3_raw.statuses import error_message
from eagle3_raw.transport import decode_object, get_json, health, new_session, post, read_prefix

__all__ = [
    "SERVER_INFO_KEYS", "AuthError", "EndpointNotFound", "Generation", "Redirected", "ServerIdentity",
    "ToolCall", "abort", "check_response", "detokenize", "error_message", "generate", "get_json",
    "health", "new_session", "parse_function_call", "separate_reasoning", "server_identity", "tokenize",
    "tokenize_chat",
]  # fmt: skip

SERVER_INFO_KEYS = (
    "version", "model_path", "tokenizer_path", "served_model_name", "context_length", "dtype",
    "quantization", "tp_size", "dp_size", "skip_tokenizer_init", "enable_deterministic_inference",
    "max_running_requests", "max_total_num_tokens", "max_req_input_len", "preferred_sampling_params",
    "allow_auto_truncate", "revision", "chunked_prefill_size", "launch_command", "speculative_algorithm",
    "chat_template", "tokenizer_mode", "trust_remote_code", "reasoning_parser", "tool_call_parser",
    *DRAFTER_KEYS[1:], *DRAFTER_SETTING_KEYS,
)  # fmt: skip
"""``/server_info`` keys worth keeping in the manifest and on the card (server version and flags)."""

RENDERER_KEYS = ("tokenizer_path", "chat_template", "revision", "tokenizer_mode", "trust_remote_code")
"""``/server_info`` keys that decide how the server renders a chat request, beyond its model."""


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
    eos_ids: frozenset[int] = frozenset(),
) -> Generation:
    """Send one ``/generate`` request and return its checked result (``eos_ids``: the model's EOS
    ids; no answer may hold one before its last position unless ``ignore_eos`` is sent).

    Raises a :class:`~eagle3_raw.errors.RetryableError` (connection, timeout, 5xx/408/429, abort,
    bad or oversized response), :class:`~eagle3_raw.errors.RequestRejected` (a 4xx: this row will
    not work), or a fatal error (credentials, no such route, a redirect).
    """
    body = orjson.dumps({"rid": rid, "input_ids": input_ids, "sampling_params": sampling_params})
    max_new_tokens = sampling_params.get("max_new_tokens")
    cap = limits.response_cap(max_new_tokens, len(input_ids))
    where = f"{public_url(url)}/generate"
    payload = await post(session, f"{url}/generate", body, timeout, cap=cap, shown=where)
    limit = max_new_tokens if isinstance(max_new_tokens, int) else None
    result = decode_object(payload, where)
    stops = _stop_ids(sampling_params, eos_ids)
    shown_url = public_url(url)
    return check_response(result, input_ids, vocab_size, shown_url, limit, payload=payload, stop_ids=stops)


def _stop_ids(sampling_params: Mapping[str, Any], eos_ids: frozenset[int]) -> frozenset[int] | None:
    """The ids SGLang stops at for these parameters: none with ``ignore_eos`` (it disables
    ``stop_token_ids`` too), else the EOS ids and the ``stop_token_ids`` sent."""
    if sampling_params.get("ignore_eos"):
        return None
    sent = sampling_params.get("stop_token_ids") or []
    return eos_ids | {i for i in sent if isinstance(i, int) and not isinstance(i, bool)}


# --- side endpoints --------------------------------------------------------------------------


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
        drafter=_drafter(server_info),
    )


def _drafter(server_info: Mapping[str, Any]) -> dict[str, Any]:
    """The drafter a speculating server runs (:data:`~eagle3_raw.sglang.model.DRAFTER_KEYS` as
    ``/server_info`` reports them, and for NGRAM the
    :data:`~eagle3_raw.sglang.model.DRAFTER_SETTING_KEYS` it reports set); empty when it does not
    speculate."""
    if not server_info.get("speculative_algorithm"):
        return {}
    ngram = server_info.get("speculative_algorithm") == "NGRAM"
    settings = {
        key: server_info[key] for key in DRAFTER_SETTING_KEYS if ngram and server_info.get(key) is not None
    }
    return {**{key: server_info.get(key) for key in DRAFTER_KEYS}, **settings}


async def _first_json(
    session: aiohttp.ClientSession, url: str, paths: Sequence[str], timeout: float
) -> Mapping[str, Any]:
    """The first of ``paths`` the server has (a 404 or 405 tries the next; anything else raises)."""
    last: EndpointNotFound | None = None
    for path in paths:
        try:
            value = await get_json(session, f"{url}{path}", timeout)
        except EndpointNotFound as exc:
            last = exc
            continue
        return value if isinstance(value, dict) else {}
    raise ServerMismatch(
        f"{public_url(url)} answers none of {', '.join(paths)}: is it an SGLang server?"
    ) from last


async def _max_model_len(session: aiohttp.ClientSession, url: str, timeout: float) -> int | None:
    try:
        models = await get_json(session, f"{url}/v1/models", timeout)
        return _int_or_none(models["data"][0].get("max_model_len"))
    except (ServerUnreachable, EndpointNotFound, KeyError, IndexError, TypeError, AttributeError):
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
    """The server's own tokenization of ``text`` (``/tokenize``, no special tokens added).

    :class:`~eagle3_raw.statuses.EndpointNotFound` when the server has no ``/tokenize``.
    """
    body = orjson.dumps({"prompt": text, "add_special_tokens": False})
    where = f"{public_url(url)}/tokenize"
    cap = limits.response_cap(len(text), 0)
    payload = await post(session, f"{url}/tokenize", body, timeout, cap=cap, shown=where)
    tokens = decode_object(payload, where).get("tokens")
    if not isinstance(tokens, list):
        raise InvalidResponse(f"{where} returned no token list", url=where)
    return tokens


async def tokenize_chat(
    session: aiohttp.ClientSession, url: str, body: Mapping[str, Any], timeout: float
) -> list[int]:
    """The prompt ids the server's chat path makes of a chat request (``/tokenize`` with
    ``messages``, SGLang 0.5.23 ``sglang-protocol.md`` §14.1): what its chat API would feed the model.

    :class:`~eagle3_raw.errors.RequestRejected` (with the server's message) when the chat path
    refuses this request; :class:`~eagle3_raw.statuses.EndpointNotFound` without ``/tokenize``.
    """
    data = orjson.dumps(dict(body))
    where = f"{public_url(url)}/tokenize"
    cap = limits.response_cap(len(data), 0)
    payload = await post(session, f"{url}/tokenize", data, timeout, cap=cap, shown=where)
    tokens = decode_object(payload, where).get("tokens")
    if not isinstance(tokens, list) or not all(type(t) is int for t in tokens):
        raise InvalidResponse(f"{where} returned no token list for a chat request", url=where)
    return tokens


async def abort(session: aiohttp.ClientSession, url: str, rid: str, timeout: float = 2.0) -> None:
    """Ask the server to stop generating ``rid`` (best effort: errors are ignored)."""
    try:
        async with asyncio.timeout(timeout):
            body = orjson.dumps({"rid": rid, "abort_all": False})
            async with session.post(f"{url}/abort_request", data=body, allow_redirects=False) as response:
                await read_prefix(response, limits.ERROR_BODY_BYTES)
    except (TimeoutError, aiohttp.ClientError):
        pass


# --- the chat API's output parsers (sglang-protocol.md §14.2) ---------------------------------


async def separate_reasoning(
    session: aiohttp.ClientSession, url: str, text: str, parser: str, timeout: float
) -> tuple[str, str]:
    """``(reasoning_text, text)`` of a generated ``text`` as the server's reasoning ``parser``
    splits it (``/separate_reasoning``), exactly as its chat API does for a completion."""
    result = await _parse_post(session, url, "separate_reasoning", {"text": text, "reasoning_parser": parser},
                               len(text), timeout)  # fmt: skip
    reasoning, rest = result.get("reasoning_text"), result.get("text")
    if not isinstance(reasoning, str | None) or not isinstance(rest, str):
        raise InvalidResponse(f"{public_url(url)}/separate_reasoning returned no texts", url=public_url(url))
    return reasoning or "", rest


async def parse_function_call(
    session: aiohttp.ClientSession, url: str, text: str, tools: Sequence[Mapping[str, Any]], parser: str,
    timeout: float,
) -> tuple[str, list[ToolCall]]:  # fmt: skip
    """``(normal_text, calls)`` of ``text`` as the server's tool-call ``parser`` reads it against
    ``tools`` (``/parse_function_call``)."""
    body = {"text": text, "tools": [dict(t) for t in tools], "tool_call_parser": parser}
    result = await _parse_post(session, url, "parse_function_call", body, len(text), timeout)
    normal, calls = result.get("normal_text"), result.get("calls")
    where = f"{public_url(url)}/parse_function_call"
    if not isinstance(normal, str) or not isinstance(calls, list):
        raise InvalidResponse(f"{where} returned no normal_text and calls", url=where)
    return normal, [_tool_call(call, where) for call in calls]


def _tool_call(call: Any, where: str) -> ToolCall:
    name = call.get("name") if isinstance(call, dict) else None
    parameters = call.get("parameters") if isinstance(call, dict) else None
    if not isinstance(name, str) or not isinstance(parameters, str):
        raise InvalidResponse(f"{where} returned a call without a name and parameters", url=where)
    return ToolCall(name, parameters)


async def _parse_post(
    session: aiohttp.ClientSession, url: str, route: str, body: Mapping[str, Any], size: int, timeout: float
) -> Mapping[str, Any]:
    where = f"{public_url(url)}/{route}"
    cap = limits.response_cap(size, 0)
    payload = await post(session, f"{url}/{route}", orjson.dumps(dict(body)), timeout, cap=cap, shown=where)
    return decode_object(payload, where)


async def detokenize(
    session: aiohttp.ClientSession, url: str, ids: Sequence[int], skip_special_tokens: bool, timeout: float
) -> str:
    """The server's decode of ``ids`` (``/detokenize``): the ``text`` its ``/generate`` returns for
    them, for a generation journaled without it."""
    body = {"tokens": list(ids), "skip_special_tokens": skip_special_tokens}
    result = await _parse_post(session, url, "detokenize", body, 4 * len(ids), timeout)
    text = result.get("text")
    if not isinstance(text, str):
        raise InvalidResponse(f"{public_url(url)}/detokenize returned no text", url=public_url(url))
    return text
