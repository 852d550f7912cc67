"""Gate 1: FastAPI/pydantic parsing of ``GenerateReqInput``, and :func:`parse_body` (gates 1 and 2).

FastAPI refuses a body that is missing, is not JSON, or has a top-level field of the wrong JSON
type, before SGLang sees it: :class:`~.errors.GateError` with FastAPI's 400 validation body
(``{"object": "error", ..., "type": "Bad Request"}``). pydantic is lax here ("1", "yes", 1.0 pass
as bools and ints); only the fields SGLang types are checked, other keys pass through.
"""

from __future__ import annotations

import re
from array import array
from collections.abc import Callable
from typing import Any

import orjson

from eagle3_raw.sglang.protocol.contract import check_contract
from eagle3_raw.sglang.protocol.errors import GateError, validation_error

Accepts = Callable[[Any], bool]

_DICT, _INT = "Input should be a valid dictionary", "Input should be a valid integer"
_STR, _BOOL = "Input should be a valid string", "Input should be a valid boolean"
_BOOL_WORDS = frozenset({"0", "off", "f", "false", "n", "no", "1", "on", "t", "true", "y", "yes"})


def parse_body(raw: bytes) -> Any:
    """The raw ``/generate`` body through gates 1 and 2 (field types, then the JSON contract)."""
    if not raw:
        raise missing_body()
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise json_error() from exc
    check_fields(body)
    check_contract(body)
    return body


def json_error() -> GateError:
    """The 400 FastAPI sends for a body that is not JSON at all."""
    return validation_error("json_invalid", (0,), "JSON decode error", {})


def missing_body() -> GateError:
    """The 400 FastAPI sends for an empty body."""
    return validation_error("missing", (), "Field required", None)


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


def _is_str(v: Any) -> bool:
    return isinstance(v, str)


def _is_dict(v: Any) -> bool:
    return isinstance(v, dict)


def _optional(ok: Accepts) -> Accepts:
    return lambda v: v is None or ok(v)


def _one_or_many(ok: Accepts) -> Accepts:
    return lambda v: v is None or ok(v) or (isinstance(v, list) and all(map(ok, v)))


def _int_rows(v: Any) -> bool:
    return isinstance(v, list) and all(
        _lax_int(x) or (isinstance(x, list) and all(map(_lax_int, x))) for x in v
    )


_FIELD_TYPES: dict[str, tuple[Accepts, str, str]] = {
    "text": (_one_or_many(_is_str), "string_type", _STR),
    "rid": (_one_or_many(_is_str), "string_type", _STR),
    "sampling_params": (_one_or_many(_is_dict), "dict_type", _DICT),
    "stream": (_lax_bool, "bool_parsing", f"{_BOOL}, unable to interpret input"),
    "return_text_in_logprobs": (_lax_bool, "bool_parsing", _BOOL),
    "return_prompt_token_ids": (_lax_bool, "bool_parsing", _BOOL),
    "return_logprob": (_one_or_many(_lax_bool), "bool_parsing", _BOOL),
    "logprob_start_len": (_one_or_many(_lax_int), "int_parsing", _INT),
    "top_logprobs_num": (_one_or_many(_lax_int), "int_parsing", _INT),
    "token_ids_logprob": (_optional(_int_rows), "list_type", "Input should be a valid list"),
    "priority": (_optional(_lax_int), "int_parsing", _INT),
    "routed_dp_rank": (_optional(_lax_int), "int_parsing", _INT),
    "data_parallel_rank": (_optional(_lax_int), "int_parsing", _INT),
    "session_params": (_optional(_is_dict), "dict_type", _DICT),
}
"""The typed fields of ``GenerateReqInput``: (accepts, pydantic's error type, its message)."""


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
