"""The held-out split: which source rows (conversations) are ``validation``, the rest ``train``.

A conversation is assigned whole (every turn and sample of one source row in one split) by a
seeded hash of its ``source_id``: :func:`split_key` is the first 8 bytes of
``sha256(b"eagle3_raw/split/1\\0" + seed + b"\\0" + source_id)`` as an unsigned big-endian integer.

- **A fraction** (``splits.validation: 0.05``, the recommended form): a conversation is held out
  when its key is below ``fraction * 2**64``. Its split depends on its id, the seed and the
  fraction only: growing the source, shuffling it, a limit, a failed row, another shard order
  never move a conversation from one split to the other (without ``prompts.id_column`` the id is a
  content hash: an edited conversation is a new one). The held-out share is ``fraction`` in
  expectation, not exactly (a small source can hold out none: the build then says so).
- **A count** (``splits.validation: 200``): the ``count`` conversations of the set with the lowest
  keys. Exact in size, but not stable under growth: a new conversation whose key is lower than the
  highest held-out one enters ``validation`` and pushes that one back into ``train`` (and a
  conversation that loses every row, or gains its first, moves the boundary the same way).
  Conversations never move from ``train`` to ``validation`` unless a conversation of
  ``validation`` left the set. Every other conversation keeps its split.

Only the reading splits a set: every row is generated once into the journal, whatever its split.
This module is a leaf (the standard library; pyarrow where a table is split).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Literal

if TYPE_CHECKING:  # pyarrow loads where tables are split, not with the recipe
    import pyarrow as pa

TRAIN: Final = "train"
VALIDATION: Final = "validation"
SplitName = Literal["train", "validation"]

_KEY_SPACE: Final = 1 << 64
_DOMAIN: Final = b"eagle3_raw/split/1\0"


@dataclass(frozen=True)
class SplitRule:
    """How much of the source is held out: ``fraction`` (0 < f < 1) or ``count`` (>= 1), and the seed."""

    fraction: float | None = None
    count: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if (self.fraction is None) == (self.count is None):
            raise ValueError("a split rule has exactly one of fraction and count")

    @property
    def threshold(self) -> int:
        """Keys below this are held out (a fraction's rule)."""
        assert self.fraction is not None
        return int(self.fraction * _KEY_SPACE)

    def describe(self) -> str:
        """The rule in words, as the card and errors say it."""
        if self.fraction is not None:
            share = f"{self.fraction:g}"
            how = f"the conversations whose key is below {share} x 2^64 ({share} of them on average)"
        else:
            how = f"the {self.count:,} conversations with the lowest keys"
        return f"{how}, the key being sha256 of seed {self.seed} and the source id"


def split_key(source_id: str, seed: int) -> int:
    """The conversation's place in the key space, from 0 to 2**64 - 1 (see the module docstring)."""
    data = _DOMAIN + str(seed).encode() + b"\0" + source_id.encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "big")


def held_out(source_id: str, rule: SplitRule) -> bool:
    """Whether ``source_id`` is in ``validation`` under a fraction's ``rule`` (a count's needs the
    whole set: :func:`lowest`)."""
    return split_key(source_id, rule.seed) < rule.threshold


def lowest(source_ids: Iterable[str], rule: SplitRule) -> frozenset[str]:
    """The ``rule.count`` distinct ids of ``source_ids`` with the lowest keys (ties by id)."""
    assert rule.count is not None
    ranked = sorted((split_key(s, rule.seed), s) for s in set(source_ids))
    return frozenset(s for _, s in ranked[: rule.count])


def validation_ids(source_ids: Iterable[str], rule: SplitRule) -> frozenset[str]:
    """The held-out ids among ``source_ids`` (every id of the set, for a count's rule)."""
    if rule.count is not None:
        return lowest(source_ids, rule)
    return frozenset(s for s in set(source_ids) if held_out(s, rule))


def split_mask(table: pa.Table, split: SplitName, held: frozenset[str] | SplitRule) -> pa.ChunkedArray:
    """The rows of ``table`` (by its ``source_id`` column) that are in ``split``: ``held`` is the
    set's held-out ids, or a fraction's rule (each distinct id of the table hashed once)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    column = table["source_id"]
    if isinstance(held, SplitRule):
        distinct = pc.unique(column).to_pylist()
        held = frozenset(s for s in distinct if s is not None and held_out(s, held))
    inside = pc.is_in(column, value_set=pa.array(sorted(held), pa.string()))
    return inside if split == VALIDATION else pc.invert(inside)
