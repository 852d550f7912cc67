"""From conversations to requests: which rows to generate, with which prompt ids and seed, and which
the journal already holds.

Planning is deterministic: the same recipe and target always plan the same rows in the same order.
A source row whose every row key has an outcome is not even read on a resume: the planner records
each row's number of keys as it plans it (:mod:`eagle3_raw.journal.plans`). For each row (a
conversation's generation point and a sample) it decides, cheapest first:

1. done in this set (its key has an outcome): nothing at all;
2. its input key (:func:`eagle3_raw.identity.input_key`) led to a request journaled before, for
   any set: :class:`Reuse`, without rendering;
3. rendered, its request's digest is journaled (another recipe made the identical request):
   :class:`Reuse`, remembering the input key for next time;
4. otherwise a :class:`Job` to send, or a :class:`Skip` (a prompt too long for the server).

Rendering happens here (in the planner's thread) when the prompts render locally; when the server
renders them, step 3 waits: the planner hands out a :class:`Pending` generation point, a worker
asks the server's chat path for its prompt, and :meth:`Planner.resolve` finishes the decision.

With ``turns: rollout`` a conversation's sample is one :class:`Rollout` instead, planned whole
(its turns depend on each other: :mod:`eagle3_raw.run.rollout` makes them), stopping before a turn
that failed until ``--retry-failed``. A sampling mixture's component (:mod:`eagle3_raw.run.mixture`)
shapes every request and render of a conversation's sample.

It runs in a worker thread, ahead of the requests; samples of one prompt and turns of one
conversation come out together, so they are sent close together and the server's prefix cache hits.
"""

from __future__ import annotations

import bisect
import hashlib
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from eagle3_raw.errors import PromptFormatError, PromptTooLong, RecipeError, RowError
from eagle3_raw.identity import conversation_digest, input_context, input_key, request_digest
from eagle3_raw.limits import MAX_SHARDS
from eagle3_raw.rows import PassOver, RowKey, id_hash, row_id
from eagle3_raw.run.mixture import draw, recorded
from eagle3_raw.run.render import generation_points

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from eagle3_raw.identity import Target
    from eagle3_raw.journal.generations import GenerationIndex
    from eagle3_raw.journal.plans import PlanLog
    from eagle3_raw.recipe import Recipe
    from eagle3_raw.run.mixture import Choice
    from eagle3_raw.run.render import Renderer
    from eagle3_raw.source.prompts import Conversation

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
        match = re.fullmatch(r"\s*(\d{1,9})\s*/\s*(\d{1,9})\s*", text)
        if not match or not int(match[1]) < int(match[2]):
            raise RecipeError("--shard", text, "expected i/N with 0 <= i < N, e.g. 0/4")
        if int(match[2]) > MAX_SHARDS:
            raise RecipeError("--shard", text, f"expected at most {MAX_SHARDS:,} shards")
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
    digests that identify it (``input_key``: what decided it; ``digest``: the request itself).
    ``mixture``: the row's mixture column (:func:`eagle3_raw.run.mixture.recorded`)."""

    key: RowKey
    source_id: str
    prompt_ids: list[int]
    sampling_params: dict[str, Any]
    input_key: bytes
    digest: bytes
    mixture: dict[str, Any] | None = None

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
    mixture: dict[str, Any] | None = None

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


@dataclass(frozen=True)
class Pending:
    """The rows of one generation point whose prompt the server's chat path renders first
    (``keys``: each row's key and input key, in order; ``choice``: their mixture component)."""

    conv: Conversation
    turn: int
    keys: tuple[tuple[RowKey, bytes], ...]
    choice: Choice | None = None

    @property
    def key(self) -> RowKey:
        return self.keys[0][0]

    @property
    def rows(self) -> int:
        return len(self.keys)


@dataclass(frozen=True)
class Rollout:
    """One conversation's sample to roll out turn by turn (:mod:`eagle3_raw.run.rollout`).

    ``points``: its generation points up to the last one this run has to make; ``missing``: those
    without an outcome in the set (the others are journaled and re-derived, never asked again).
    """

    conv: Conversation
    sample: int
    points: tuple[int, ...]
    missing: frozenset[int]
    choice: Choice | None = None

    @property
    def key(self) -> RowKey:
        return RowKey(self.conv.index, self.points[0], self.sample)

    @property
    def rows(self) -> int:
        return len(self.missing)


Planned = Job | Reuse | Skip | Pending | Rollout


