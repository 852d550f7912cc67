"""``sampling_params``: SGLang's defaults, normalization and validation (``srt/sampling/sampling_params.py``).

:func:`parse_sampling` turns the dict a request sent (already past the contract gate) into a frozen
:class:`Sampling` the way SGLang's ``SamplingParams(**raw)``, ``normalize`` and ``verify`` do: nulls
mean defaults, any temperature below 1e-6 is greedy (``top_k=1``), ``top_k=-1`` means all, stop lists
are bounded, and range errors carry SGLang's wording (``shared/sglang-protocol.md`` §2).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from eagle3_raw.sglang.protocol.errors import InternalServerError, RequestError

TOP_K_ALL = 1 << 30
_SAMPLING_EPS = 1e-6
_MAX_STOPS = 32
_MAX_STOP_REGEX_BYTES = 256


@dataclass(frozen=True)
class Sampling:
    """Validated sampling parameters, SGLang's defaults applied (greedy mapping included)."""

    max_new_tokens: int | None = 128
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = TOP_K_ALL
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: tuple[str, ...] = ()
    stop_regex: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    stream_interval: int | None = None
    sampling_seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.top_k == 1


_DEFAULTS = Sampling()
_GRAMMARS = ("json_schema", "regex", "ebnf", "structural_tag")


def parse_sampling(raw: Mapping[str, Any], vocab_size: int, *, has_tokenizer: bool) -> Sampling:
    """SGLang's ``SamplingParams(**raw)``, ``normalize`` and ``verify``, in that order.

    ``raw`` passed the contract gate. Raises :class:`RequestError` (400) or, for the contract-only
    key ``choice`` and unparsable ``stop_regex`` patterns, :class:`InternalServerError` (500).
    """
    if "choice" in raw:
        raise InternalServerError("SamplingParams() got an unexpected keyword argument 'choice'")
    values = {key: raw[key] for key in _FIELDS if raw.get(key) is not None}
    if "max_new_tokens" in raw:
        values["max_new_tokens"] = raw["max_new_tokens"]  # null means "up to the context", not 128
    stop, stop_regex = _as_tuple(raw.get("stop")), _as_tuple(raw.get("stop_regex"))
    if _is_greedy(values.get("temperature", 1.0)):
        values.update(temperature=1.0, top_k=1)
    if values.get("top_k") == -1:
        values["top_k"] = TOP_K_ALL
    _normalize_stops(stop, stop_regex, values.get("min_new_tokens", 0), has_tokenizer)
    sampling = Sampling(
        **values, stop=stop, stop_regex=stop_regex, stop_token_ids=frozenset(raw.get("stop_token_ids") or ())
    )
    _verify(sampling, raw, vocab_size)
    _refuse_unsupported(raw)
    return sampling


_FIELDS = tuple(f for f in Sampling.__dataclass_fields__ if f not in ("stop", "stop_regex", "stop_token_ids"))


def _is_greedy(temperature: float) -> bool:
    return 0 <= temperature < _SAMPLING_EPS


def _as_tuple(value: str | list[str] | None) -> tuple[str, ...]:
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)


def _normalize_stops(
    stop: tuple[str, ...], stop_regex: tuple[str, ...], min_new: int, tokenizer: bool
) -> None:
    if len(stop) > _MAX_STOPS:
        raise RequestError(f"at most {_MAX_STOPS} stop strings are allowed, got {len(stop)}")
    if len(stop_regex) > _MAX_STOPS:
        raise RequestError(f"at most {_MAX_STOPS} stop_regex patterns are allowed, got {len(stop_regex)}")
    for pattern in stop_regex:
        size = len(pattern.encode("utf-8"))
        if size > _MAX_STOP_REGEX_BYTES:
            raise RequestError(f"stop_regex is {size} bytes, over the {_MAX_STOP_REGEX_BYTES}-byte limit")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise InternalServerError(f"bad stop_regex {pattern!r}: {exc}") from exc
    if tokenizer:
        return
    needs = "(requires tokenizer to decode tokens to text for matching)."
    if stop:
        raise RequestError(f"stop={list(stop)!r} is unavailable when skip_tokenizer_init=True {needs}")
    if stop_regex:
        raise RequestError(
            f"stop_regex={list(stop_regex)!r} is unavailable when skip_tokenizer_init=True {needs}"
        )
    if min_new > 0:
        raise RequestError(
            f"min_new_tokens={min_new} is unavailable when skip_tokenizer_init=True "
            "(requires tokenizer for eos_token_id)."
        )


