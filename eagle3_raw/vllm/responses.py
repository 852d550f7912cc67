"""The checks a vLLM ``/v1/completions`` answer passes before it can become a row.

What the real vLLM sends is in ``docs/vllm-protocol.md``; everything journaled from an answer is
checked here first:

- one choice; ``finish_reason`` ``stop`` or ``length`` (``abort``, which vLLM answers with a 200,
  is :class:`~eagle3_raw.errors.GenerationAborted`: retried, never a row);
- ``prompt_token_ids`` are there (``return_token_ids`` was sent) and equal the ids sent; a server
  that changed the prompt is refused for the row (``RequestRejected``), one that does not echo it
  is a bad answer;
- ``token_ids`` are int64s inside the vocabulary, at most the ``max_tokens`` sent, as many as
  ``usage.completion_tokens``, and ``usage.prompt_tokens`` is the prompt's length;
- a ``length`` finish with fewer ids than ``max_tokens``: vLLM cut the output at a context shorter
  than the one the request was fitted to (it clips ``max_tokens`` silently), a bad answer;
- ``stop`` on a token id (``stop_reason`` an int) ends with that id; ``stop`` with a null
  ``stop_reason`` (vLLM's EOS stop) ends with one of the model's EOS ids; no id the server stops at
  comes before the last position (unless ``ignore_eos`` was sent);
- ``text`` is a string or null.

A failed check is :class:`~eagle3_raw.errors.InvalidResponse` (retried, then recorded as failed).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from eagle3_raw.errors import GenerationAborted, InvalidResponse, RequestRejected
from eagle3_raw.idchecks import check_ids, check_no_early_stop
from eagle3_raw.printable import printable
from eagle3_raw.redact import public_url
from eagle3_raw.serving import Generation

INT32_MAX = 2**31 - 1


def check_completion(
    result: Mapping[str, Any],
    input_ids: Sequence[int],
    vocab_size: int,
    url: str,
    max_tokens: int | None,
    *,
    eos_ids: frozenset[int],
    stop_ids: frozenset[int] | None,
) -> Generation:
    """Check one ``/v1/completions`` answer against what was sent; see the module docstring.

    ``stop_ids``: the ids the server stops at (the model's EOS ids and the ``stop_token_ids``
    sent), None when ``ignore_eos`` was sent; ``eos_ids`` the model's EOS ids alone.
    """
    choice = _only_choice(result, url)
    finish = _finish_reason(choice, url)
    output_ids, prompt_ids = choice.get("token_ids"), choice.get("prompt_token_ids")
    if not isinstance(output_ids, list) or not isinstance(prompt_ids, list):
        raise InvalidResponse(
            f"{url} returned no token_ids and prompt_token_ids (sent return_token_ids)", url=url
        )
    if prompt_ids != list(input_ids):
        raise RequestRejected(
            f"{url} read {len(prompt_ids)} prompt ids that are not the {len(input_ids)} sent (does it "
            "truncate prompts, e.g. truncate_prompt_tokens?)",
            url=url,
        )
    values = check_ids(output_ids, vocab_size, url)
    if max_tokens is not None and len(output_ids) > max_tokens:
        raise InvalidResponse(f"{url} returned {len(output_ids):,} ids for max_tokens={max_tokens}", url=url)
    if finish == "length" and max_tokens is not None and len(output_ids) < max_tokens:
        raise InvalidResponse(
            f"{url} stopped at length after {len(output_ids)} of max_tokens={max_tokens} ids: it cut the "
            "output at a context shorter than the one it reports (vLLM clips max_tokens silently)",
            url=url,
        )
    _check_usage(result.get("usage"), len(input_ids), len(output_ids), url)
    _check_stop(choice.get("stop_reason"), finish, output_ids, eos_ids, url)
    if stop_ids is not None:
        reason = choice.get("stop_reason")
        extra = {reason} if isinstance(reason, int) and not isinstance(reason, bool) else set()
        check_no_early_stop(values, stop_ids | extra, url)
    text = choice.get("text")
    if text is not None and not isinstance(text, str):
        raise InvalidResponse(f"{url}: text is {printable(repr(text), limit=80)}; expected a string", url=url)
    meta = {"prompt_tokens": len(input_ids), "completion_tokens": len(output_ids),
            "cached_tokens": _cached(result["usage"], url), "endpoint": public_url(url)}  # fmt: skip
    return Generation(output_ids, finish, meta, text)


def _only_choice(result: Mapping[str, Any], url: str) -> Mapping[str, Any]:
    choices = result.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        raise InvalidResponse(f"response from {url} does not hold exactly one choice", url=url)
    return choices[0]


def _finish_reason(choice: Mapping[str, Any], url: str) -> str:
    finish = choice.get("finish_reason")
    if finish == "abort":
        raise GenerationAborted(f"generation aborted by {url} (finish_reason abort)", url=url)
    if finish not in ("stop", "length"):
        shown = printable(repr(finish), limit=200)
        raise InvalidResponse(f"unexpected finish_reason {shown} from {url}", url=url)
    return str(finish)


def _check_usage(usage: Any, prompt_len: int, output_len: int, url: str) -> None:
    if not isinstance(usage, dict):
        raise InvalidResponse(f"response from {url} has no usage", url=url)
    if usage.get("completion_tokens") != output_len:
        raise InvalidResponse(
            f"{url}: completion_tokens={usage.get('completion_tokens')!r} but {output_len} token_ids", url=url
        )
    if usage.get("prompt_tokens") != prompt_len:
        raise RequestRejected(
            f"{url} saw {usage.get('prompt_tokens')!r} prompt tokens, we sent {prompt_len}", url=url
        )


def _check_stop(reason: Any, finish: str, output_ids: list[int], eos_ids: frozenset[int], url: str) -> None:
    """A stop on an id ends the output with it: the ``stop_reason`` id, else (null) an EOS id."""
    if finish != "stop" or isinstance(reason, str):  # a stop string: the text says where
        return
    if reason is not None and not _is_int(reason):
        raise InvalidResponse(f"{url}: stop_reason is {printable(repr(reason), limit=80)}", url=url)
    last = output_ids[-1] if output_ids else None
    if reason is not None and last != reason:
        raise InvalidResponse(f"{url} stopped on token id {reason} but the last output id is {last}", url=url)
    if reason is None and eos_ids and last not in eos_ids:
        raise InvalidResponse(
            f"{url} stopped (stop_reason null: an EOS stop) but the last output id {last} is none of "
            f"the model's EOS ids {sorted(eos_ids)}",
            url=url,
        )


def _cached(usage: Mapping[str, Any], url: str) -> int | None:
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if cached is not None and not (_is_int(cached) and 0 <= cached <= INT32_MAX):
        raise InvalidResponse(f"{url}: cached_tokens is {printable(repr(cached), limit=40)}", url=url)
    return cached


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
