"""vLLM's ``SamplingParams`` as the reference reads them: the keys it honours, vLLM 0.33's checks
and messages (``sampling_params.py::_verify_args``), and the engine's parameters they become.

Every other key is ignored, as vLLM's request models ignore unknown keys. ``max_tokens`` is fitted
to the context afterwards by the route (:func:`fit_max_tokens`). ``logit_bias``: a bias of at least
:data:`FORCING_BIAS` on one id makes the engine emit that id at every step (as a real model does
under a bias that large); smaller biases are accepted and have no effect on the reference engine.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from eagle3_raw.reference.engine import EngineParams
from eagle3_raw.reference.vllmapi.errors import VLLMError, invalid_body, validation

GREEDY_BELOW = 1e-5
"""vLLM's ``_SAMPLING_EPS``: a temperature below it samples greedily."""
FORCING_BIAS = 30.0
_FLOATS = {"temperature": 1.0, "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.0,
           "frequency_penalty": 0.0, "presence_penalty": 0.0}  # fmt: skip


@dataclass(frozen=True)
class Sampling:
    """The honoured ``SamplingParams`` of one request (``max_tokens`` None: the rest of the context)."""

    max_tokens: int | None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False
    min_tokens: int = 0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    skip_special_tokens: bool = True
    forced_id: int | None = None
    n: int = 1


def parse_sampling(values: Mapping[str, Any], default_max_tokens: int | None) -> Sampling:
    """The :class:`Sampling` of a completion body or a ``sampling_params`` object (VLLMError: 400)."""
    floats = {key: _float(values, key, default) for key, default in _FLOATS.items()}
    max_tokens = _int(values, "max_tokens", default_max_tokens)
    sampling = Sampling(
        max_tokens=max_tokens, top_k=_int(values, "top_k", 0) or 0, seed=_int(values, "seed", None),
        stop_token_ids=frozenset(_ids(values.get("stop_token_ids"))),
        ignore_eos=_bool(values, "ignore_eos", False), min_tokens=_int(values, "min_tokens", 0) or 0,
        skip_special_tokens=_bool(values, "skip_special_tokens", True),
        forced_id=_forced_id(values.get("logit_bias")), n=_int(values, "n", 1) or 1, **floats,
    )  # fmt: skip
    check(sampling)
    return sampling


def check(s: Sampling) -> None:
    """``SamplingParams._verify_args``, for the honoured keys."""
    if s.n != 1:
        raise VLLMError(
            f"n must be 1 on the reference server (one choice per request), got {s.n}.", param="n"
        )
    for name in ("presence_penalty", "frequency_penalty"):
        if not -2.0 <= getattr(s, name) <= 2.0:
            raise validation(f"{name} must be in [-2, 2], got {getattr(s, name)}.")
    if not math.isfinite(s.repetition_penalty) or s.repetition_penalty <= 0.0:
        raise validation(f"repetition_penalty must be greater than zero, got {s.repetition_penalty}.")
    if not math.isfinite(s.temperature) or s.temperature < 0.0:
        raise validation(
            f"temperature must be non-negative, got {s.temperature}.", "temperature", s.temperature
        )
    if s.temperature > 2.0:
        raise validation(f"temperature must be in [0, 2], got {s.temperature}.", "temperature", s.temperature)
    if not 0.0 < s.top_p <= 1.0:
        raise validation(f"top_p must be in (0, 1], got {s.top_p}.", "top_p", s.top_p)
    if s.top_k < -1:
        raise validation(f"top_k must be 0 (disable), or at least 1, got {s.top_k}.")
    if not 0.0 <= s.min_p <= 1.0:
        raise validation(f"min_p must be in [0, 1], got {s.min_p}.")
    check_max_tokens(s.max_tokens)
    if s.min_tokens < 0:
        raise validation(f"min_tokens must be greater than or equal to 0, got {s.min_tokens}.")
    if s.max_tokens is not None and s.min_tokens > s.max_tokens:
        raise validation(
            f"min_tokens must be less than or equal to max_tokens={s.max_tokens}, got {s.min_tokens}."
        )


def check_max_tokens(max_tokens: int | None) -> None:
    if max_tokens is not None and max_tokens < 1:
        raise validation(f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens", max_tokens)


def fit_max_tokens(max_tokens: int | None, prompt_len: int, max_model_len: int) -> int:
    """``get_max_tokens``: what is asked for, cut to the rest of the context (all of it when None)."""
    room = max_model_len - prompt_len
    return room if max_tokens is None else min(max_tokens, room)


def engine_params(s: Sampling, max_tokens: int) -> EngineParams:
    """The reference engine's parameters (SGLang's names) for ``s``, ``max_tokens`` already fitted."""
    return EngineParams(
        max_new_tokens=max_tokens, min_new_tokens=min(s.min_tokens, max_tokens),
        temperature=0.0 if s.temperature < GREEDY_BELOW else s.temperature, top_p=s.top_p,
        top_k=-1 if s.top_k < 1 else s.top_k, min_p=s.min_p, frequency_penalty=s.frequency_penalty,
        presence_penalty=s.presence_penalty, repetition_penalty=s.repetition_penalty,
        ignore_eos=s.ignore_eos, stop_token_ids=s.stop_token_ids, sampling_seed=s.seed,
    )  # fmt: skip


def _float(values: Mapping[str, Any], key: str, default: float) -> float:
    value = values.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise invalid_body(key, "Input should be a valid number")
    return float(value)


def _int(values: Mapping[str, Any], key: str, default: int | None) -> int | None:
    value = values.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid_body(key, "Input should be a valid integer")
    return value


def _bool(values: Mapping[str, Any], key: str, default: bool) -> bool:
    value = values.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid_body(key, "Input should be a valid boolean")
    return value


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(type(i) is int for i in value):
        raise invalid_body("stop_token_ids", "Input should be a valid list of integers")
    return value


def _forced_id(bias: Any) -> int | None:
    """The id a ``logit_bias`` forces (the largest bias, if at least :data:`FORCING_BIAS`)."""
    if bias is None:
        return None
    if not isinstance(bias, Mapping):
        raise invalid_body("logit_bias", "Input should be a valid dictionary")
    try:
        biases = {int(key): float(value) for key, value in bias.items()}
    except (TypeError, ValueError):
        raise invalid_body("logit_bias", "keys should be token ids and values numbers") from None
    best = max(biases.items(), key=lambda kv: kv[1], default=None)
    return best[0] if best is not None and best[1] >= FORCING_BIAS else None
