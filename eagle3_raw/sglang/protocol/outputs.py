"""What a generation's outcome looks like (``shared/sglang-protocol.md`` §3): finish reasons, where a
stop string or regex ends the output, the detokenizer's trimmed ``text``, and ``meta_info``.

``output_ids`` always run through the stop (stop token included); trimming applies to ``text`` only.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from eagle3_raw.sglang.protocol.sampling import Sampling


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


SPEC_KEYS = (
    "spec_accept_rate",
    "spec_accept_length",
    "spec_num_correct_drafts",
    "spec_num_proposed_drafts",
    "spec_verify_ct",
    "spec_correct_drafts_histogram",
)
"""The per-request speculative figures a finished ``meta_info`` carries when the server runs a
drafter and the request had a verify step, in the order SGLang adds them (after ``e2e_latency``;
``managers/tokenizer_manager.py::_calculate_spec_decoding_metrics``)."""


NGRAM_DEFAULTS = {
    "speculative_ngram_min_bfs_breadth": 1,
    "speculative_ngram_max_bfs_breadth": 10,
    "speculative_ngram_match_type": "BFS",
    "speculative_ngram_max_trie_depth": 18,
    "speculative_ngram_external_corpus_path": None,
}
"""The NGRAM drafter's settings as ``/server_info`` reports them by default, whatever the algorithm
(``srt/arg_groups/fields/spec.py``)."""


def meta_info(
    rid: str,
    finish: Mapping[str, Any] | None,
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int,
    weight_version: str = "default",
) -> dict[str, Any]:
    """``meta_info`` of a response or stream chunk, keys in SGLang's order (timing keys added by
    the caller: ``e2e_latency`` when finished, ``response_sent_to_client_ts`` on the first send)."""
    return {
        "id": rid,
        "finish_reason": finish,
        "prompt_tokens": prompt_tokens,
        "weight_version": weight_version,
        "num_retractions": 0,
        "reasoning_tokens": 0,
        "completion_tokens": completion_tokens,
        "cached_tokens": cached_tokens,
        "weight_versions": [{"version": weight_version, "start": 0, "end": completion_tokens}],
        "cached_tokens_details": None,  # SGLang's: null without --enable-cache-report's tiers
        "dp_rank": None,  # SGLang's: null without data-parallel attention
    }


QUEUE_FULL = "The request queue is full."
"""The message of SGLang's refusal when ``--max-queued-requests`` generations already wait."""


def queued_abort(message: str = "Abort in waiting queue", status_code: int | None = None) -> dict[str, Any]:
    """The finish reason of a generation that never left the queue (aborted, or the queue was full)."""
    finish: dict[str, Any] = {"type": "abort", "message": message}
    if status_code is not None:
        finish["status_code"] = status_code
    return finish


def queued_abort_meta(
    rid: str, finish: Mapping[str, Any], e2e_latency: float, weight_version: str = "default"
) -> dict[str, Any]:
    """``meta_info`` of a generation that never left the queue (the tokenizer manager's subset)."""
    return {
        "id": rid,
        "finish_reason": finish,
        "weight_version": weight_version,
        "e2e_latency": e2e_latency,
        "weight_versions": [{"version": weight_version, "start": 0, "end": 0}],
        "completion_tokens": 0,
    }
