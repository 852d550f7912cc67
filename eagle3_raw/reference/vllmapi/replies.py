"""The bodies vLLM 0.33 answers a finished generation with: ``CompletionResponse``
(``/v1/completions``; the ids only with ``return_token_ids``) and ``GenerateTokensResponse``
(``/inference/v1/generate``; the prompt never echoed unless ``return_token_ids``), keys in vLLM's order.
"""

from __future__ import annotations

import hashlib
from typing import Any

from eagle3_raw.reference.server.state import ServerState
from eagle3_raw.reference.vllmapi.plan import Generation


def system_fingerprint(state: ServerState) -> str:
    """``build_system_fingerprint`` in its ``full`` mode: the version, the parallel sizes above 1,
    then 8 hex digits of a hash of the configuration (here: of what the server reports of it)."""
    c = state.config
    assert c.vllm is not None
    parts = [f"vllm-{c.vllm.version}"]
    parts += [f"tp{c.tp_size}"] if c.tp_size > 1 else []
    parts += [f"dp{c.dp_size}"] if c.dp_size > 1 else []
    reported = repr((state.served_model_name, state.model.context_len, c.tp_size, c.dp_size, c.vllm))
    return "-".join([*parts, hashlib.sha256(reported.encode()).hexdigest()[:8]])


def usage(gen: Generation) -> dict[str, Any]:
    prompt, completion = len(gen.prompt), len(gen.output)
    return {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion,
            "prompt_tokens_details": None, "completion_tokens_details": None}  # fmt: skip


def completion_reply(state: ServerState, gen: Generation) -> dict[str, Any]:
    text = state.model.decode(gen.output, gen.sampling.skip_special_tokens) if state.encode else ""
    ids = gen.return_token_ids
    choice = {
        "index": 0, "text": text, "logprobs": None, "finish_reason": gen.finish,
        "stop_reason": gen.stop_reason, "token_ids": gen.output if ids else None,
        "prompt_logprobs": None, "prompt_token_ids": gen.prompt if ids else None, "routed_experts": None,
    }  # fmt: skip
    return {
        "id": gen.engine_id.removesuffix("-0"), "object": "text_completion", "created": gen.created,
        "model": state.served_model_name, "choices": [choice], "service_tier": None,
        "system_fingerprint": system_fingerprint(state), "usage": usage(gen), "kv_transfer_params": None,
        "ec_transfer_params": None, "metrics": None,
    }  # fmt: skip


def generate_reply(state: ServerState, gen: Generation) -> dict[str, Any]:
    spans = [{"version": state.model.weight_version, "start": 0, "end": len(gen.output)}]
    choice = {
        "index": 0, "finish_reason": gen.finish, "stop_reason": gen.stop_reason,
        "token_ids": gen.output, "routed_experts": None, "sampling_mask": None,
        "weight_versions": spans, "logprobs": None,
    }  # fmt: skip
    return {
        "request_id": gen.engine_id, "model": state.served_model_name, "created": gen.created,
        "usage": usage(gen), "prompt_logprobs": None, "prompt_token_id_logprobs": None,
        "prompt_token_ids": gen.prompt if gen.return_token_ids else None, "mm_placeholders": None,
        "metrics": None, "kv_transfer_params": None, "ec_transfer_params": None,
        "output_mode": "tokens", "choices": [choice],
    }  # fmt: skip
