"""SGLang 0.5.23's ``/generate`` request path, re-implemented without SGLang: gates, normalization,
sampling defaults and validation, length limits, outcomes, and the three error body shapes.

A request meets, in SGLang's order (``shared/sglang-protocol.md`` §1, §2, §5):

1. FastAPI/pydantic parsing of ``GenerateReqInput`` (:mod:`.fields`, :func:`check_fields`): malformed
   JSON or a top-level field of the wrong JSON type → :class:`GateError`, 400 ``{"object": "error", ...}``.
2. The JSON contract ``GenerateRequest`` of ``sglang/api/v1/api_types.py`` (:mod:`.contract`,
   :func:`check_contract`): unknown sampling keys, wrong types → :class:`GateError`, 400
   ``{"error": "<text>"}`` with the contract's own wording. :func:`parse_body` runs gates 1 and 2.
3. Normalization (:mod:`.normalize`), per-item checks (:mod:`.items`) and ``sampling_params``
   (:mod:`.sampling`) → :class:`RequestError` (SGLang's ``ValueError``), 400
   ``{"error": {"message": ...}}`` or, on a stream, one SSE error event.

Where SGLang itself would crash (an ``IndexError``, ``TypeError``...), :class:`InternalServerError`
stands for its plain-text 500 (:mod:`.errors`). Features the reference cannot honour (logprobs,
grammars, beam search, logit bias, watermarks) are refused with a :class:`RequestError` naming the
reference server, never silently ignored. :mod:`.outputs` shapes what comes back: finish reasons,
stop matching, the trimmed ``text`` and ``meta_info``; :mod:`.cadence` when a stream sends a chunk.

Nothing here does I/O: the server (:mod:`eagle3_raw.reference.server`) calls these in order.
"""

from eagle3_raw.sglang.protocol.cadence import Held, chunk_lengths, never_held, stop_prefix_hold
from eagle3_raw.sglang.protocol.contract import check_contract
from eagle3_raw.sglang.protocol.errors import (
    GateError,
    InternalServerError,
    RequestError,
    error_object,
    http_exception_body,
    stream_error_event,
    validation_error,
    value_error_body,
)
from eagle3_raw.sglang.protocol.fields import check_fields, json_error, missing_body, parse_body
from eagle3_raw.sglang.protocol.items import SchedulerLimits, check_context, check_item, prompt_ids
from eagle3_raw.sglang.protocol.normalize import (
    ItemSpec,
    Normalized,
    check_lora,
    check_request,
    normalize,
)
from eagle3_raw.sglang.protocol.outputs import (
    NGRAM_DEFAULTS,
    QUEUE_FULL,
    find_stop,
    finish_abort,
    finish_length,
    finish_stop,
    meta_info,
    output_text,
    queued_abort,
    queued_abort_meta,
)
from eagle3_raw.sglang.protocol.sampling import TOP_K_ALL, Sampling, parse_sampling

__all__ = [
    "NGRAM_DEFAULTS",
    "QUEUE_FULL",
    "TOP_K_ALL",
    "GateError",
    "Held",
    "InternalServerError",
    "ItemSpec",
    "Normalized",
    "RequestError",
    "Sampling",
    "SchedulerLimits",
    "check_context",
    "check_contract",
    "check_fields",
    "check_item",
    "check_lora",
    "check_request",
    "chunk_lengths",
    "error_object",
    "find_stop",
    "finish_abort",
    "finish_length",
    "finish_stop",
    "http_exception_body",
    "json_error",
    "meta_info",
    "missing_body",
    "never_held",
    "normalize",
    "output_text",
    "parse_body",
    "parse_sampling",
    "prompt_ids",
    "queued_abort",
    "queued_abort_meta",
    "stop_prefix_hold",
    "stream_error_event",
    "validation_error",
    "value_error_body",
]
