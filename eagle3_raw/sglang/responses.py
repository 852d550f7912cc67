"""The checks a ``/generate`` response passes before it can become a row.

Everything journaled from a response is checked here first, so nothing a server sends can put a
row in the journal that the Arrow conversion, a resume or ``merge`` would choke on
(``shared/sglang-protocol.md`` §3, §10, §14.4):

- ``finish_reason`` is ``stop`` or ``length`` (``abort`` is :class:`GenerationAborted`), with
  ``matched`` an int id, a list of them, a string or null, and ``length`` an int or null;
- ``output_ids`` are int64s (never booleans: JSON ``true`` is not an id) inside the vocabulary, at
  most the ``max_new_tokens`` sent, as many as ``completion_tokens``; the prompt is not echoed;
- with ``finish_reason`` stop on a token id, that id is the last output id (ids after it: a
  speculative-decoding server that overshot its stop, sglang#31599);
- no stop token before the last position: SGLang stops at the first id of its EOS set (the model's
  EOS ids, the ``stop_token_ids`` sent, and the id the server says it stopped on) unless
  ``ignore_eos`` was sent, so an answer that goes on after one teaches a drafter to go on after
  the end (the caller passes ``stop_ids``, empty with ``ignore_eos``);
- ``prompt_tokens`` is there and equals the ids sent (a server that truncates prompts is refused for
  the row; one that does not say is a bad response);
- the meta kept for the row (:data:`KEPT_META`) has the type of its column: ints within int32,
  finite non-negative latency, a short string; ``text`` (the server's decode) is a string or null;
- a speculating server's figures (:data:`~eagle3_raw.sglang.protocol.outputs.SPEC_KEYS`), when
  there: counts are int32s, the rate and length finite numbers >= 0, the histogram a short list of
  int32 counts, and they agree with each other (the histogram's steps are ``spec_verify_ct``, its
  accepted drafts ``spec_num_correct_drafts``, no more than proposed).

A failed check is :class:`InvalidResponse` (retried, then recorded as failed; never a row).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

import numpy
import numpy.typing

from eagle3_raw.errors import GenerationAborted, InvalidResponse, RequestRejected
from eagle3_raw.idchecks import check_ids, check_no_early_stop
from eagle3_raw.printable import printable
from eagle3_raw.redact import public_url
from eagle3_raw.serving import Generation
from eagle3_raw.sglang.protocol.outputs import SPEC_KEYS

INT32_MAX = 2**31 - 1
TEXT_CHARS = 256
"""The longest string kept in a row's meta (``weight_version``)."""

KEPT_META = (
    "prompt_tokens", "completion_tokens", "cached_tokens", "e2e_latency", "weight_version", *SPEC_KEYS,
)  # fmt: skip
"""The ``meta_info`` keys a row keeps (with ``endpoint``, ``max_new_tokens`` and ``attempts``)."""

HISTOGRAM_MAX = 1024
"""The longest ``spec_correct_drafts_histogram`` kept (one entry per accepted-draft count: SGLang's
draft tokens per step are far fewer)."""


def check_response(
    result: Mapping[str, Any],
    input_ids: Sequence[int],
    vocab_size: int,
    url: str,
    max_new_tokens: int | None = None,
    *,
    payload: bytes | None = None,
    stop_ids: frozenset[int] | None = frozenset(),
) -> Generation:
    """Check one response object against what was sent; see the module docstring.

    ``payload``, the body ``result`` was decoded from, lets the boolean check be skipped when the
    body holds no ``true``/``false`` at all (a scan in C instead of a look at every id).
    ``stop_ids``: the ids the server stops at (its model's EOS ids and the ``stop_token_ids`` sent;
    the id it reports stopping on is added), None when ``ignore_eos`` was sent (no id stops it).
    """
    meta = result.get("meta_info")
    output_ids = result.get("output_ids")
    if not isinstance(meta, dict) or not isinstance(output_ids, list):
        raise InvalidResponse(f"response from {url} lacks output_ids or meta_info", url=url)
    finish = _finish_reason(meta, url)
    if max_new_tokens is not None and len(output_ids) > max_new_tokens:
        raise InvalidResponse(
            f"{url} returned {len(output_ids):,} output ids for max_new_tokens={max_new_tokens}", url=url
        )
    kept = _kept_meta(meta, url)
    _check_counts(kept, output_ids, len(input_ids), url)
    values = check_ids(
        output_ids, vocab_size, url, maybe_bools=payload is None or b"true" in payload or b"false" in payload
    )
    if len(input_ids) > 1 and output_ids[: len(input_ids)] == list(input_ids):
        raise InvalidResponse(f"response from {url} echoes the prompt in output_ids", url=url)
    _check_stop(meta["finish_reason"], output_ids, url)
    if stop_ids is not None:
        _check_no_early_stop(meta["finish_reason"], values, stop_ids, url)
    text = result.get("text")
    if text is not None and not isinstance(text, str):
        shown = printable(repr(text), limit=80)
        raise InvalidResponse(f"{url}: text is {shown}; expected a string or null", url=url)
    return Generation(output_ids, finish, {**kept, "endpoint": public_url(url)}, text)


def _finish_reason(meta: Mapping[str, Any], url: str) -> str:
    finish = meta.get("finish_reason")
    kind = finish.get("type") if isinstance(finish, dict) else None
    if kind == "abort":
        message = finish.get("message", "") if isinstance(finish, dict) else ""
        raise GenerationAborted(f"generation aborted by {url}: {printable(message, limit=500)}", url=url)
    if kind not in ("stop", "length") or not isinstance(finish, dict):
        shown = printable(repr(finish), limit=200)
        raise InvalidResponse(f"unexpected finish_reason {shown} from {url}", url=url)
    matched, length = finish.get("matched"), finish.get("length")
    if not (matched is None or isinstance(matched, str) or _is_int(matched) or _int_list(matched)):
        _bad_type(url, "finish_reason.matched", matched, "an int, a list of ints, a string or null")
    if not (length is None or _is_int(length)):
        _bad_type(url, "finish_reason.length", length, "an int or null")
    return str(kind)


