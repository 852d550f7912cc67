"""The reference server's simulated drafter: SGLang 0.5.23's per-request speculative figures.

Speculative decoding leaves a greedy target's output unchanged, so the reference server generates
exactly the ids it generates without a drafter and only adds what SGLang's tokenizer manager puts
in a finished request's ``meta_info`` when the server runs one
(``managers/tokenizer_manager.py::_calculate_spec_decoding_metrics``):

- ``spec_verify_ct``: verify steps. The first output id comes from the prefill; each verify step
  after it checks ``num_draft_tokens - 1`` drafted ids, accepts the longest correct run of them
  and adds one id of the target's own (the bonus id);
- ``spec_num_correct_drafts`` (accepted drafts, bonus ids not counted), ``spec_num_proposed_drafts``
  (``spec_verify_ct * (num_draft_tokens - 1)``), ``spec_accept_rate`` (their ratio),
  ``spec_accept_length`` (``completion_tokens / spec_verify_ct``, bonus ids counted, as SGLang's);
- ``spec_correct_drafts_histogram``: entry ``k`` counts the verify steps that accepted ``k`` drafts.

Whether a drafted id is accepted is a deterministic function of its context: a hash of the id and
the two before it, against a threshold that is ``--draft-acceptance`` scaled by a per-prompt
difficulty (a hash of the prompt ids, from 0.6x to 1.4x). So one drafter setting finds some rows
hard and others easy, reproducibly, and a higher ``--draft-acceptance`` accepts more drafts on
every row. A request with one output id has no verify step, and (as with SGLang) no figures.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

_MASK = (1 << 64) - 1
_UNIT = float(1 << 64)


@dataclass(frozen=True)
class Drafter:
    """A simulated drafter: ``draft_tokens`` per verify step (SGLang's ``speculative_num_draft_tokens``,
    the target's own id included) and how good it is (``acceptance``, in (0, 1])."""

    draft_tokens: int
    acceptance: float

    def __post_init__(self) -> None:
        if self.draft_tokens < 2:
            raise ValueError(f"speculative decoding needs at least 2 draft tokens, got {self.draft_tokens}")
        if not 0 < self.acceptance <= 1:
            raise ValueError(f"--draft-acceptance must be in (0, 1], got {self.acceptance}")

    def figures(self, input_ids: Sequence[int], output_ids: Sequence[int]) -> dict[str, Any]:
        """The figures of one finished generation (empty with fewer than two output ids)."""
        threshold = self.acceptance * (0.6 + 0.8 * _unit(_prompt_hash(input_ids)))
        accepted = _accepted(output_ids, threshold)
        drafts = self.draft_tokens - 1
        histogram = [0] * (drafts + 1)
        position, steps, correct, n = 1, 0, 0, len(output_ids)
        while position < n:
            room = min(drafts, n - position - 1)  # the bonus id needs a place
            run = 0
            while run < room and accepted[position + run]:
                run += 1
            histogram[run] += 1
            steps, correct, position = steps + 1, correct + run, position + run + 1
        if steps == 0:
            return {}
        while histogram[-1] == 0:  # SGLang's list grows to the largest run seen
            histogram.pop()
        proposed = steps * drafts
        return {
            "spec_accept_rate": correct / proposed,
            "spec_accept_length": n / steps,
            "spec_num_correct_drafts": correct,
            "spec_num_proposed_drafts": proposed,
            "spec_verify_ct": steps,
            "spec_correct_drafts_histogram": histogram,
        }


def _accepted(ids: Sequence[int], threshold: float) -> list[bool]:
    """Per output position, whether a draft of that id is accepted: a hash of the id and the two
    before it (-1 before the first) against ``threshold``; computed for all positions at once."""
    values = np.asarray(ids, dtype=np.uint64)
    before = np.concatenate([np.full(2, _MASK, np.uint64), values])  # -1 as 64 bits
    with np.errstate(over="ignore"):  # the products wrap modulo 2^64 on purpose
        context = (
            before[:-2] * np.uint64(0x9E3779B97F4A7C15)
            ^ before[1:-1] * np.uint64(0xC2B2AE3D27D4EB4F)
            ^ values
        )
        z = context ^ (context >> np.uint64(30))  # splitmix64's finalizer: well-mixed 64 bits
        z = z * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z.astype(np.float64) / _UNIT < threshold).tolist()  # type: ignore[no-any-return]


def _prompt_hash(ids: Sequence[int]) -> int:
    return int.from_bytes(hashlib.blake2b(array("q", ids).tobytes(), digest_size=8).digest(), "little")


def _unit(value: int) -> float:
    return value / _UNIT