_RULES: tuple[tuple[Callable[[Sampling], bool], str], ...] = (
    (lambda s: not math.isfinite(s.temperature) or s.temperature < 0.0,
     "temperature must be a non-negative finite number, got {s.temperature}."),
    (lambda s: not 0.0 < s.top_p <= 1.0, "top_p must be in (0, 1], got {s.top_p}."),
    (lambda s: not 0.0 <= s.min_p <= 1.0, "min_p must be in [0, 1], got {s.min_p}."),
    (lambda s: s.top_k < 1, "top_k must be -1 (disable) or at least 1, got {s.top_k}."),
    (lambda s: not -2.0 <= s.frequency_penalty <= 2.0,
     "frequency_penalty must be in [-2, 2], got {s.frequency_penalty}."),
    (lambda s: not -2.0 <= s.presence_penalty <= 2.0,
     "presence_penalty must be in [-2, 2], got {s.presence_penalty}."),
    (lambda s: not 0.0 < s.repetition_penalty <= 2.0,
     "repetition_penalty must be in (0, 2] (1.0 = no penalty), got {s.repetition_penalty}."),
    (lambda s: s.min_new_tokens < 0,
     "min_new_tokens must be in [0, max_new_tokens], got {s.min_new_tokens}."),
)  # fmt: skip
"""``SamplingParams.verify``'s range rules in its order (after ``beam_width``), with its wording."""


def _verify(s: Sampling, raw: Mapping[str, Any], vocab_size: int) -> None:
    """``SamplingParams.verify``: the first failing rule, worded as SGLang words it."""
    beam_width = raw.get("beam_width")
    if beam_width is not None and beam_width < 1:
        raise RequestError(f"beam_width must be at least 1, got {beam_width}.")
    for failed, message in _RULES:
        if failed(s):
            raise RequestError(message.format(s=s))
    _verify_lengths(s)
    _verify_logit_bias(raw.get("logit_bias"), vocab_size)
    _verify_seed(s.sampling_seed)
    if sum(raw.get(key) is not None and raw.get(key) != "" for key in _GRAMMARS) > 1:
        raise RequestError("Only one of json_schema, regex, ebnf, or structural_tag can be set.")


def _verify_lengths(s: Sampling) -> None:
    if s.max_new_tokens is None:
        return
    if s.max_new_tokens < 0:
        raise RequestError(f"max_new_tokens must be at least 0, got {s.max_new_tokens}.")
    if s.min_new_tokens > s.max_new_tokens:
        raise RequestError(
            f"min_new_tokens must be in [0, max_new_tokens({s.max_new_tokens})], got {s.min_new_tokens}."
        )


def _verify_logit_bias(logit_bias: Mapping[str, float] | None, vocab_size: int) -> None:
    for key in logit_bias or {}:
        try:
            token_id = int(key)
        except ValueError as exc:
            raise RequestError(str(exc)) from exc
        if not 0 <= token_id < vocab_size:
            raise RequestError(f"logit_bias must has keys in [0, {vocab_size - 1}], got {key}.")


def _verify_seed(seed: int | None) -> None:
    if seed is not None and not -(2**63) <= seed <= 2**63 - 1:
        raise RequestError(f"sampling_seed must be in [-2**63, 2**63 - 1], got {seed}.")


def _refuse_unsupported(raw: Mapping[str, Any]) -> None:
    """What SGLang would honour but the reference engine cannot: refused, never silently ignored."""
    unsupported = [key for key in _GRAMMARS if raw.get(key)]
    if (raw.get("beam_width") or 1) > 1:
        unsupported.append("beam_width")
    if raw.get("logit_bias"):
        unsupported.append("logit_bias")
    if isinstance(raw.get("watermark"), dict) and raw["watermark"].get("enabled"):
        unsupported.append("watermark")
    if unsupported:
        raise RequestError(f"{unsupported[0]} is not supported by the reference server.")