def _kept_meta(meta: Mapping[str, Any], url: str) -> dict[str, Any]:
    """The journaled ``meta_info`` fields, each checked against its column's type."""
    kept = {key: meta.get(key) for key in KEPT_META}
    for key in ("prompt_tokens", "completion_tokens", "cached_tokens"):
        value = kept[key]
        if value is not None and not (_is_int(value) and 0 <= value <= INT32_MAX):
            _bad_type(url, key, value, "an integer from 0 to 2^31-1")
    latency = kept["e2e_latency"]
    if latency is not None and not (_is_number(latency) and latency >= 0):
        _bad_type(url, "e2e_latency", latency, "a finite number >= 0")
    version = kept["weight_version"]
    if version is not None and not (isinstance(version, str) and len(version) <= TEXT_CHARS):
        _bad_type(url, "weight_version", version, f"a string of at most {TEXT_CHARS} characters")
    _check_spec(kept, url)
    return kept


def _check_spec(kept: Mapping[str, Any], url: str) -> None:
    """A speculating server's figures: each of its column's type, and consistent with each other."""
    if all(kept[key] is None for key in SPEC_KEYS):  # no drafter: nothing to check
        return
    for key in ("spec_num_correct_drafts", "spec_num_proposed_drafts", "spec_verify_ct"):
        value = kept[key]
        if value is not None and not (_is_int(value) and 0 <= value <= INT32_MAX):
            _bad_type(url, key, value, "an integer from 0 to 2^31-1")
    for key in ("spec_accept_rate", "spec_accept_length"):
        value = kept[key]
        if value is not None and not (_is_number(value) and value >= 0):
            _bad_type(url, key, value, "a finite number >= 0")
    histogram = kept["spec_correct_drafts_histogram"]
    if histogram is None:
        return
    if not (
        isinstance(histogram, list)
        and len(histogram) <= HISTOGRAM_MAX
        and all(_is_int(n) and 0 <= n <= INT32_MAX for n in histogram)
    ):
        shown = printable(repr(histogram), limit=80)
        raise InvalidResponse(
            f"{url}: meta_info spec_correct_drafts_histogram is {shown}; expected a list of at most "
            f"{HISTOGRAM_MAX} integers from 0 to 2^31-1",
            url=url,
        )
    steps, correct = kept["spec_verify_ct"], kept["spec_num_correct_drafts"]
    if (steps is not None and sum(histogram) != steps) or (
        correct is not None and sum(k * n for k, n in enumerate(histogram)) != correct
    ):
        raise InvalidResponse(
            f"{url}: meta_info spec_correct_drafts_histogram {printable(repr(histogram), limit=80)} does not "
            f"add up to spec_verify_ct={steps} steps and spec_num_correct_drafts={correct} drafts",
            url=url,
        )
    proposed = kept["spec_num_proposed_drafts"]
    if correct is not None and proposed is not None and correct > proposed:
        raise InvalidResponse(
            f"{url}: meta_info spec_num_correct_drafts={correct} exceeds spec_num_proposed_drafts={proposed}",
            url=url,
        )


def _bad_type(url: str, key: str, value: Any, expected: str) -> NoReturn:
    shown = printable(repr(value), limit=80)
    raise InvalidResponse(f"{url}: meta_info {key} is {shown}; expected {expected}", url=url)


def _check_counts(meta: Mapping[str, Any], output_ids: list[Any], prompt_len: int, url: str) -> None:
    if meta["completion_tokens"] != len(output_ids):
        raise InvalidResponse(
            f"{url}: completion_tokens={meta['completion_tokens']} but {len(output_ids)} output_ids", url=url
        )
    prompt_tokens = meta["prompt_tokens"]
    if prompt_tokens is None:
        raise InvalidResponse(
            f"{url}: meta_info has no prompt_tokens (every SGLang /generate answer says how many prompt "
            "tokens it read; without it a truncated prompt cannot be told apart)",
            url=url,
        )
    if prompt_tokens != prompt_len:
        raise RequestRejected(
            f"{url} saw {prompt_tokens} prompt tokens, we sent {prompt_len} "
            "(is the server truncating prompts, e.g. --allow-auto-truncate?)",
            url=url,
        )


def _check_stop(finish: Mapping[str, Any], output_ids: list[int], url: str) -> None:
    """A stop on a token id ends the output: that id is the last one (§14.4)."""
    matched = finish.get("matched")
    if finish.get("type") != "stop" or not (_is_int(matched) or _int_list(matched)):
        return
    stops = matched if isinstance(matched, list) else [matched]
    if not output_ids or output_ids[-1] not in stops:
        last = output_ids[-1] if output_ids else "none"
        raise InvalidResponse(
            f"{url} stopped on token id {matched} but the last output id is {last} (ids after the "
            "stop token are a bad response)",
            url=url,
        )


def _check_no_early_stop(
    finish: Mapping[str, Any], ids: numpy.typing.NDArray[numpy.int64], stop_ids: frozenset[int], url: str
) -> None:
    """No id the server stops at comes before the last position (the server stops at the first)."""
    matched = finish.get("matched")
    candidates = matched if isinstance(matched, list) else [matched]
    stops = stop_ids | {m for m in candidates if isinstance(m, int) and not isinstance(m, bool)}
    check_no_early_stop(ids, stops, url)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_list(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(map(_is_int, value))


def _is_number(value: Any) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)
