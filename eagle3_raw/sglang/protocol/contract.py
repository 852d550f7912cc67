"""Gate 2: SGLang's JSON contract ``GenerateRequest`` (``sglang/api/v1/api_types.py``), re-implemented.

Since 0.5.22 SGLang checks the raw JSON against this generated contract after FastAPI's parsing:
unknown ``sampling_params`` keys and wrong JSON types are refused with HTTP 400 ``{"error": "<text>"}``,
worded as the contract (serde) words them. Unknown top-level keys pass. The checks are built from
small combinators named after the contract's types (``XOrList``, ``TokenIdsOrList``, structs that
deny unknown keys or not); :func:`check_contract` runs the whole ``GenerateRequest``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from eagle3_raw.sglang.protocol.errors import GateError

Check = Callable[[Any], None]


def _unexpected(v: Any) -> str:
    """serde's ``Unexpected`` display, as the contract words it."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return f"boolean `{'true' if v else 'false'}`"
    if isinstance(v, int):
        return f"integer `{v}`"
    if isinstance(v, float):
        return f"floating point `{v}`"
    if isinstance(v, str):
        return f'string "{v}"'
    return "sequence" if isinstance(v, list) else "map" if isinstance(v, dict) else type(v).__name__


def _fail(v: Any, expected: str) -> GateError:
    return GateError({"error": f"invalid type: {_unexpected(v)}, expected {expected}"})


def _kind(pred: Callable[[Any], bool], default: str) -> Callable[..., Check]:
    """A factory of checks for one JSON kind; the argument is the 'expected ...' wording."""

    def make(expected: str = default) -> Check:
        def check(v: Any) -> None:
            if not pred(v):
                raise _fail(v, expected)

        return check

    return make


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


_bool = _kind(lambda v: isinstance(v, bool), "a boolean")
_int = _kind(_is_int, "i64")
_float = _kind(_is_number, "f64")
_str = _kind(lambda v: isinstance(v, str), "a string")
_map = _kind(lambda v: isinstance(v, dict), "a map")
_list = _kind(lambda v: isinstance(v, list), "a sequence")()


def _uint(expected: str) -> Check:
    is_int = _int(expected)

    def check(v: Any) -> None:
        is_int(v)
        if v < 0:
            raise GateError({"error": f"invalid value: integer `{v}`, expected {expected}"})

    return check


def _any(v: Any) -> None:
    return None


def _opt(check: Check) -> Check:
    def optional(v: Any) -> None:
        if v is not None:
            check(v)

    return optional


def _seq(item: Check) -> Check:
    def check(v: Any) -> None:
        _list(v)
        for x in v:
            item(x)

    return check


def _ints(v: Any) -> None:
    """``TokenIds``/``Int64List``: non-bool ints, checked in one C-level pass (the hot path)."""
    _list(v)
    if v and not set(map(type, v)) <= {int}:
        raise _fail(next(x for x in v if type(x) is not int), "i64")


def _values(item: Check) -> Check:
    is_map = _map()

    def check(v: Any) -> None:
        is_map(v)
        for x in v.values():
            item(x)

    return check


def _one_or_list(name: str, one: Callable[[str], Check], many: Check) -> Check:
    """``XOrList``: an array is the list arm; anything else must be the single arm."""
    single = one(f"a value or an array of values for {name}")
    return lambda v: many(v) if isinstance(v, list) else single(v)


def _flat_or_nested(name: str, is_flat: Callable[[Any], bool], flat: Check) -> Check:
    """``TokenIdsOrList``/``StringListOrList``: ``[]`` or ``[scalar, ...]`` is flat, else a batch."""
    nested = _seq(flat)

    def check(v: Any) -> None:
        if not isinstance(v, list):
            raise _fail(v, f"a value or an array of values for {name}")
        (flat if not v or is_flat(v[0]) else nested)(v)

    return check


def _struct(name: str, fields: Mapping[str, Check], *, deny_unknown: bool) -> Check:
    is_map = _map(f"struct {name}")

    def check(v: Any) -> None:
        is_map(v)
        for key, x in v.items():
            if key in fields:
                fields[key](x)
            elif deny_unknown:
                raise GateError({"error": _unknown_field_text(key, tuple(fields))})

    return check


def _unknown_field_text(key: str, fields: tuple[str, ...]) -> str:
    """serde's ``unknown_field`` wording (all structs that deny unknown keys have 3+ fields)."""
    return f"unknown field `{key}`, expected one of {', '.join(f'`{f}`' for f in fields)}"


def _map_then(struct: Check) -> Callable[[str], Check]:
    """The single arm of ``SamplingParamsOrList``/``KvHintsEnvelopeOrList``: a map, then the struct."""

    def make(expected: str) -> Check:
        is_map = _map(expected)

        def check(v: Any) -> None:
            is_map(v)
            struct(v)

        return check

    return make


def _media_item(v: Any) -> None:
    if isinstance(v, dict):
        _MEDIA_REF(v)
    elif not isinstance(v, str):
        raise _fail(v, "one of the MediaItem shapes")


def _media_input(v: Any) -> None:
    if isinstance(v, (str, dict)):
        _media_item(v)
    elif not isinstance(v, list):
        raise _fail(v, "one of the MediaInput shapes")
    else:
        (_MEDIA_ITEMS_LIST if v and isinstance(v[0], list) else _MEDIA_ITEMS)(v)


