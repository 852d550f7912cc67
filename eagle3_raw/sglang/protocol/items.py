"""Gate 3b: per-item checks and length limits (``TokenizerManager._tokenize_one_request``,
``_validate_one_request``, the scheduler's limits; ``shared/sglang-protocol.md`` §5).

:func:`prompt_ids` gives an item's token ids, :func:`check_item` refuses what the tokenizer manager
refuses for one item (context length, out-of-vocabulary ``token_ids_logprob``, features the reference
cannot honour), and :class:`SchedulerLimits` holds what the scheduler does later: abort a prompt
that is too long (400) and silently clip ``max_new_tokens``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from eagle3_raw.sglang.protocol.errors import RequestError
from eagle3_raw.sglang.protocol.normalize import Embeds, ItemSpec

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
    if isinstance(spec.prompt, Embeds):
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
