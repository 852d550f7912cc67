"""Per-conversation sampling mixtures: one weighted component of ``sampling.mixture`` drawn for each
conversation and sample, from the recipe's seed.

The draw is a pure function of (``sampling.seed``, source id, sample) and the weights: the same
recipe draws the same component for a conversation on every build, on every shard, whatever the
order of the source. Every turn of a conversation (and of a rollout) uses its component; the row
records which one (:func:`recorded`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from eagle3_raw.recipe import MixtureComponent, Recipe


@dataclass(frozen=True)
class Choice:
    """The component drawn for one conversation and sample (``index`` in ``sampling.mixture``)."""

    index: int
    component: MixtureComponent


def draw(recipe: Recipe, source_id: str, sample: int) -> Choice | None:
    """The component of ``sampling.mixture`` for ``source_id``'s sample ``sample`` (None without one)."""
    components = recipe.sampling.mixture
    if not components:
        return None
    digest = hashlib.sha256(f"eagle3_raw/mixture/1\0{recipe.sampling.seed}\0{source_id}\0{sample}".encode())
    point = int.from_bytes(digest.digest()[:8], "big") / 2**64 * sum(c.weight for c in components)
    for index, component in enumerate(components):
        point -= component.weight
        if point < 0:
            return Choice(index, component)
    return Choice(len(components) - 1, components[-1])  # rounding at the very top of the range


def recorded(choice: Choice | None) -> dict[str, Any] | None:
    """The ``mixture`` column of a row drawn ``choice``: its index and what it set, as JSON."""
    if choice is None:
        return None
    import orjson

    return {"index": choice.index, "choice": orjson.dumps(choice.component.to_dict()).decode()}


def template_kwargs(recipe: Recipe, choice: Choice | None) -> dict[str, Any]:
    """The chat template keywords of a conversation drawn ``choice``: the component's over the model's."""
    extra: Mapping[str, Any] = choice.component.chat_template_kwargs if choice is not None else {}
    return {**recipe.model.chat_template_kwargs, **extra}


def reasoning_effort(recipe: Recipe, choice: Choice | None) -> str | None:
    """The ``reasoning_effort`` of a conversation drawn ``choice`` (the component's, else the model's)."""
    if choice is not None and choice.component.reasoning_effort is not None:
        return choice.component.reasoning_effort
    return recipe.model.reasoning_effort