_opt_int, _opt_str, _opt_float, _opt_bool = _opt(_int()), _opt(_str()), _opt(_float()), _opt(_bool())
_bools = _one_or_list("BoolOrList", _bool, _seq(_bool()))
_int64s = _one_or_list("Int64OrList", _int, _seq(_int()))
_strings = _one_or_list("StringOrList", _str, _seq(_str()))
_opt_strings = _one_or_list("OptionalStringOrList", _str, _seq(_opt_str))
_opt_int64s = _one_or_list("OptionalInt64OrList", _int, _seq(_opt_int))
_token_ids = _flat_or_nested("TokenIdsOrList", _is_number, _ints)
_MEDIA_ITEMS = _seq(_opt(_media_item))
_MEDIA_ITEMS_LIST = _seq(_opt(_MEDIA_ITEMS))

_WATERMARK = _struct(
    "WatermarkRequestConfig",
    {"enabled": _opt_bool, "key": _opt_str, "context_window": _opt_int},
    deny_unknown=True,
)
_SAMPLING = _struct("SamplingParams", {
    "max_new_tokens": _opt_int, "stop": _opt(_strings), "stop_token_ids": _opt(_ints),
    "stop_regex": _opt(_strings), "temperature": _opt_float, "top_p": _opt_float, "top_k": _opt_int,
    "min_p": _opt_float, "frequency_penalty": _opt_float, "presence_penalty": _opt_float,
    "repetition_penalty": _opt_float, "min_new_tokens": _opt_int, "n": _opt_int, "json_schema": _opt_str,
    "regex": _opt_str, "ebnf": _opt_str, "structural_tag": _opt_str, "ignore_eos": _opt_bool,
    "skip_special_tokens": _opt_bool, "spaces_between_special_tokens": _opt_bool, "no_stop_trim": _opt_bool,
    "stream_interval": _opt_int, "logit_bias": _opt(_values(_float())), "sampling_seed": _opt_int,
    "custom_params": _any, "beam_width": _opt_int, "watermark": _opt(_WATERMARK),
    "choice": _opt(_seq(_str())),
}, deny_unknown=True)  # fmt: skip
_MEDIA_REF = _struct("MediaRef", {
    "url": _str(), "detail": _opt_str, "max_dynamic_patch": _opt_int, "content_hash": _opt_str,
    "min_pixels": _opt_int, "max_pixels": _opt_int, "total_max_pixels": _opt_int, "fps": _opt_float,
    "num_frames": _opt_int, "min_frames": _opt_int, "max_frames": _opt_int, "max_tokens_per_frame": _opt_int,
    "max_image_tokens": _opt_int, "use_audio": _opt_bool, "image_grid_thw": _opt(_seq(_ints)),
}, deny_unknown=True)  # fmt: skip
_KV_ACTION = _struct("KvHintAction", {
    "action_id": _str(), "action_type": _str(), "action_version": _str(), "payload": _any,
}, deny_unknown=False)  # fmt: skip
_KV_HINTS = _struct(
    "KvHintsEnvelope",
    {"protocol_version": _str(), "message_id": _str(), "actions": _opt(_seq(_KV_ACTION))},
    deny_unknown=False,
)
_IMAGES_CONFIG = _struct("ImagesConfig", {"image_mode": _opt_str, "prefix": _str()}, deny_unknown=False)
_GENERATE = _struct("GenerateRequest", {
    "rid": _opt(_strings), "text": _opt(_strings), "input_ids": _opt(_token_ids), "stream": _opt_bool,
    "sampling_params": _opt(_one_or_list("SamplingParamsOrList", _map_then(_SAMPLING), _seq(_SAMPLING))),
    "return_logprob": _opt(_bools), "logprob_start_len": _opt(_int64s), "top_logprobs_num": _opt(_int64s),
    "token_ids_logprob": _opt(_token_ids), "return_hidden_states": _opt(_bools),
    "return_text_in_logprobs": _opt_bool, "bootstrap_host": _opt(_opt_strings),
    "bootstrap_port": _opt(_opt_int64s), "bootstrap_room": _opt(_opt_int64s),
    "bootstrap_pair_key": _opt(_opt_strings), "decode_tp_size": _opt(_opt_int64s),
    "routed_dp_rank": _opt_int, "disagg_prefill_dp_rank": _opt_int, "image_data": _opt(_media_input),
    "mm_hashes": _opt(_flat_or_nested("StringListOrList", lambda x: isinstance(x, str), _seq(_str()))),
    "video_data": _opt(_media_input), "audio_data": _opt(_media_input), "extra_key": _opt(_strings),
    "priority": _opt_int, "cache_salt": _opt(_strings), "require_reasoning": _opt_bool,
    "lora_path": _opt(_opt_strings), "session_params": _any,
    "kv_hints": _opt(_one_or_list("KvHintsEnvelopeOrList", _map_then(_KV_HINTS), _seq(_opt(_KV_HINTS)))),
    "routing_key": _opt_str, "max_thinking_tokens": _opt(_uint("u64")), "session_id": _opt_str,
    "custom_logit_processor": _opt(_opt_strings), "custom_labels": _opt(_values(_str())),
    "images_config": _opt(_IMAGES_CONFIG),
    "return_prompt_token_ids": _bool(), "routed_experts_start_len": _int(),
    "return_sampling_mask": _opt(_bools), "modalities": _opt(_seq(_opt_str)),
}, deny_unknown=False)  # fmt: skip


def check_contract(body: Any) -> None:
    """Gate 2: raise :class:`GateError` ``{"error": text}`` exactly where
    ``GenerateRequest.from_json_value`` raises ``JsonContractError``, with the same text."""
    _GENERATE(body)
