"""From conversations to requests: which rows to generate, with which prompt ids and seed, and which
the journal already holds.

Planning is deterministic: the same recipe and target always plan the same rows in the same order.
For each row (a conversation's generation point and a sample) it decides, cheapest first:

1. done in this set (its key has an outcome): nothing at all;
2. its input key (:func:`eagle3_raw.identity.input_key`) led to a request journaled before, for
   any set: :class:`Reuse`, without rendering;
3. rendered, its request's digest is journaled (another recipe made the identical request):
   :class:`Reuse`, remembering the input key for next time;
4. otherwise a :class:`Job` to send, or a :class:`Skip` (a prompt too long for the server).

It runs in a worker thread, ahead of the requests; samples of one prompt and turns of one
conversation come out together, so they are sent close together and the server's prefix cache hits.
"""

from __future__ import annotations

import bisect
import hashlib
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from eagle3_raw.errors import PromptFormatError, PromptTooLong, RecipeError, RowError
from eagle3_raw.identity import conversation_digest, input_context, input_key, request_digest
from eagle3_raw.render import generation_points
from eagle3_raw.rows import RowKey, row_id

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from eagle3_raw.identity import Target
    from eagle3_raw.journal.generations import GenerationIndex
    from eagle3_raw.prompts import Conversation
    from eagle3_raw.recipe import Recipe
    from eagle3_raw.render import Renderer

#: RowKey turn/sample of a failure that concerns a whole source row (it has no turns).
WHOLE_ROW = -1
MAX_TURN = 4094
"""The last message position a row can be generated at (the journal packs turns into 12 bits)."""


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
    """One request to make: a row's prompt ids and sampling parameters (seed included), and the
    digests that identify it (``input_key``: what decided it; ``digest``: the request itself)."""

    key: RowKey
    source_id: str
    prompt_ids: list[int]
    sampling_params: dict[str, Any]
    input_key: bytes
    digest: bytes

    @property
    def row_id(self) -> str:
        return row_id(self.source_id, self.key.turn, self.key.sample)

    @property
    def sampling_seed(self) -> int:
        return int(self.sampling_params["sampling_seed"])


@dataclass(frozen=True)
class Reuse:
    """A row whose generation is journaled already (``alias``: the input key to remember it by)."""

    key: RowKey
    source_id: str
    sampling_seed: int
    digest: bytes
    alias: bytes | None = None

    @property
    def row_id(self) -> str:
        return row_id(self.source_id, self.key.turn, self.key.sample)


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


Planned = Job | Reuse | Skip


@dataclass(frozen=True)
class Limits:
    """What the server accepts: the longest prompt and the context length (None = unknown)."""

    input_limit: int | None = None
    context_length: int | None = None


class KeySet:
    """Row keys as a sorted array of packed int64s (:func:`~eagle3_raw.journal.pack_key`): 8 bytes
    a key. The planner asks in key order, so a lookup bisects a slice of the keys at or after the
    last one asked (a list of 256 ints, reloaded as the keys move on): ~0.7 µs, where a numpy
    binary search per key took ~4 µs (4 s per million rows of a resume)."""

    _SLICE = 256

    def __init__(self, packed: npt.NDArray[np.int64]) -> None:
        self._packed = packed
        self._slice: list[int] = []
        self._covers = (1, 0)  # the values whose keys are all in the slice (none yet)

    def __len__(self) -> int:
        return len(self._packed)

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, RowKey):
            return False
        value = (key.index << 24) | ((key.turn + 1) << 12) | (key.sample + 1)  # pack_key, inlined
        if not self._covers[0] <= value <= self._covers[1]:
            self._load(value)
        keys = self._slice
        at = bisect.bisect_left(keys, value)
        return at < len(keys) and keys[at] == value

    def _load(self, value: int) -> None:
        """The slice of keys from ``value`` on: every key up to its last, or to the end of the set."""
        import numpy as np

        start = int(np.searchsorted(self._packed, value))
        self._slice = self._packed[start : start + self._SLICE].tolist()
        last = start + self._SLICE >= len(self._packed)
        self._covers = (value, 1 << 63 if last else self._slice[-1])