def planned_rows(item: Planned) -> int:
    """How many row keys ``item`` gives an outcome."""
    return item.rows if isinstance(item, Pending | Rollout) else 1


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
        index: GenerationIndex, failed: KeySet | None = None,
        plans: PlanLog | None = None, passed: PassOver | None = None,
    ) -> None:  # fmt: skip
        """``target.render`` decides who renders: ``local`` here, ``server`` through :class:`Pending`.
        ``exclude``: keys with an outcome not to redo; ``failed``: those among them that failed (a
        rollout stops before a failed turn until ``--retry-failed``). ``plans`` records each source
        row's number of row keys as it is planned; ``passed``: the source rows found done by them,
        which the source reader leaves out (:func:`~eagle3_raw.source.prompts.iter_conversations`)."""
        self.plans = plans
        self.passed = passed
        self.recipe = recipe
        self.failed = failed or KeySet(_empty_keys())
        self.renderer = renderer
        self.render_here = target.render == "local"
        self.target = target
        self.shard = shard
        self.exclude = exclude
        self.index = index
        self.limits = Limits(target.input_limit, target.token_budget)
        self.context = input_context(recipe, target)

    def plan(self, conversations: Iterable[Conversation | PromptFormatError]) -> Iterator[Planned]:
        """Jobs, reuses and skips in canonical order for this shard, leaving out excluded keys."""
        for item in conversations:
            if not self.shard.takes(item.index):
                continue
            if isinstance(item, PromptFormatError):
                if self.plans is not None:
                    self.plans.add(item.index, 0, 1)  # its one key: the whole row's
                yield Skip.from_error(RowKey(item.index, WHOLE_ROW, WHOLE_ROW), item)
                continue
            points = generation_points(item.messages, self.recipe.turns)
            if self.plans is not None:
                keys = len(points) * self.recipe.sampling.samples_per_prompt
                self.plans.add(item.index, id_hash(item.source_id), keys)
            yield from self._conversation(item, points)
        if self.plans is not None:
            self.plans.flush()  # the plan is exhausted: a kill from now on loses none of it

    def _conversation(self, conv: Conversation, points: list[int]) -> Iterator[Planned]:
        if self.recipe.turns == "rollout":
            yield from self._rollouts(conv, points)
            return
        samples = range(self.recipe.sampling.samples_per_prompt)
        keys = [RowKey(conv.index, point, s) for point in points for s in samples]
        keys = [k for k in keys if k not in self.exclude]
        if not keys:
            return  # every row of this conversation is done: no hashing, no rendering
        digest = conversation_digest(conv)
        planned: dict[RowKey, Planned] = {}
        pending: dict[RowKey, bytes] = {}
        for key in keys:
            memo_key = input_key(self.context, digest, conv.source_id, key.turn, key.sample)
            found = self.index.memo(memo_key)
            if found is not None:
                mixture = recorded(self.choice(conv, key.sample))
                planned[key] = Reuse(key, conv.source_id, self.seed(conv, key), found, mixture=mixture)
            else:
                pending[key] = memo_key
        for key in [k for k in pending if k.turn > MAX_TURN]:
            reason = f"message {key.turn} is past the last position a row can start at ({MAX_TURN})"
            planned[key] = Skip.from_error(key, PromptFormatError(reason, row_id=self._id(conv, key)))
            del pending[key]
        if pending and self.render_here:
            planned.update(self._rendered(conv, pending))
        elif pending:
            planned.update(_pending_points(conv, pending, self.choice))
        for key in sorted(planned):
            yield planned[key]

    def _rollouts(self, conv: Conversation, points: list[int]) -> Iterator[Planned]:
        """One :class:`Rollout` per sample with a turn still to make (points past :data:`MAX_TURN`
        are skipped), stopping before a turn that failed."""
        for sample in range(self.recipe.sampling.samples_per_prompt):
            keys = [RowKey(conv.index, p, sample) for p in points]
            blocked = next((i for i, k in enumerate(keys) if k in self.failed), len(keys))
            missing = [k for k in keys[:blocked] if k not in self.exclude]
            for key in [k for k in missing if k.turn > MAX_TURN]:
                reason = f"message {key.turn} is past the last position a row can start at ({MAX_TURN})"
                yield Skip.from_error(key, PromptFormatError(reason, row_id=self._id(conv, key)))
            missing = [k for k in missing if k.turn <= MAX_TURN]
            if missing:
                last = points.index(missing[-1].turn)
                turns = frozenset(k.turn for k in missing)
                yield Rollout(conv, sample, tuple(points[: last + 1]), turns, self.choice(conv, sample))

    def choice(self, conv: Conversation, sample: int) -> Choice | None:
        """The mixture component ``conv``'s sample ``sample`` is drawn (None without a mixture)."""
        return draw(self.recipe, conv.source_id, sample)

    def resolve(self, pending: Pending, prompt_ids: list[int]) -> list[Planned]:
        """The rows of ``pending`` once the server rendered its prompt (``prompt_ids``)."""
        return [self._job_or_reuse(pending.conv, key, prompt_ids, memo) for key, memo in pending.keys]

    def refuse(self, pending: Pending, reason: str) -> list[Planned]:
        """The rows of ``pending`` skipped: the server's chat path refused the prompt (``reason``)."""
        conv = pending.conv
        message = f"row {conv.source_id!r} turn {pending.turn}: the server's chat path refused it ({reason})"
        return [
            Skip.from_error(key, PromptFormatError(message, row_id=self._id(conv, key)))
            for key, _ in pending.keys
        ]

    def _rendered(self, conv: Conversation, pending: dict[RowKey, bytes]) -> Iterator[tuple[RowKey, Planned]]:
        """Rendered here, each generation point once per mixture component. A point the chat path
        refuses skips its own rows only, as the server's refusal does (:meth:`refuse`): the
        conversation's other points are still rendered."""
        groups: dict[tuple[int, int | None], dict[RowKey, bytes]] = {}
        for key, memo_key in pending.items():
            choice = self.choice(conv, key.sample)
            groups.setdefault((key.turn, choice.index if choice else None), {})[key] = memo_key
        for (turn, _), keys in groups.items():
            try:
                prompt_ids = self.renderer.prompt_ids(
                    conv, turn, choice=self.choice(conv, next(iter(keys)).sample)
                )
            except PromptFormatError as exc:
                for key in keys:
                    yield key, Skip.from_error(key, PromptFormatError(str(exc), row_id=self._id(conv, key)))
                continue
            for key, memo_key in keys.items():
                yield key, self._job_or_reuse(conv, key, prompt_ids, memo_key)

    def _job_or_reuse(
        self, conv: Conversation, key: RowKey, prompt_ids: list[int], memo_key: bytes
    ) -> Planned:
        too_long = self.too_long(len(prompt_ids), row=self._id(conv, key))
        if too_long:
            return Skip.from_error(key, PromptTooLong(too_long, row_id=self._id(conv, key)))
        choice = self.choice(conv, key.sample)
        params = self.params(conv, key, len(prompt_ids), choice)
        digest = request_digest(self.target, prompt_ids, params)
        mixture = recorded(choice)
        if self.index.locate(digest) is not None:
            return Reuse(
                key, conv.source_id, params["sampling_seed"], digest, alias=memo_key, mixture=mixture
            )
        return Job(key, conv.source_id, prompt_ids, params, memo_key, digest, mixture)

    def seed(self, conv: Conversation, key: RowKey) -> int:
        return derive_seed(self.recipe.sampling.seed, conv.source_id, key.turn, key.sample)

    def _id(self, conv: Conversation, key: RowKey) -> str:
        return row_id(conv.source_id, key.turn, key.sample)

    def params(
        self, conv: Conversation, key: RowKey, prompt_len: int, choice: Choice | None
    ) -> dict[str, Any]:
        """The ``sampling_params`` of row ``key``: the recipe's (with its mixture component's), its
        seed, ``max_new_tokens`` fitted to the context."""
        params = self.recipe.sampling.request_params(choice.component if choice is not None else None)
        params["sampling_seed"] = self.seed(conv, key)
        return fit_max_new_tokens(params, prompt_len, self.limits.context_length)

    def too_long(self, prompt_len: int, *, row: str) -> str:
        """Why row ``row``'s prompt of ``prompt_len`` ids cannot be sent, naming the row ("" when it can)."""
        return _too_long(prompt_len, self.limits, row)


def _pending_points(
    conv: Conversation, pending: dict[RowKey, bytes], choose: Callable[[Conversation, int], Choice | None]
) -> Iterator[tuple[RowKey, Planned]]:
    """One :class:`Pending` per generation point and mixture component, placed at its first row."""
    groups: dict[tuple[int, int | None], list[tuple[RowKey, bytes]]] = {}
    for key in sorted(pending):
        choice = choose(conv, key.sample)
        groups.setdefault((key.turn, choice.index if choice else None), []).append((key, pending[key]))
    for (turn, _), keys in groups.items():
        yield keys[0][0], Pending(conv, turn, tuple(keys), choose(conv, keys[0][0].sample))


def _empty_keys() -> npt.NDArray[np.int64]:
    import numpy as np

    return np.empty(0, np.int64)


def _too_long(prompt_len: int, limits: Limits, row: str) -> str:
    # the row's own numbers stay in the parentheses: unmade.reason_group counts such rows as one reason
    if limits.input_limit is not None and prompt_len > limits.input_limit:
        return (
            f"row {row} ({prompt_len:,} prompt tokens): prompt too long, the server accepts at most "
            f"{limits.input_limit:,} tokens"
        )
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
