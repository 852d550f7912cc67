"""``sampling`` as a recipe gives it: each key's allowed values, and the canonical form (SGLang's
defaults resolved) that fingerprints and input keys hold. What SGLang 0.5.23 itself accepts and
defaults to is :mod:`eagle3_raw.sglang.sampling`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from eagle3_raw.errors import RecipeError
from eagle3_raw.recipe.fields import did_you_mean, is_int, is_number
from eagle3_raw.sglang.sampling import (
    FLOAT_KEYS,
    MANAGED_SAMPLING_KEYS,
    SAMPLING_ALIASES,
    SGLANG_OPTIONAL_SAMPLING_DEFAULTS,
    SGLANG_OPTIONAL_SAMPLING_KEYS,
    SGLANG_SAMPLING_DEFAULTS,
)


def _num_in(low: float, high: float, *, low_open: bool = False) -> Callable[[Any], bool]:
    return lambda v: is_number(v) and (v > low if low_open else v >= low) and v <= high


#: Each checked key's test and what it allows (keys not listed are passed to SGLang as written).
SAMPLING_CHECKS: Mapping[str, tuple[Callable[[Any], bool], str]] = {
    "max_new_tokens": (lambda v: is_int(v) and v >= 1, "expected an integer >= 1"),
    "min_new_tokens": (lambda v: is_int(v) and v >= 0, "expected an integer >= 0"),
    "temperature": (lambda v: is_number(v) and v >= 0, "expected a finite number >= 0 (0 = greedy)"),
    "top_p": (_num_in(0.0, 1.0, low_open=True), "expected a number in (0, 1]"),
    "top_k": (lambda v: is_int(v) and (v == -1 or v >= 1), "expected -1 (all) or an integer >= 1"),
    "min_p": (_num_in(0.0, 1.0), "expected a number in [0, 1]"),
    "frequency_penalty": (_num_in(-2.0, 2.0), "expected a number in [-2, 2]"),
    "presence_penalty": (_num_in(-2.0, 2.0), "expected a number in [-2, 2]"),
    "repetition_penalty": (_num_in(0.0, 2.0, low_open=True), "expected a number in (0, 2]"),
    "ignore_eos": (lambda v: isinstance(v, bool), "expected true or false"),
    "skip_special_tokens": (lambda v: isinstance(v, bool), "expected true or false"),
    "stop_token_ids": (lambda v: isinstance(v, list) and all(map(is_int, v)), "expected a list of ints"),
    "stop": (
        lambda v: (
            isinstance(v, str)
            or (isinstance(v, list) and len(v) <= 32 and all(isinstance(s, str) for s in v))
        ),
        "expected a string or a list of at most 32 strings",
    ),
}


def checked_params(prefix: str, params: Mapping[str, Any], own: frozenset[str]) -> dict[str, Any]:
    """``params`` checked key by key, then value by value; nulls dropped (SGLang's default, not
    sent). ``own``: the section's other keys, listed beside SGLang's when a key is unknown."""
    for key in params:
        check_sampling_key(key, prefix, own)
    for key, value in params.items():
        check_sampling_value(key, value, prefix)
    return {k: v for k, v in params.items() if v is not None}


def check_sampling_key(key: str, prefix: str, own: frozenset[str]) -> None:
    """RecipeError for a key eagle3_raw manages, or one SGLang does not take (with a hint)."""
    if key in MANAGED_SAMPLING_KEYS:
        raise RecipeError(f"{prefix}{key}", key, f"not settable: {MANAGED_SAMPLING_KEYS[key]}")
    if key not in SGLANG_SAMPLING_DEFAULTS and key not in SGLANG_OPTIONAL_SAMPLING_KEYS:
        allowed = sorted({*SGLANG_SAMPLING_DEFAULTS, *SGLANG_OPTIONAL_SAMPLING_KEYS, *own})
        hint = SAMPLING_ALIASES.get(key) or did_you_mean(key, allowed)
        raise RecipeError(
            f"{prefix}{key}", key, f"not an SGLang sampling key{hint}; allowed: {', '.join(allowed)}"
        )


def check_sampling_value(key: str, value: Any, prefix: str) -> None:
    """RecipeError for a value outside what SGLang takes for ``key`` (a null optional key is unset)."""
    if value is None and key in SGLANG_OPTIONAL_SAMPLING_DEFAULTS:
        return  # SGLang reads null as "use the default", as if the key were left out
    check = SAMPLING_CHECKS.get(key)
    if check is not None and not check[0](value):
        raise RecipeError(f"{prefix}{key}", value, check[1])


def check_min_new_tokens(prefix: str, params: Mapping[str, Any]) -> None:
    """RecipeError when ``min_new_tokens`` is above ``max_new_tokens`` (SGLang refuses it)."""
    minimum = params.get("min_new_tokens")
    if isinstance(minimum, int) and minimum > params["max_new_tokens"]:
        allowed = f"at most sampling.max_new_tokens ({params['max_new_tokens']}); SGLang refuses more"
        raise RecipeError(f"{prefix}min_new_tokens", minimum, allowed)


def is_greedy(params: Mapping[str, Any]) -> bool:
    """Whether SGLang samples these ``sampling_params`` greedily: a temperature below 1e-6 (SGLang
    makes it top_k 1) or ``top_k`` 1; every sample of one prompt is then the same answer."""
    temperature = params.get("temperature", SGLANG_SAMPLING_DEFAULTS["temperature"])
    return (isinstance(temperature, int | float) and temperature < 1e-6) or params.get("top_k") == 1


def canonical_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` with every SGLang default resolved: optional keys left at their default dropped."""
    result = {k: v for k, v in params.items() if not is_optional_default(k, v)}
    if result.get("top_k") == -1:
        result["top_k"] = SGLANG_SAMPLING_DEFAULTS["top_k"]
    for key, value in result.items():
        if isinstance(value, int) and not isinstance(value, bool) and key in FLOAT_KEYS:
            result[key] = float(value)
    return result


def is_optional_default(key: str, value: Any) -> bool:
    """True when sending ``value`` for optional ``key`` means the same to SGLang as leaving it out.

    Null, ``[]`` and ``{}`` are unset. An empty *string* is not: ``stop: ""`` or ``regex: ""`` changes
    the output. Types must match too (``0`` is not ``false``; SGLang refuses it).
    """
    if key not in SGLANG_OPTIONAL_SAMPLING_DEFAULTS:
        return False
    if value is None or (isinstance(value, (list, dict)) and not value):
        return True
    default = SGLANG_OPTIONAL_SAMPLING_DEFAULTS[key]
    return type(value) is type(default) and value == default