def derive_seed(seed: int, source_id: str, turn: int, sample: int) -> int:
    """The ``sampling_seed`` of one row: a non-negative int64 from (seed, source id, turn, sample)."""
    digest = hashlib.sha256(f"{seed}\0{source_id}\0{turn}\0{sample}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


class Planner:
    """Plans a recipe's rows against a target and what the journal holds (see the module docstring)."""

    def __init__(
        self, recipe: Recipe, renderer: Renderer, target: Target, *, shard: Shard, exclude: KeySet,
        index: GenerationIndex,
    ) -> None:  # fmt: skip
        self.recipe = recipe
        self.renderer = renderer
        self.target = target
        self.shard = shard
        self.exclude = exclude
        self.index = index
        self.limits = Limits(target.input_limit, target.token_budget)
        self._context = input_context(recipe, target)

    def plan(self, conversations: Iterable[Conversation | PromptFormatError]) -> Iterator[Planned]:
        """Jobs, reuses and skips in canonical order for this shard, leaving out excluded keys."""
        for item in conversations:
            if not self.shard.takes(item.index):
                continue
            if isinstance(item, PromptFormatError):
                yield Skip.from_error(RowKey(item.index, WHOLE_ROW, WHOLE_ROW), item)
            else:
                yield from self._conversation(item)

    def _conversation(self, conv: Conversation) -> Iterator[Planned]:
        samples = range(self.recipe.sampling.samples_per_prompt)
        keys = [
            RowKey(conv.index, point, s)
            for point in generation_points(conv.messages, self.recipe.turns)
            for s in samples
        ]
        keys = [k for k in keys if k not in self.exclude]
        if not keys:
            return  # every row of this conversation is done: no hashing, no rendering
        digest = conversation_digest(conv)
        planned: dict[RowKey, Planned] = {}
        pending: dict[RowKey, bytes] = {}
        for key in keys:
            memo_key = input_key(self._context, digest, conv.source_id, key.turn, key.sample)
            found = self.index.memo(memo_key)
            if found is not None:
                planned[key] = Reuse(key, conv.source_id, self._seed(conv, key), found)
            else:
                pending[key] = memo_key
        if pending:
            planned.update(self._rendered(conv, pending))
        for key in sorted(planned):
            yield planned[key]

    def _rendered(self, conv: Conversation, pending: dict[RowKey, bytes]) -> Iterator[tuple[RowKey, Planned]]:
        too_deep = {k for k in pending if k.turn > MAX_TURN}
        for key in sorted(too_deep):
            reason = f"message {key.turn} is past the last position a row can start at ({MAX_TURN})"
            yield key, Skip.from_error(key, PromptFormatError(reason, row_id=self._id(conv, key)))
        try:
            turns = self.renderer.render(conv, only={k.turn for k in pending if k not in too_deep})
        except PromptFormatError as exc:
            whole = RowKey(conv.index, WHOLE_ROW, WHOLE_ROW)
            yield whole, Skip.from_error(whole, exc)
            return
        prompts = {turn.turn: turn.prompt_ids for turn in turns}
        for key, memo_key in pending.items():
            if key.turn in prompts:
                yield key, self._job_or_reuse(conv, key, prompts[key.turn], memo_key)

    def _job_or_reuse(
        self, conv: Conversation, key: RowKey, prompt_ids: list[int], memo_key: bytes
    ) -> Planned:
        too_long = _too_long(len(prompt_ids), self.limits)
        if too_long:
            return Skip.from_error(key, PromptTooLong(too_long, row_id=self._id(conv, key)))
        params = self._params(conv, key, len(prompt_ids))
        digest = request_digest(self.target, prompt_ids, params)
        if self.index.locate(digest) is not None:
            return Reuse(key, conv.source_id, params["sampling_seed"], digest, alias=memo_key)
        return Job(key, conv.source_id, prompt_ids, params, memo_key, digest)

    def _seed(self, conv: Conversation, key: RowKey) -> int:
        return derive_seed(self.recipe.sampling.seed, conv.source_id, key.turn, key.sample)

    def _id(self, conv: Conversation, key: RowKey) -> str:
        return row_id(conv.source_id, key.turn, key.sample)

    def _params(self, conv: Conversation, key: RowKey, prompt_len: int) -> dict[str, Any]:
        params = self.recipe.sampling.request_params()
        params["sampling_seed"] = self._seed(conv, key)
        return fit_max_new_tokens(params, prompt_len, self.limits.context_length)


def _too_long(prompt_len: int, limits: Limits) -> str:
    if limits.input_limit is not None and prompt_len > limits.input_limit:
        return f"prompt has {prompt_len} tokens; the server accepts at most {limits.input_limit}"
    return ""


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
