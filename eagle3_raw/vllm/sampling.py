"""vLLM's sampling parameters as eagle3_raw sends them to ``/v1/completions``.

A recipe's ``sampling`` is written in SGLang's names (the recipe's one language,
:mod:`eagle3_raw.sglang.sampling`); :func:`vllm_params` says the same request in vLLM 0.32/0.33's
names (``vllm/sampling_params.py`` ``SamplingParams``, ``CompletionRequest``), with every default
written out. vLLM fills a key a request leaves out from the model's ``generation_config.json``
(``--generation-config auto``, its default), so sending each one is what keeps the rows the
recipe's. vLLM ignores a key it does not know (``docs/vllm-protocol.md``): the keys sent are
checked here against :data:`COMPLETION_KEYS` (pinned to the wheel's ``CompletionRequest`` by a
test), and a recipe key vLLM has no equivalent for is refused (:func:`unsupported_keys`), never
dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

RENAMED: Mapping[str, str] = {
    "max_new_tokens": "max_tokens",
    "min_new_tokens": "min_tokens",
    "sampling_seed": "seed",
    "no_stop_trim": "include_stop_str_in_output",
}
"""SGLang's name -> vLLM's, for the keys that mean the same and are named otherwise."""

SAME: frozenset[str] = frozenset({
    "temperature", "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty",
    "repetition_penalty", "stop", "stop_token_ids", "ignore_eos", "skip_special_tokens",
    "spaces_between_special_tokens", "logit_bias",
})  # fmt: skip
"""Keys both engines spell alike."""

STRUCTURED: Mapping[str, str] = {
    "json_schema": "json",
    "regex": "regex",
    "ebnf": "grammar",
    "structural_tag": "structural_tag",
}
"""SGLang's constrained-decoding keys -> the field of vLLM's ``structured_outputs`` they set."""

UNSUPPORTED: Mapping[str, str] = {
    "stop_regex": "vLLM has no stop on a regular expression",
    "custom_params": "vLLM has no custom logit processor parameters per request",
    "beam_width": "vLLM's completions route does not beam-search with this key",
    "watermark": "vLLM's watermarking takes other settings",
}
"""Recipe keys vLLM has no equivalent for, with why."""

DEFAULTS: Mapping[str, Any] = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "min_tokens": 0,
}
"""vLLM's ``SamplingParams`` defaults for the keys sent on every request (``top_k`` 0: all)."""

COMPLETION_KEYS: frozenset[str] = frozenset({
    "prompt", "max_tokens", "min_tokens", "seed", "include_stop_str_in_output", "structured_outputs",
    "request_id", "return_token_ids", "stream", *SAME,
})  # fmt: skip
"""Every ``CompletionRequest`` field eagle3_raw sends."""

ALL_TOKENS = 1 << 30
"""SGLang's ``top_k`` for "every token" (its default); vLLM says 0 (or -1)."""


def unsupported_keys(params: Mapping[str, Any]) -> dict[str, str]:
    """The keys of a recipe's ``sampling_params`` vLLM cannot take, each with why."""
    return {key: UNSUPPORTED[key] for key in params if key in UNSUPPORTED and params[key] is not None}


def vllm_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` (SGLang's names, as a row's request holds them) as ``/v1/completions`` takes
    them, every :data:`DEFAULTS` key written out. ``ValueError`` for a key with no vLLM
    equivalent (the recipe check refuses those first)."""
    out: dict[str, Any] = dict(DEFAULTS)
    structured: dict[str, Any] = {}
    for key, value in params.items():
        if value is None:
            continue
        if key in STRUCTURED:
            structured[STRUCTURED[key]] = value
        elif key in RENAMED:
            out[RENAMED[key]] = value
        elif key in SAME:
            out[key] = value
        else:
            raise ValueError(f"sampling key {key!r} has no vLLM equivalent")
    if out["top_k"] in (-1, ALL_TOKENS):
        out["top_k"] = 0
    if isinstance(out.get("logit_bias"), Mapping):  # vLLM's JSON keys are strings
        out["logit_bias"] = {str(k): v for k, v in out["logit_bias"].items()}
    if structured:
        out["structured_outputs"] = structured
    return out
