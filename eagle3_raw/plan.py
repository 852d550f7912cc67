"""From conversations to requests: which rows to generate, with which prompt ids and seed.

Planning is deterministic and free of I/O beyond reading the source: the same recipe always plans
the same jobs in the same order, whatever the journal already holds (rows already journaled are
left out, never renumbered). It runs in a worker thread, ahead of the requests.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Iterator, Set
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from eagle3_raw.errors import PromptFormatError, PromptTooLong, RecipeError, RowError
from eagle3_raw.render import generation_points
from eagle3_raw.rows import RowKey, row_id

if TYPE_CHECKING:
    from eagle3_raw.prompts import Conversation
    from eagle3_raw.recipe import Recipe
    from eagle3_raw.render import Renderer

#: RowKey turn/sample of a failure that concerns a whole source row (it has no turns).
WHOLE_ROW = -1


@dataclass(frozen=True)
class Shard:
    """``index`` of ``count``: this process takes the source rows whose index is ``index`` mod ``count``."""

    index: int = 0
    count: int = 1

    @classmethod
    def parse(cls, text: str) -> Shard:
        """``"i/N"`` with 0 <= i < N."""
        match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
        if not match or not int(match[1]) < int(match[2]):
            raise RecipeError("--shard", text, "expected i/N with 0 <= i < N, e.g. 0/4")
        return cls(int(match[1]), int(match[2]))

    def takes(self, index: int) -> bool:
        return index % self.count == self.index

    @property
    def name(self) -> str:
        """The journal file suffix of this shard."""
        return f"{self.index}-of-{self.count}"


@dataclass(frozen=True)
class Job:
    """One request to make: a row's prompt ids and its sampling parameters (seed included)."""

    key: RowKey
    source_id: str
    prompt_ids: list[int]
    sampling_params: dict[str, Any]

    @property
    def row_id(self) -> str:
        return row_id(self.source_id, self.key.turn, self.key.sample)

    @property
    def sampling_seed(self) -> int:
        return int(self.sampling_params["sampling_seed"])


@dataclass(frozen=True)
class Skip:
    """A row that will not be generated, and why (``kind`` is ``skipped`` or ``failed``)."""

    key: RowKey
    row_id: str
    kind: str
    reason: str

    @classmethod
    def from_error(cls, key: RowKey, error: RowError) -> Skip:
        return cls(key, error.row_id, error.kind, error.reason)


@dataclass(frozen=True)
class Limits:
    """What the server accepts: the longest prompt and the context length (None = unknown)."""

    input_limit: int | None = None
    context_length: int | None = None


def derive_seed(seed: int, source_id: str, turn: int, sample: int) -> int:
    """The ``sampling_seed`` of one row: a non-negative int64 from (seed, source id, turn, sample)."""
    digest = hashlib.sha256(f"{seed}\0{source_id}\0{turn}\0{sample}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def plan_jobs(
    conversations: Iterable[Conversation | PromptFormatError],
    renderer: Renderer,
    recipe: Recipe,
    *,
    shard: Shard,
    exclude: Set[RowKey],
    limits: Limits,
) -> Iterator[Job | Skip]:
    """Jobs (and skips) in canonical order for this shard, leaving out the keys in ``exclude``.

    Samples of one prompt and turns of one conversation come out together, so they are sent
    close together and the server's prefix cache hits.
    """
    for item in conversations:
        if isinstance(item, PromptFormatError):
            if shard.takes(item.index):
                yield Skip.from_error(RowKey(item.index, WHOLE_ROW, WHOLE_ROW), item)
            continue
        if shard.takes(item.index):
            yield from _conversation_jobs(item, renderer, recipe, exclude, limits)


def _conversation_jobs(
    conv: Conversation, renderer: Renderer, recipe: Recipe, exclude: Set[RowKey], limits: Limits
) -> Iterator[Job | Skip]:
    samples = recipe.sampling.samples_per_prompt
    points = generation_points(conv.messages, recipe.turns)
    wanted = {p for p in points if any(RowKey(conv.index, p, s) not in exclude for s in range(samples))}
    if points and not wanted:
        return  # every row of this conversation is done: no rendering on a resume
    try:
        turns = renderer.render(conv, only=wanted)
    except PromptFormatError as exc:
        yield Skip.from_error(RowKey(conv.index, WHOLE_ROW, WHOLE_ROW), exc)
        return
    for turn in turns:
        keys = [RowKey(conv.index, turn.turn, s) for s in range(samples)]
        todo = [k for k in keys if k not in exclude]
        too_long = _too_long(len(turn.prompt_ids), limits)
        for key in todo:
            rid = row_id(conv.source_id, key.turn, key.sample)
            if too_long:
                yield Skip.from_error(key, PromptTooLong(too_long, row_id=rid))
            else:
                params = _params(recipe, conv.source_id, key, len(turn.prompt_ids), limits)
                yield Job(key, conv.source_id, turn.prompt_ids, params)


def _too_long(prompt_len: int, limits: Limits) -> str:
    if limits.input_limit is not None and prompt_len > limits.input_limit:
        return f"prompt has {prompt_len} tokens; the server accepts at most {limits.input_limit}"
    return ""


def _params(recipe: Recipe, source_id: str, key: RowKey, prompt_len: int, limits: Limits) -> dict[str, Any]:
    params = recipe.sampling.request_params()
    params["sampling_seed"] = derive_seed(recipe.sampling.seed, source_id, key.turn, key.sample)
    return fit_max_new_tokens(params, prompt_len, limits.context_length)


def fit_max_new_tokens(params: dict[str, Any], prompt_len: int, context_length: int | None) -> dict[str, Any]:
    """``params`` with ``max_new_tokens`` lowered so prompt + output fit ``context_length`` (the
    tokens SGLang allows a request; it refuses more with a 400; the row then ends as ``length``), and
    ``min_new_tokens`` with it (SGLang refuses ``min_new_tokens > max_new_tokens``)."""
    if context_length is None or prompt_len + params["max_new_tokens"] <= context_length:
        return params
    fitted = max(1, context_length - prompt_len)
    return {
        **params,
        "max_new_tokens": fitted,
        "min_new_tokens": min(params.get("min_new_tokens", 0), fitted),
    }
