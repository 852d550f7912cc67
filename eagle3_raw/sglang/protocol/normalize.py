"""Gate 3a: SGLang's normalization of a body that passed both gates (``normalize_batch_and_arguments``).

:func:`normalize` turns a body into :class:`Normalized`: single or batch by shape, ``n`` from
``sampling_params``, items in SGLang's dispatch order (prompt-major when ``n > 1``, each sample then
with a fresh uuid rid), the rids registered on arrival; :func:`check_request` and :func:`check_lora`
are the tokenizer manager's request-wide checks that follow (``shared/sglang-protocol.md`` §1.2).
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from eagle3_raw.sglang.protocol.errors import InternalServerError, RequestError


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
        return [Embeds()], True
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


class Embeds(list[int]):
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
