"""The client of vLLM's token-exact routes: one completion, its checks, its chat path and parsers,
and the server's identity (``docs/vllm-protocol.md``, seen on the real vLLM).

- a generation is ``POST /v1/completions`` with the prompt as ids and ``return_token_ids``: the
  answer echoes the prompt ids and gives the output ids (:mod:`eagle3_raw.vllm.responses` checks
  both). This route needs no ``--enable-scale-out``, so any deployed vLLM serves it;
- ``abort`` is ``POST /inference/v1/abort_requests`` with the engine's id of the completion
  (``cmpl-<request_id>-0``); a server without ``--enable-scale-out`` refuses it, and the request
  still ends when its connection closes (vLLM cancels a request whose client went away);
- the chat path is ``/tokenize`` with ``messages``; the output parsers are
  ``/v1/chat/completions/derender`` (needs ``--enable-scale-out``);
- the identity is ``/version``, ``/v1/models`` and, when vLLM runs with ``VLLM_SERVER_DEV_MODE=1``,
  ``/server_info?config_format=json`` (the engine's config: tokenizer, parsers, ``max_num_seqs``,
  seed, speculative config) and ``/weight_info``. Without dev mode the parsers and the batch size
  are unsaid: a rollout then names its parsers in the recipe, and ``server.max_in_flight`` sizes
  the requests in flight.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp
import orjson

from eagle3_raw import limits
from eagle3_raw.errors import AuthError, EndpointNotFound, InvalidResponse, ServerMismatch
from eagle3_raw.redact import public_url, scrub
from eagle3_raw.serving import AssistantTurn, Generation, ServerIdentity, ToolCall, TurnToSplit
from eagle3_raw.transport import decode_object, get_json, post, read_prefix
from eagle3_raw.vllm.chatpath import wire_messages
from eagle3_raw.vllm.responses import check_completion
from eagle3_raw.vllm.sampling import vllm_params

ENGINE = "vLLM"


async def generate(
    session: aiohttp.ClientSession, url: str, *, rid: str, input_ids: Sequence[int],
    sampling_params: Mapping[str, Any], vocab_size: int, timeout: float,
    eos_ids: frozenset[int] = frozenset(),
) -> Generation:  # fmt: skip
    """Send one ``/v1/completions`` request (``sampling_params`` in the recipe's names) and return
    its checked result; errors as :meth:`eagle3_raw.serving.Engine.generate` says."""
    params = vllm_params(sampling_params)
    body = {"prompt": list(input_ids), "request_id": rid, "return_token_ids": True, "stream": False, **params}
    max_tokens = params.get("max_tokens")
    where = f"{public_url(url)}/v1/completions"
    cap = limits.response_cap(max_tokens, len(input_ids)) + 8 * len(input_ids)  # the prompt comes back
    payload = await post(session, f"{url}/v1/completions", orjson.dumps(body), timeout, cap=cap, shown=where,
                         engine=ENGINE)  # fmt: skip
    result = decode_object(payload, where)
    stops = None if params.get("ignore_eos") else eos_ids | set(params.get("stop_token_ids") or ())
    return check_completion(
        result, input_ids, vocab_size, public_url(url), max_tokens if isinstance(max_tokens, int) else None,
        eos_ids=eos_ids, stop_ids=frozenset(stops) if stops is not None else None,
    )  # fmt: skip


async def abort(session: aiohttp.ClientSession, url: str, rid: str, timeout: float = 2.0) -> None:
    """Ask the server to stop the completion ``rid`` (best effort: errors are ignored)."""
    body = orjson.dumps({"request_ids": [f"cmpl-{rid}-0"]})
    try:
        async with asyncio.timeout(timeout):
            async with session.post(f"{url}/inference/v1/abort_requests", data=body,
                                    allow_redirects=False) as response:  # fmt: skip
                await read_prefix(response, limits.ERROR_BODY_BYTES)
    except (TimeoutError, aiohttp.ClientError):
        pass


async def tokenize(session: aiohttp.ClientSession, url: str, text: str, timeout: float) -> list[int]:
    """The server's tokenization of ``text`` (``/tokenize``, no special tokens added)."""
    return await _tokens(session, url, {"prompt": text, "add_special_tokens": False}, timeout)


async def tokenize_chat(
    session: aiohttp.ClientSession, url: str, body: Mapping[str, Any], timeout: float
) -> list[int]:
    """The prompt ids vLLM's chat path makes of a chat request (``/tokenize`` with ``messages``,
    ``add_generation_prompt`` as its chat API sends it: true)."""
    sent = {"add_generation_prompt": True, **body, "messages": wire_messages(body.get("messages") or [])}
    return await _tokens(session, url, sent, timeout)


async def _tokens(
    session: aiohttp.ClientSession, url: str, body: Mapping[str, Any], timeout: float
) -> list[int]:
    data = orjson.dumps(dict(body))
    where = f"{public_url(url)}/tokenize"
    payload = await post(session, f"{url}/tokenize", data, timeout, cap=limits.response_cap(len(data), 0),
                         shown=where, engine=ENGINE)  # fmt: skip
    tokens = decode_object(payload, where).get("tokens")
    if not isinstance(tokens, list) or not all(type(t) is int for t in tokens):
        raise InvalidResponse(f"{where} returned no token list", url=where)
    return tokens


async def split_turn(
    session: aiohttp.ClientSession, url: str, turn: TurnToSplit, timeout: float
) -> AssistantTurn:
    """``turn`` as the server's own reasoning and tool-call parsers split it
    (``/v1/chat/completions/derender`` of its ids with the chat request it answers): the
    assistant message vLLM's chat API would return for it."""
    where = f"{public_url(url)}/v1/chat/completions/derender"
    choice = {"index": 0, "token_ids": list(turn.output_ids), "finish_reason": turn.finish_reason}
    chat = {**turn.chat_request, "messages": wire_messages(turn.chat_request.get("messages") or [])}
    body = {
        "generate_response": {"request_id": "eagle3-raw-derender", "choices": [choice]},
        "chat_request": chat,
    }
    data = orjson.dumps(body)
    cap = limits.response_cap(4 * len(data), 0)
    try:
        payload = await post(session, f"{url}/v1/chat/completions/derender", data, timeout, cap=cap,
                             shown=where, engine=ENGINE)  # fmt: skip
    except (AuthError, EndpointNotFound) as exc:
        if isinstance(exc, AuthError) and "HTTP 403" not in str(exc):
            raise  # the key was refused: not a matter of the route
        raise ServerMismatch(f"{where} is not served ({exc}): a rollout through vLLM needs its output "
                             "parsers, which it serves with --enable-scale-out") from exc  # fmt: skip
    return _assistant(decode_object(payload, where), where)


def _assistant(result: Mapping[str, Any], where: str) -> AssistantTurn:
    choices = result.get("choices")
    first = choices[0] if isinstance(choices, list) and choices else None
    message = first.get("message") if isinstance(first, dict) else None
    if not isinstance(message, dict):
        raise InvalidResponse(f"{where} returned no message", url=where)
    content, reasoning = message.get("content"), message.get("reasoning")
    if not isinstance(content, str | None) or not isinstance(reasoning, str | None):
        raise InvalidResponse(f"{where} returned a message whose content or reasoning is not text", url=where)
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise InvalidResponse(f"{where} returned tool_calls that are not a list", url=where)
    return AssistantTurn(content or "", reasoning or "", tuple(_tool_call(call, where) for call in calls))


def _tool_call(call: Any, where: str) -> ToolCall:
    function = call.get("function") if isinstance(call, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    arguments = function.get("arguments") if isinstance(function, dict) else None
    if not isinstance(name, str) or not isinstance(arguments, str):
        raise InvalidResponse(f"{where} returned a tool call without a name and arguments", url=where)
    return ToolCall(name, arguments)


# --- identity ---------------------------------------------------------------------------------


async def server_identity(session: aiohttp.ClientSession, url: str, timeout: float) -> ServerIdentity:
    """Read ``/version`` and ``/v1/models``, and in dev mode ``/server_info`` and ``/weight_info``."""
    try:
        version = await get_json(session, f"{url}/version", timeout, engine=ENGINE)
    except EndpointNotFound as exc:
        raise ServerMismatch(f"{public_url(url)} has no /version: is it a vLLM server?") from exc
    models = await get_json(session, f"{url}/v1/models", timeout, engine=ENGINE)
    config = await _optional(session, f"{url}/server_info?config_format=json", timeout)
    weights = await _optional(session, f"{url}/weight_info", timeout)
    return identity_from(url, version, models, config, weights)


async def _optional(session: aiohttp.ClientSession, url: str, timeout: float) -> Mapping[str, Any]:
    """A dev-mode route's JSON object ({} when the server does not serve it)."""
    try:
        value = await get_json(session, url, timeout, engine=ENGINE)
    except EndpointNotFound:
        return {}
    return value if isinstance(value, dict) else {}


def identity_from(
    url: str, version: Any, models: Any, config: Mapping[str, Any], weights: Mapping[str, Any]
) -> ServerIdentity:
    """The :class:`~eagle3_raw.serving.ServerIdentity` of what a vLLM server answered."""
    model = _first_model(models, url)
    vllm_config = _mapping(config.get("vllm_config"))
    facts = _config_facts(vllm_config)
    context = _int(model.get("max_model_len"))
    served, path = str(model.get("id") or ""), str(model.get("root") or model.get("id") or "")
    info = {"engine": "vllm", "version": _version(version, url), "model_path": path,
            "served_model_name": served, "context_length": context, "dev_mode": bool(vllm_config),
            **facts}  # fmt: skip
    weight = weights.get("weight_version")
    return ServerIdentity(
        url=url, model_path=path, served_model_name=served,
        weight_version=weight if isinstance(weight, str) and weight else "default",
        version=info["version"], context_length=context,
        max_req_input_len=context,  # a prompt of max_model_len ids is refused (docs/vllm-protocol.md)
        max_running_requests=_batch(facts), model_info=scrub(_model_info(path, served, facts)),
        server_info=scrub(info), drafter=_drafter(vllm_config.get("speculative_config")), engine="vllm",
    )  # fmt: skip


def _model_info(path: str, served: str, facts: Mapping[str, Any]) -> dict[str, Any]:
    """``/model_info``'s facts in SGLang's names (the tokenizer: the config's, else the model's)."""
    return {
        "model_path": path,
        "tokenizer_path": facts.get("tokenizer_path") or path,
        "served_model_name": served,
    }


def _first_model(models: Any, url: str) -> Mapping[str, Any]:
    data = models.get("data") if isinstance(models, dict) else None
    if not isinstance(data, list) or not data or not isinstance(data[0], dict):
        raise ServerMismatch(f"{public_url(url)}/v1/models lists no model: is it a vLLM server?")
    if data[0].get("owned_by") != "vllm":
        raise ServerMismatch(f"{public_url(url)}/v1/models lists a model not owned by vllm: is it vLLM?")
    return data[0]


def _version(version: Any, url: str) -> str:
    value = version.get("version") if isinstance(version, dict) else None
    if not isinstance(value, str) or not value:
        raise ServerMismatch(f"{public_url(url)}/version names no version: is it a vLLM server?")
    return value


_MODEL_FACTS = {
    "tokenizer_path": "tokenizer", "revision": "revision", "tokenizer_revision": "tokenizer_revision",
    "tokenizer_mode": "tokenizer_mode", "trust_remote_code": "trust_remote_code", "dtype": "dtype",
    "seed": "seed", "skip_tokenizer_init": "skip_tokenizer_init", "quantization": "quantization",
    "generation_config": "generation_config", "override_generation_config": "override_generation_config",
}  # fmt: skip
"""The manifest's names (SGLang's, where they mean the same) -> ``model_config``'s."""


def _config_facts(vllm_config: Mapping[str, Any]) -> dict[str, Any]:
    """What the dev-mode config says that decides or describes the rows ({} without it)."""
    if not vllm_config:
        return {}
    model = _mapping(vllm_config.get("model_config"))
    parallel = _mapping(vllm_config.get("parallel_config"))
    facts = {ours: model.get(theirs) for ours, theirs in _MODEL_FACTS.items()}
    return {
        **facts,
        "tp_size": parallel.get("tensor_parallel_size"), "dp_size": parallel.get("data_parallel_size"),
        "max_num_seqs": _mapping(vllm_config.get("scheduler_config")).get("max_num_seqs"),
        "reasoning_parser": _mapping(vllm_config.get("structured_outputs_config")).get("reasoning_parser")
        or None,
        "speculative_config": vllm_config.get("speculative_config"),
    }  # fmt: skip


def _batch(facts: Mapping[str, Any]) -> int | None:
    """The sequences the server runs at once: ``max_num_seqs`` per data-parallel rank."""
    seqs, ranks = _int(facts.get("max_num_seqs")), _int(facts.get("dp_size")) or 1
    return None if seqs is None else seqs * ranks


def _drafter(speculative: Any) -> dict[str, Any]:
    """The drafter of a speculating vLLM (its ``speculative_config``): method, draft model and
    tokens per step, in the names SGLang reports (empty without one)."""
    if not isinstance(speculative, dict) or not speculative:
        return {}
    return {
        "speculative_algorithm": speculative.get("method"),
        "speculative_draft_model_path": speculative.get("model"),
        "speculative_num_draft_tokens": speculative.get("num_speculative_tokens"),
    }


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
