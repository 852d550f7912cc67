"""SGLang 0.5.23's ``sampling_params`` as a client sends them: its defaults, the keys it accepts,
those eagle3_raw manages itself, and the names other APIs give its keys."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: SGLang 0.5.23 ``SamplingParams`` defaults (``sglang/api/v1/api_types.py``). Keys listed here are
#: sent explicitly on every request so a server's ``--preferred-sampling-params`` cannot change
#: the data behind the fingerprint's back.
SGLANG_SAMPLING_DEFAULTS: Mapping[str, Any] = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 1073741824,
    "min_p": 0.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "min_new_tokens": 0,
}

#: SGLang 0.5.23 defaults of every other ``sampling_params`` key a recipe may set (sent only when
#: written). ``max_new_tokens`` has no entry: a recipe must give it (the 128 default truncates).
SGLANG_OPTIONAL_SAMPLING_DEFAULTS: Mapping[str, Any] = {
    "stop": None,
    "stop_token_ids": None,
    "stop_regex": None,
    "json_schema": None,
    "regex": None,
    "ebnf": None,
    "structural_tag": None,
    "ignore_eos": False,
    "skip_special_tokens": True,
    "spaces_between_special_tokens": True,
    "no_stop_trim": False,
    "logit_bias": None,
    "custom_params": None,
    "beam_width": None,
    "watermark": None,
}

#: Every key SGLang 0.5.23 accepts in ``sampling_params`` that a recipe may set, beyond the defaults
#: sent on every request.
SGLANG_OPTIONAL_SAMPLING_KEYS = frozenset({"max_new_tokens", *SGLANG_OPTIONAL_SAMPLING_DEFAULTS})

#: Keys SGLang accepts but eagle3_raw sets itself or must not send, with the reason.
MANAGED_SAMPLING_KEYS: Mapping[str, str] = {
    "n": "use sampling.samples_per_prompt (each sample is its own request with its own seed)",
    "sampling_seed": "derived per row from sampling.seed",
    "stream_interval": "eagle3_raw does not stream",
    "choice": "SGLang 0.5.23 accepts it in the contract but fails on it",
}

#: Names other APIs use for an SGLang sampling key.
SAMPLING_ALIASES: Mapping[str, str] = {
    "max_tokens": " (SGLang calls it max_new_tokens)",
    "max_completion_tokens": " (SGLang calls it max_new_tokens)",
    "stop_sequences": " (SGLang calls it stop)",
}

#: The keys whose values SGLang reads as floats (an int written for them is the same request).
FLOAT_KEYS = frozenset(
    {"temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty"}
)
