"""SGLang 0.5.23's ``/generate`` request path, re-implemented without SGLang: gates, normalization,
sampling defaults and validation, length limits, and the three error body shapes.

A request meets, in SGLang's order (``shared/sglang-protocol.md`` §1, §2, §5):

1. FastAPI/pydantic parsing of ``GenerateReqInput`` (:func:`check_fields`): malformed JSON or a
   top-level field of the wrong JSON type → :class:`GateError`, 400 ``{"object": "error", ...}``.
2. The JSON contract ``GenerateRequest`` of ``sglang/api/v1/api_types.py`` (:func:`check_contract`):
   unknown sampling keys, wrong types → :class:`GateError`, 400 ``{"error": "<text>"}`` with the
   contract's own wording.
3. Normalization (:func:`normalize`) and per-item checks (:func:`check_item`, :func:`parse_sampling`)
   → :class:`RequestError` (SGLang's ``ValueError``), 400 ``{"error": {"message": ...}}`` or, on a
   stream, one SSE error event.

Where SGLang itself would crash (an ``IndexError``, ``TypeError``...), :class:`InternalServerError`
stands for its plain-text 500. Features the reference cannot honour (logprobs, grammars, beam search,
logit bias, watermarks) are refused with a :class:`RequestError` naming the reference server, never
silently ignored.
"""

from __future__ import annotations

import math
import re
import uuid
from array import array
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

TOP_K_ALL = 1 << 30
_SAMPLING_EPS = 1e-6
_MAX_STOPS = 32
_MAX_STOP_REGEX_BYTES = 256

# --- errors and their bodies -----------------------------------------------------------------


class GateError(Exception):
    """A refusal before normalization (pydantic or contract gate): always a plain HTTP 400."""

    def __init__(self, body: dict[str, Any]) -> None:
        super().__init__(str(body))
        self.body = body


class RequestError(ValueError):
    """SGLang's ``ValueError`` path: 400 ``{"error": {"message": ...}}`` (or an SSE error event)."""


class InternalServerError(Exception):
    """Where SGLang raises an uncaught exception: HTTP 500, plain text ``Internal Server Error``."""


def value_error_body(message: str) -> dict[str, Any]:
    """Body of a ``ValueError`` refusal (normalization, validation, scheduler 400 aborts)."""
    return {"error": {"message": message}}


def http_exception_body(status: int, message: str) -> dict[str, Any]:
    """Body of an ``HTTPException`` (e.g. the 503 of a full queue)."""
    return {"object": "error", "message": message, "type": str(status), "param": None, "code": status}


def stream_error_event(message: str) -> dict[str, Any]:
    """The one SSE event a stream carries when validation fails after the stream started."""
    return {"error": {"message": message, "type": "invalid_request_error", "code": 400, "retryable": False}}


def validation_error(kind: str, loc: tuple[Any, ...], msg: str, value: Any) -> GateError:
    """FastAPI's 400 for a body its pydantic model refuses (``{"object": "error", ...}``)."""
    error = {"type": kind, "loc": ("body", *loc), "msg": msg, "input": value}
    message = f"1 validation error:\n  {error!r}\n [{error!r}]"
    return GateError(
        {"object": "error", "message": message, "type": "Bad Request", "param": None, "code": 400}
    )


# --- gate 1: FastAPI/pydantic parsing of GenerateReqInput ------------------------------------

_DICT, _INT = "Input should be a valid dictionary", "Input should be a valid integer"
_BOOL_WORDS = frozenset({"0", "off", "f", "false", "n", "no", "1", "on", "t", "true", "y", "yes"})


def _lax_bool(v: Any) -> bool:
    if isinstance(v, bool) or (type(v) in (int, float) and v in (0, 1)):
        return True
    return isinstance(v, str) and v.lower() in _BOOL_WORDS


def _lax_int(v: Any) -> bool:
    if type(v) is float:
        return v.is_integer()
    if isinstance(v, str):
        return re.fullmatch(r"\s*[+-]?\d+\s*", v) is not None
    return isinstance(v, int)


