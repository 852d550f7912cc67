"""The two generation routes' bodies, read as vLLM 0.33 reads them, into a :class:`Generation`:
``/v1/completions`` (``CompletionRequest``: ``prompt`` ids, sampling keys at the top level,
``max_tokens`` 16 by default) and ``/inference/v1/generate`` (``GenerateRequest``: ``token_ids`` and a
``sampling_params`` object, ``max_tokens`` the rest of the context by default).

The refusals carry vLLM's messages: a prompt that passes the context, a ``max_tokens`` cut to 0,
ids out of the vocabulary, the wrong ``model`` (404). Unknown keys are ignored, as vLLM does.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from eagle3_raw.reference.server.state import ServerState
from eagle3_raw.reference.vllmapi.errors import VLLMError, invalid_body, missing, model_not_found, validation
from eagle3_raw.reference.vllmapi.plan import Generation
from eagle3_raw.reference.vllmapi.sampling import check_max_tokens, fit_max_tokens, parse_sampling

COMPLETIONS, GENERATE = "/v1/completions", "/inference/v1/generate"
_DEFAULT_COMPLETION_TOKENS = 16  # CompletionRequest.max_tokens


def completion_request(state: ServerState, body: Any, header_id: str | None) -> Generation:
    """A ``/v1/completions`` body (VLLMError for what vLLM refuses)."""
    body = _object(body)
    check_model(state, body.get("model"))
    if body.get("stream"):
        raise VLLMError(
            "the reference server's vLLM mode does not stream; send stream: false", param="stream"
        )
    prompt = _completion_prompt(state, body.get("prompt"))
    sampling = parse_sampling(body, _DEFAULT_COMPLETION_TOKENS)
    limit = state.model.context_len
    if len(prompt) > limit:
        raise _too_long(len(prompt), limit)
    max_tokens = fit_max_tokens(sampling.max_tokens, len(prompt), limit)
    check_max_tokens(max_tokens)
    _check_vocabulary(state, prompt)
    rid = _request_id(body.get("request_id"), header_id)
    given = {key: value for key, value in body.items() if key != "prompt"}
    return Generation(
        COMPLETIONS, f"cmpl-{rid}-0", prompt, sampling, given, max_tokens, _flag(body, "return_token_ids")
    )


def generate_request(state: ServerState, body: Any, header_id: str | None) -> Generation:
    """An ``/inference/v1/generate`` body (VLLMError for what vLLM refuses)."""
    body = _object(body)
    check_model(state, body.get("model"))
    if body.get("stream"):
        raise VLLMError(
            "the reference server's vLLM mode does not stream; send stream: false", param="stream"
        )
    ids = body.get("token_ids")
    if ids is None:
        raise missing("token_ids", body)
    if not isinstance(ids, list) or not ids or not all(type(t) is int for t in ids):
        raise invalid_body("token_ids", "Input should be a non-empty list of integers", ids)
    if any(t < 0 for t in ids):
        raise invalid_body("token_ids", "Value error, token_ids must not contain negative values", ids)
    given = body.get("sampling_params")
    if given is None:
        raise missing("sampling_params", body)
    if not isinstance(given, Mapping):
        raise invalid_body("sampling_params", "Input should be a valid dictionary", given, "dict_type")
    sampling = parse_sampling(given, None)
    limit = state.model.context_len
    _check_decoder_prompt(len(ids), limit)
    _check_vocabulary(state, ids)
    max_tokens = fit_max_tokens(sampling.max_tokens, len(ids), limit)
    rid = _request_id(body.get("request_id"), header_id)
    return Generation(
        GENERATE, f"generate-tokens-{rid}", list(ids), sampling, given, max_tokens,
        _flag(body, "return_token_ids"),
    )  # fmt: skip


def check_model(state: ServerState, name: Any) -> None:
    """A ``model`` other than the served name is vLLM's 404 (none given: the served one)."""
    if name is not None and name != "" and name != state.served_model_name:
        raise model_not_found(str(name))


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise invalid_body("body", "Input should be a valid dictionary or object to extract fields from")
    return body


def _completion_prompt(state: ServerState, prompt: Any) -> list[int]:
    """``prompt``: a list of ids, a list of one such list, or a text (encoded as vLLM does, with specials)."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list):
        prompt = prompt[0]
    if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
        return list(prompt)
    if isinstance(prompt, str) and prompt and state.encode is not None:
        return state.model.encode(prompt, True)
    if isinstance(prompt, list) and prompt and all(isinstance(p, list | str) for p in prompt):
        raise VLLMError("the reference server's vLLM mode takes one prompt per request", param="prompt")
    raise invalid_body("prompt", "Input should be a non-empty list of token ids or a string")


def _too_long(count: int, limit: int) -> VLLMError:
    """``TokenizeParams._token_len_check``."""
    qualifier = "at least " if count == limit + 1 else ""
    return validation(
        f"This model's maximum context length is {limit} tokens. However, your prompt contains "
        f"{qualifier}{count} input tokens, which exceeds this limit even without any output tokens. "
        "Please reduce the length of the input prompt.",
        "input_tokens",
        count,
    )


def _check_decoder_prompt(count: int, limit: int) -> None:
    """``InputProcessor._validate_model_input`` for a decoder prompt."""
    if count > limit:
        raise VLLMError(
            f"The decoder prompt (length {count}) is longer than the maximum model length of {limit}. "
            "Make sure that `max_model_len` is no smaller than the number of text tokens."
        )
    if count == limit:
        raise VLLMError(
            f"The decoder prompt (length {count}) plus the number of requested output tokens (at least 1) "
            f"is longer than the maximum model length of {limit}. Make sure that `max_model_len` is no "
            "smaller than the number of text tokens (prompt + requested output tokens)."
        )


def _check_vocabulary(state: ServerState, ids: list[int]) -> None:
    """``BaseRenderer``'s vocabulary check (the real 0.32 names no ``param``)."""
    low, high = min(ids), max(ids)
    if low < 0:
        raise VLLMError(f"Token id {low} is out of vocabulary")
    if high >= state.model.vocab_size:
        raise VLLMError(f"Token id {high} is out of vocabulary")


def _request_id(given: Any, header_id: str | None) -> str:
    """``_base_request_id``: the ``X-Request-Id`` header, else the body's ``request_id``, else random."""
    if header_id:
        return header_id
    if isinstance(given, str) and given:
        return given
    return uuid.uuid4().hex[:16]  # random_uuid(): 16 hex digits


def _flag(body: Mapping[str, Any], key: str) -> bool:
    value = body.get(key)
    if value is not None and not isinstance(value, bool):
        raise invalid_body(key, "Input should be a valid boolean")
    return bool(value)
