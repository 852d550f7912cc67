"""Selection (issue 24): a derived set of a set, by a recipe's ``select`` rules.

The rules are recomputed here from the parent set's rows, independently of
:mod:`eagle3_raw.selection` (plain Python over the rows as ``load_dataset`` gives them), and the
derived set must hold exactly the rows they keep, in the parent's order, with every dropped row
counted once under the first rule that drops it. Sets are built with the reference server.
"""

from __future__ import annotations

import math
import shutil
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import orjson
import pytest
import yaml

from eagle3_raw import hub
from eagle3_raw.builder import Built, build
from eagle3_raw.errors import RecipeError
from eagle3_raw.export import export
from eagle3_raw.recipe import load_recipe
from eagle3_raw.resources import builder_scripts_dir
from eagle3_raw.selection import NearDuplicates, lowest_accept, repetition_rate

try:
    from tests.support.hub_server import HubServer, hub_server
    from tests.support.hub_server import hub as hub_fixture
except ModuleNotFoundError:  # `tests` is a package only when the repo root is on sys.path
    from support.hub_server import HubServer, hub_server  # type: ignore[no-redef]
    from support.hub_server import hub as hub_fixture  # type: ignore[no-redef]

emulator = hub_fixture
__all__ = ["emulator", "hub_server"]  # fixtures used by name

REPO = "alice/selected"
SPECULATE = [
    "--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
    "--speculative-num-draft-tokens", "4", "--draft-acceptance", "0.6",
]  # fmt: skip
PARENT: dict[str, Any] = {
    "name": "chats",
    "prompts": {"source": "plain.jsonl", "id_column": "id"},
    "server": {"launch": "reference", "launch_args": SPECULATE},
    "sampling": {"max_new_tokens": 96, "temperature": 0.9, "seed": 3, "samples_per_prompt": 2},
}


# --- the rules on crafted values ---------------------------------------------------------------


def naive_rate(ids: Sequence[int], n: int) -> float:
    """The repetition rate as the docs define it, the slow way."""
    grams = [tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)]
    seen: set[tuple[int, ...]] = set()
    repeats = 0
    for gram in grams:
        repeats += gram in seen
        seen.add(gram)
    return repeats / len(grams) if grams else 0.0


def test_repetition_rate_is_the_share_of_ngrams_seen_earlier_in_the_span() -> None:
    assert repetition_rate([1, 2, 3, 1, 2, 3, 1, 2, 3], 3) == pytest.approx(4 / 7)
    assert repetition_rate([7] * 10, 1) == pytest.approx(0.9)
    assert repetition_rate([1, 2, 3, 4], 2) == 0.0
    assert repetition_rate([1, 2], 4) == repetition_rate([], 1) == 0.0
    rng = np.random.default_rng(5)
    for _ in range(200):
        loop = list(rng.integers(0, 6, rng.integers(1, 5)))
        ids = [*rng.integers(0, 50, rng.integers(0, 30)), *loop * int(rng.integers(1, 8))]
        n = int(rng.integers(1, 6))
        assert repetition_rate(ids, n) == pytest.approx(naive_rate(ids, n))


def test_lowest_accept_keeps_the_lowest_share_of_measured_rows_ties_to_the_earlier() -> None:
    accept = np.array([3.0, np.nan, 1.5, 2.0, 1.5, np.nan, 4.0])
    assert lowest_accept(accept, 0.4).tolist() == [False, False, True, False, True, False, False]
    assert lowest_accept(accept, 0.2).tolist() == [False, False, True, False, False, False, False]
    assert lowest_accept(accept, 1.0).tolist() == [True, False, True, True, True, False, True]


def test_minhash_finds_a_near_copy_and_not_an_unrelated_prompt() -> None:
    rng = np.random.default_rng(2)
    prompt = rng.integers(0, 6000, 400).astype(np.int32)
    copy, other = prompt.copy(), rng.integers(0, 6000, 400).astype(np.int32)
    copy[200] = 6001  # one id changed: 5 of ~396 shingles differ (Jaccard ~0.975)
    near = NearDuplicates(5)
    near.add(near.signature(prompt))
    assert near.matches(near.signature(copy), 0.9)
    assert not near.matches(near.signature(other), 0.1)


# --- the recipe section ------------------------------------------------------------------------


def _recipe(tmp_path: Path, **select: Any) -> Any:
    shutil.copy(builder_scripts_dir() / "prompts" / "plain.jsonl", tmp_path / "plain.jsonl")
    return load_recipe(_write(tmp_path, {**PARENT, "server": {"launch": "reference"}}, select or None))


def _write(folder: Path, raw: Mapping[str, Any], select: Mapping[str, Any] | None, name: str = "r") -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump({**raw, **({"select": dict(select)} if select is not None else {})}))
    return path


def test_a_recipe_selects_nothing_without_a_rule_and_keeps_its_fingerprint(tmp_path: Path) -> None:
    plain = _recipe(tmp_path)
    assert not plain.select.active and "select" not in plain.to_dict()
    for empty in ({}, {"repetition_ngram": 8, "near_duplicate_shingle": 3}, {"drop_duplicate_prompts": False}):
        same = load_recipe(_write(tmp_path, {**PARENT, "server": {"launch": "reference"}}, empty))
        assert same.fingerprint == plain.fingerprint, empty
    ruled = _recipe(tmp_path, max_repetition=0.2, finish_reasons="stop")
    assert ruled.fingerprint != plain.fingerprint
    assert ruled.select.rules() == {"finish_reasons": ["stop"], "max_repetition": 0.2, "repetition_ngram": 4}
    assert _recipe(tmp_path, max_repetition=0.2, repetition_ngram=3).fingerprint != ruled.fingerprint
    again = load_recipe(_write(tmp_path, ruled.to_dict(), None, "again"))  # as push publishes it
    assert (again.select, again.fingerprint) == (ruled.select, ruled.fingerprint)


@pytest.mark.parametrize(
    ("select", "message"),
    [
        ({"max_repetition": 1.5}, "'select.max_repetition': got 1.5; expected a number from 0 to 1, or null"),
        ({"lowest_accept_fraction": 0}, "'select.lowest_accept_fraction': got 0; expected a number > 0 and <= 1"),
        ({"max_accept_length": -1}, "'select.max_accept_length': got -1; expected a number >= 0, or null"),
        ({"finish_reasons": ["abort"]}, "'select.finish_reasons': got ['abort']; expected a list of finish "
         "reasons from: stop, length"),
        ({"min_output_len": 9, "max_output_len": 3}, "'select.min_output_len': got 9; expected at most "
         "select.max_output_len (3)"),
        ({"max_repetitoin": 0.5}, "'select.max_repetitoin': got 0.5; unknown field (did you mean "
         "'max_repetition'?)"),
        ({"repetition_ngram": 0}, "'select.repetition_ngram': got 0; expected an integer >= 1"),
        ({"drop_duplicate_prompts": "yes"}, "'select.drop_duplicate_prompts': got 'yes'; expected true or false"),
    ],
)  # fmt: skip
def test_a_bad_rule_is_refused_naming_the_field(tmp_path: Path, select: dict[str, Any], message: str) -> None:
    with pytest.raises(RecipeError) as caught:
        _recipe(tmp_path, **select)
    assert message in str(caught.value)