def _one_or_many(ok: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: v is None or ok(v) or (isinstance(v, list) and all(map(ok, v)))


def _int_rows(v: Any) -> bool:
    return isinstance(v, list) and all(
        _lax_int(x) or (isinstance(x, list) and all(map(_lax_int, x))) for x in v
    )


_FIELD_TYPES: dict[str, tuple[Callable[[Any], bool], str, str]] = {
    "text": (_one_or_many(lambda v: isinstance(v, str)), "string_type", "Input should be a valid string"),
    "rid": (_one_or_many(lambda v: isinstance(v, str)), "string_type", "Input should be a valid string"),
    "sampling_params": (_one_or_many(lambda v: isinstance(v, dict)), "dict_type", _DICT),
    "stream": (_lax_bool, "bool_parsing", "Input should be a valid boolean, unable to interpret input"),
    "return_text_in_logprobs": (_lax_bool, "bool_parsing", "Input should be a valid boolean"),
    "return_prompt_token_ids": (_lax_bool, "bool_parsing", "Input should be a valid boolean"),
    "return_logprob": (_one_or_many(_lax_bool), "bool_parsing", "Input should be a valid boolean"),
    "logprob_start_len": (_one_or_many(_lax_int), "int_parsing", "Input should be a valid integer"),
    "top_logprobs_num": (_one_or_many(_lax_int), "int_parsing", "Input should be a valid integer"),
    "token_ids_logprob": (lambda v: v is None or _int_rows(v), "list_type", "Input should be a valid list"),
    "priority": (lambda v: v is None or _lax_int(v), "int_parsing", _INT),
    "routed_dp_rank": (lambda v: v is None or _lax_int(v), "int_parsing", _INT),
    "data_parallel_rank": (lambda v: v is None or _lax_int(v), "int_parsing", _INT),
    "session_params": (lambda v: v is None or isinstance(v, dict), "dict_type", _DICT),
}  # fmt: skip


def check_fields(body: Any) -> None:
    """Gate 1: raise :class:`GateError` where FastAPI would refuse to build ``GenerateReqInput``."""
    if not isinstance(body, dict):
        raise validation_error(
            "dataclass_type", (), "Input should be a dictionary or an instance of GenerateReqInput", body
        )
    for key, value in body.items():
        if key == "input_ids":
            _check_input_ids_field(value)
        elif key in _FIELD_TYPES:
            ok, kind, msg = _FIELD_TYPES[key]
            if not ok(value):
                raise validation_error(kind, (key,), msg, value)


def _check_input_ids_field(v: Any) -> None:
    """SGLang's ``validate_optional_list_i64_1d_2d`` (a pydantic ``PlainValidator``)."""
    if v is None or (isinstance(v, list) and not v):
        return
    if not isinstance(v, list):
        problem = f"must be list or null; got {type(v).__name__}"
    elif isinstance(v[0], int):
        problem = _i64_row_problem(v)
    elif isinstance(v[0], list):
        problem = next((f"row {i}: {p}" for i, row in enumerate(v) if (p := _i64_row_problem(row))), "")
    else:
        problem = f"elements must be int or list; got {type(v[0]).__name__}"
    if problem:
        raise validation_error("value_error", ("input_ids",), f"Value error, {problem}", v)


def _i64_row_problem(row: Any) -> str:
    if not isinstance(row, list):
        return f"must be list; got {type(row).__name__}"
    if row and not isinstance(row[0], int):
        return f"elements must be int; got {type(row[0]).__name__}"
    try:
        array("q", row)
    except (TypeError, OverflowError) as exc:
        return f"contains non-int64 element: {exc}"
    return ""


def json_error() -> GateError:
    """The 400 FastAPI sends for a body that is not JSON at all."""
    return validation_error("json_invalid", (0,), "JSON decode error", {})


def missing_body() -> GateError:
    """The 400 FastAPI sends for an empty body."""
    return validation_error("missing", (), "Field required", None)


# --- gate 2: the JSON contract (sglang/api/v1/api_types.py), re-implemented ------------------

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


# --- normalization (GenerateReqInput.normalize_batch_and_arguments) --------------------------


@dataclass(frozen=True)
class ItemSpec:
    """One generation a request asks for, before tokenization and validation.

    ``prompt`` is the ``input_ids`` list or the ``text`` string; ``sampling`` is the dict as sent.
    """

    rid: str
    prompt: list[int] | str
    sampling: Mapping[str, Any]
    token_ids_logprob: Any
    return_logprob: Any
    return_hidden_states: Any
    custom_logit_processor: Any


@dataclass(frozen=True)
class Normalized:
    """A normalized request: its items in SGLang's dispatch order (prompt-major when ``n > 1``)."""

    items: tuple[ItemSpec, ...]
    is_single: bool
    stream: bool
    rids: tuple[str, ...]
    """The rids SGLang registers as in flight on arrival (checked for duplicates)."""
    return_prompt_token_ids: bool
    n: int = 1
    """Samples per prompt (``sampling_params.n``)."""


def normalize(body: Mapping[str, Any]) -> Normalized:
    """Gate 3a: SGLang's normalization of a body that passed both gates.

    Raises :class:`RequestError` where SGLang raises ``ValueError`` and :class:`InternalServerError`
    where it crashes (e.g. a ``sampling_params`` list shorter than the batch).
    """
    prompts, is_single = _prompts(body)
    if body.get("session_id") is not None and body.get("session_params") is not None:
        raise RequestError("session_id and session_params cannot both be set.")
    n = _parallel_sample_num(body.get("sampling_params"))
    stream, with_prompt_ids = bool(body.get("stream")), bool(body.get("return_prompt_token_ids"))
    if is_single and n <= 1:
        item = _item(body, prompts[0], body.get("rid"), body.get("sampling_params") or {}, None)
        if isinstance(item.rid, list) or isinstance(item.sampling, list):
            raise InternalServerError("a list of rids or sampling_params for a single prompt")
        return Normalized((item,), True, stream, (item.rid,), with_prompt_ids)
    if n < 1:
        raise InternalServerError("parallel_sample_num < 1 on a batch")
    rids = _batch_rids(body.get("rid"), len(prompts), n)
    _check_batch_options(body, len(prompts), n)
    _check_unique(rids)
    return Normalized(_batch_items(body, prompts, rids, n), False, stream, tuple(rids), with_prompt_ids, n)


def check_request(body: Mapping[str, Any]) -> None:
    """The tokenizer manager's request-wide checks after normalization, in its order."""
    priority = body.get("priority")
    if priority is not None and not -(1 << 63) <= int(priority) < (1 << 63):
        raise RequestError(
            "priority must be a signed 64-bit integer between -9223372036854775808 and 9223372036854775807"
        )
    if body.get("max_thinking_tokens") is not None:
        raise RequestError(
            "max_thinking_tokens requires the server to be launched with --enable-strict-thinking"
        )
    rank = body.get("routed_dp_rank", body.get("data_parallel_rank"))
    if rank is not None and int(rank) != 0:
        raise RequestError(f"routed_dp_rank={rank} out of range [0, 1)")


def check_lora(body: Mapping[str, Any]) -> None:
    """Refuse LoRA adapters (the reference has none), worded as SGLang without ``--enable-lora``."""
    lora = body.get("lora_path")
    first = lora if isinstance(lora, str) else next((a for a in lora or () if a), None)
    if first:
        raise RequestError(
            f"LoRA adapter '{first}' was requested, but LoRA is not enabled. Please launch the server with "
            "--enable-lora flag and preload adapters using --lora-paths or /load_lora_adapter endpoint."
        )
    if body.get("session_params"):
        raise RequestError("session_params is not supported by the reference server.")


def _prompts(body: Mapping[str, Any]) -> tuple[list[Any], bool]:
    text, input_ids, embeds = body.get("text"), body.get("input_ids"), body.get("input_embeds")
    given = [x is not None for x in (text, input_ids, embeds)]
    if not any(given) or all(given):
        raise RequestError("Either text, input_ids or input_embeds should be provided.")
    if text is None and input_ids is None:
        return [_Embeds()], True
    if text is not None and input_ids is not None:
        # The batch shape comes from `text`, the ids actually used from `input_ids`.
        if isinstance(text, str) != (not input_ids or isinstance(input_ids[0], int)):
            raise InternalServerError("text and input_ids disagree on the batch shape")
        return ([input_ids], True) if isinstance(text, str) else (list(input_ids), False)
    if text is not None:
        return ([text], True) if isinstance(text, str) else (list(text), False)
    if not input_ids:
        raise RequestError("input_ids cannot be empty.")
    return ([input_ids], True) if isinstance(input_ids[0], int) else (list(input_ids), False)


class _Embeds(list[int]):
    """Marks an ``input_embeds`` prompt (refused per item, like SGLang without its flag)."""


def _parallel_sample_num(sampling_params: Any) -> int:
    if sampling_params is None:
        return 1
    if isinstance(sampling_params, dict):
        return _n_of(sampling_params)
    if not sampling_params:
        raise InternalServerError("sampling_params is an empty list")
    n = _n_of(sampling_params[0])
    if any(_n_of(sp) != n for sp in sampling_params):
        raise RequestError("The parallel_sample_num should be the same for all samples in sample params.")
    return n


def _n_of(sampling: Mapping[str, Any]) -> int:
    if (sampling.get("beam_width") or 1) > 1:
        return 1  # beam search: n counts returned beams, there is no fan-out
    n = sampling.get("n", 1)
    return 1 if n is None else int(n)


def _batch_rids(rid: Any, batch_size: int, n: int) -> list[str]:
    if rid is None:
        return [uuid.uuid4().hex for _ in range(batch_size * n)]
    if isinstance(rid, str):
        return [f"{rid}_{i}" for i in range(batch_size * n)]
    if len(rid) != batch_size:
        raise RequestError("The specified rids length mismatch with the batch_size for batch processing.")
    return list(rid)


_LIST_OPTIONS = ("return_logprob", "logprob_start_len", "top_logprobs_num", "return_sampling_mask")


def _check_batch_options(body: Mapping[str, Any], batch_size: int, n: int) -> None:
    """The per-item options a batch refuses, in SGLang's order."""
    ids_logprob, hidden = body.get("token_ids_logprob"), body.get("return_hidden_states")
    lists = [key for key in _LIST_OPTIONS if isinstance(body.get(key), list)]
    if ids_logprob and isinstance(ids_logprob[0], list):
        lists.append("token_ids_logprob")
    if n > 1 and lists:
        raise RequestError(f"Cannot use list {lists[0]} with parallel_sample_num > 1")
    if isinstance(hidden, list) and len(hidden) != batch_size:
        raise RequestError("The length of return_hidden_states should be equal to the batch size.")
    if n > 1 and isinstance(body.get("custom_logit_processor"), list):
        raise RequestError("Cannot use list custom_logit_processor with parallel_sample_num > 1")


def _check_unique(rids: list[str]) -> None:
    if len(set(rids)) != len(rids):
        duplicates = [r for r, count in Counter(rids).items() if count > 1]
        raise RequestError(f"Duplicate request IDs detected within the request: {duplicates}")


def _batch_items(
    body: Mapping[str, Any], prompts: list[Any], rids: list[str], n: int
) -> tuple[ItemSpec, ...]:
    """Prompt-major items; with ``n > 1`` each sample gets a fresh uuid rid (``regenerate_rid``)."""
    sampling = body.get("sampling_params")
    expanded = [sampling or {}] * (len(prompts) * n) if not isinstance(sampling, list) else sampling * n
    items = []
    for i, prompt in enumerate(prompts):
        for _ in range(n):
            rid = rids[i] if n == 1 else uuid.uuid4().hex
            items.append(_item(body, prompt, rid, _at(expanded, i), i))
    return tuple(items)


def _item(body: Mapping[str, Any], prompt: Any, rid: Any, sampling: Any, i: int | None) -> ItemSpec:
    def value(key: str) -> Any:
        v = body.get(key)
        return _at(v, i) if i is not None and isinstance(v, list) else v

    ids_logprob = body.get("token_ids_logprob") or None
    if i is not None and ids_logprob is not None and isinstance(ids_logprob[0], list):
        ids_logprob = _at(ids_logprob, i)
    return ItemSpec(
        rid=rid if rid is not None else uuid.uuid4().hex,
        prompt=prompt,
        sampling=sampling,
        token_ids_logprob=ids_logprob,
        return_logprob=value("return_logprob"),
        return_hidden_states=value("return_hidden_states"),
        custom_logit_processor=value("custom_logit_processor"),
    )


def _at(values: Sequence[Any], i: int) -> Any:
    try:
        return values[i]
    except IndexError as exc:
        raise InternalServerError(f"a per-item list is too short for item {i}") from exc


# --- per-item checks (TokenizerManager._tokenize_one_request / _validate_one_request) ---------

_HIDDEN_STATES = (
    "The server is not configured to return hidden states. Please set `--return-hidden-states-mode last`, "
    "`--return-hidden-states-mode full`, or the legacy `--enable-return-hidden-states` flag."
)
_CUSTOM_LOGIT_PROCESSOR = (
    "The server is not configured to enable custom logit processor. "
    "Please set `--enable-custom-logit-processor` to enable this feature."
)
_SKIP_TOKENIZER_TEXT = (
    "The engine initialized with skip_tokenizer_init=True cannot accept text prompts. "
    "Please provide input_ids or re-initialize the engine with skip_tokenizer_init=False."
)


def prompt_ids(spec: ItemSpec, encode: Callable[[str], list[int]] | None, *, radix_cache: bool) -> list[int]:
    """The token ids of an item's prompt: ``input_ids`` verbatim, or ``text`` tokenized."""
    if isinstance(spec.prompt, _Embeds):
        if radix_cache:
            raise RequestError(
                "input_embeds is provided while disable_radix_cache is False. Please add "
                "`--disable-radix-cache` when you launch the server if you want to use input_embeds "
                "as inputs."
            )
        raise RequestError("input_embeds is not supported by the reference server.")
    if isinstance(spec.prompt, str):
        if encode is None:
            raise RequestError(_SKIP_TOKENIZER_TEXT)
        ids = encode(spec.prompt)
    else:
        ids = spec.prompt
    if not ids:
        raise RequestError("input_ids cannot be empty.")
    return ids


def check_item(spec: ItemSpec, prompt_len: int, context_len: int, vocab_size: int) -> None:
    """SGLang's ``_validate_one_request`` for one item, plus the reference's own refusals."""
    check_context(prompt_len, spec.sampling.get("max_new_tokens"), context_len)
    _check_token_ids_logprob(spec.token_ids_logprob, vocab_size)
    if spec.return_hidden_states:
        raise RequestError(_HIDDEN_STATES)
    if spec.custom_logit_processor:
        raise RequestError(_CUSTOM_LOGIT_PROCESSOR)
    if spec.return_logprob:
        raise RequestError(
            "return_logprob is not supported by the reference server (it computes no logprobs)."
        )


def check_context(prompt_len: int, max_new_tokens: int | None, context_len: int) -> None:
    """The tokenizer manager's two context-length refusals (``tokenizer_manager.py:1307``)."""
    if prompt_len >= context_len:
        raise RequestError(
            f"The input ({prompt_len} tokens) is longer than the model's context length "
            f"({context_len} tokens)."
        )
    if max_new_tokens is not None and max_new_tokens + prompt_len > context_len:
        raise RequestError(
            f"Requested token count exceeds the model's maximum context length of {context_len} tokens. "
            f"You requested a total of {max_new_tokens + prompt_len} tokens: {prompt_len} tokens from the "
            f"input messages and {max_new_tokens} tokens for the completion. Please reduce the number of "
            "tokens in the input messages or the completion to fit within the limit."
        )


def _check_token_ids_logprob(ids: Any, vocab_size: int) -> None:
    if not ids:
        return
    for token_id in ids:
        if not isinstance(token_id, int):
            raise RequestError("token_ids_logprob must be a flat list of integers.")
        if not 0 <= token_id < vocab_size:
            raise RequestError(
                f"token_ids_logprob contains out-of-vocabulary token id {token_id}; "
                f"valid range is [0, {vocab_size})."
            )


@dataclass(frozen=True)
class SchedulerLimits:
    """The scheduler's length limits (``tp_worker.py:568``, ``scheduler.py:2693``)."""

    context_len: int
    max_total_num_tokens: int

    @property
    def max_req_len(self) -> int:
        return min(self.context_len - 1, self.max_total_num_tokens - 1)

    @property
    def max_req_input_len(self) -> int:
        return self.max_req_len - 5

    def clip(self, prompt_len: int, max_new_tokens: int | None) -> int:
        """The effective ``max_new_tokens``: silently clipped to fit the context, never an error."""
        wanted = (1 << 30) if max_new_tokens is None else max_new_tokens
        return max(0, min(wanted, self.max_req_len - prompt_len - 1))

    def refusal(self, prompt_len: int) -> str | None:
        """The scheduler's abort message (status 400) for a prompt it will not run, else None."""
        if prompt_len < self.max_req_input_len:
            return None
        return (
            f"Input length ({prompt_len} tokens) exceeds the maximum allowed length "
            f"({self.max_req_input_len} tokens). Use a shorter input or enable --allow-auto-truncate."
        )


# --- sampling_params (srt/sampling/sampling_params.py) ---------------------------------------


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


# --- outputs: stop strings, text trimming, response shapes (§3) ------------------------------


def finish_stop(matched: int | str) -> dict[str, Any]:
    """EOS or a stop id (``int``), a stop string or a stop regex pattern (``str``)."""
    return {"type": "stop", "matched": matched}


def finish_length(length: int) -> dict[str, Any]:
    return {"type": "length", "length": length}


def finish_abort(
    message: str = "Aborted", status_code: int | None = None, err_type: str | None = None
) -> dict[str, Any]:
    """A running generation's abort (``/abort_request``, disconnect, or a scheduler refusal)."""
    return {"type": "abort", "message": message, "status_code": status_code, "err_type": err_type}


def find_stop(
    ids: Sequence[int], sampling: Sampling, decode: Callable[[Sequence[int]], str]
) -> tuple[int, str] | None:
    """``(k, matched)`` for the shortest prefix ``ids[:k]`` whose text (special tokens kept, as the
    scheduler decodes) contains a stop string, or else matches a stop regex; None if none does.

    Bisection over prefixes: once a stop appears in a prefix's text it stays in longer ones.
    """

    def first_match(k: int) -> str | None:
        text = decode(ids[:k])
        hit = next((s for s in sampling.stop if s in text), None)
        return hit if hit is not None else next((r for r in sampling.stop_regex if re.search(r, text)), None)

    if not ids or first_match(len(ids)) is None:
        return None
    lo, hi = 1, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if first_match(mid) is None:
            lo = mid + 1
        else:
            hi = mid
    matched = first_match(lo)
    assert matched is not None
    return lo, matched


def output_text(
    ids: Sequence[int],
    finish: Mapping[str, Any] | None,
    sampling: Sampling,
    decode: Callable[[Sequence[int], bool], str],
) -> str:
    """The detokenizer's ``text``: a matched stop token is dropped before decoding, a matched stop
    string cut from the text (both kept with ``no_stop_trim``); ``output_ids`` never change."""
    matched = finish.get("matched") if finish is not None and finish.get("type") == "stop" else None
    if isinstance(matched, int) and not sampling.no_stop_trim and ids:
        ids = ids[:-1]
    text = decode(ids, sampling.skip_special_tokens)
    if isinstance(matched, str) and (pos := text.find(matched)) != -1:
        text = text[: pos + len(matched)] if sampling.no_stop_trim else text[:pos]
    return text


def meta_info(
    rid: str,
    finish: Mapping[str, Any] | None,
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int,
) -> dict[str, Any]:
    """``meta_info`` of a response or stream chunk, keys in SGLang's order (timing keys added by
    the caller: ``e2e_latency`` when finished, ``response_sent_to_client_ts`` on the first send)."""
    return {
        "id": rid,
        "finish_reason": finish,
        "prompt_tokens": prompt_tokens,
        "weight_version": "default",
        "num_retractions": 0,
        "reasoning_tokens": 0,
        "completion_tokens": completion_tokens,
        "cached_tokens": cached_tokens,
        "weight_versions": [{"version": "default", "start": 0, "end": completion_tokens}],
    }


def queued_abort(message: str = "Abort in waiting queue", status_code: int | None = None) -> dict[str, Any]:
    """The finish reason of a generation that never left the queue (aborted, or the queue was full)."""
    finish: dict[str, Any] = {"type": "abort", "message": message}
    if status_code is not None:
        finish["status_code"] = status_code
    return finish


def queued_abort_meta(rid: str, finish: Mapping[str, Any], e2e_latency: float) -> dict[str, Any]:
    """``meta_info`` of a generation that never left the queue (the tokenizer manager's subset)."""
    return {
        "id": rid,
        "finish_reason": finish,
        "weight_version": "default",
        "e2e_latency": e2e_latency,
        "weight_versions": [{"version": "default", "start": 0, "end": 0}],
        "completion_tokens": 0,
    }
