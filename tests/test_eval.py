"""``eagle3-raw eval`` (issue 24): a set's prompts replayed through speculating reference servers.

The end-to-end tests build a small set on a reference server without a drafter, then replay it
through two reference servers that speculate with drafters of different quality
(``--draft-acceptance``), each keeping a ledger: the report's figures are recomputed from the
``spec`` the servers' ledgers record for the requests eval sent. The points (what is replayed,
with which params) are checked on plain rows.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from eagle3_raw.evaluate.sets import points
from eagle3_raw.recipe import load_recipe
from eagle3_raw.run.mixture import draw
from eagle3_raw.run.plan import derive_seed
from eagle3_raw.sglang.sampling import SGLANG_SAMPLING_DEFAULTS
from tests.helpers import CHATS, error_line, generations, reference_server, run_main, write_jsonl, write_recipe

SPECULATING = (
    "--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
    "--speculative-num-draft-tokens", "4",
)  # fmt: skip


def _recipe(tmp_path: Path, **sampling: Any) -> Any:
    write_jsonl(tmp_path / "prompts.jsonl", CHATS)
    path = write_recipe(tmp_path, endpoints=["http://127.0.0.1:9"], sampling=sampling)
    return load_recipe(path)


def _row(**fields: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "id": "plain-1:1:0", "source_id": "plain-1", "turn": 1, "sample": 0,
        "input_ids": [5, 6, 7, 8, 9, 10], "prompt_len": 4, "finish_reason": "stop", "sampling_seed": 1234,
        "meta": {"max_new_tokens": 40}, "kind": "turn",
        "spans": [{"turn": 1, "start": 4, "end": 6}],
    }  # fmt: skip
    return {**row, **fields}


# --- points, on plain rows -------------------------------------------------------------------


def test_a_turn_row_replays_its_prompt_with_its_max_new_tokens_seed_and_the_recipes_sampling(
    tmp_path: Path,
) -> None:
    recipe = _recipe(tmp_path, temperature=0.7, top_p=0.9)
    (point,) = points([_row()], recipe)
    assert point.prompt_ids == (5, 6, 7, 8)
    assert (point.row_id, point.source_id, point.turn) == ("plain-1:1:0", "plain-1", 1)
    expected = {**SGLANG_SAMPLING_DEFAULTS, "max_new_tokens": 40, "temperature": 0.7, "top_p": 0.9}
    assert dict(point.sampling_params) == {**expected, "sampling_seed": 1234}


def test_greedy_sends_temperature_zero_and_min_new_tokens_never_passes_max(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, temperature=0.7, min_new_tokens=50)
    (point,) = points([_row()], recipe, greedy=True)
    assert point.sampling_params["temperature"] == 0.0
    assert point.sampling_params["max_new_tokens"] == 40
    assert point.sampling_params["min_new_tokens"] == 40  # SGLang refuses min above max


def test_a_merged_row_replays_each_turn_at_its_span_with_that_turns_seed(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, temperature=0.7)
    spans = [{"turn": 1, "start": 2, "end": 4}, {"turn": 3, "start": 6, "end": 9}]
    row = _row(
        id="share-1:merged:0", source_id="share-1", turn=3, kind="merged", prompt_len=2,
        input_ids=list(range(100, 109)), spans=spans, sampling_seed=77,
    )  # fmt: skip
    first, last = points([row], recipe)
    assert (first.turn, first.prompt_ids) == (1, (100, 101))
    assert (last.turn, last.prompt_ids) == (3, (100, 101, 102, 103, 104, 105))
    assert first.sampling_params["sampling_seed"] == derive_seed(recipe.sampling.seed, "share-1", 1, 0)
    assert last.sampling_params["sampling_seed"] == 77  # the row's own: its last turn's


def test_a_mixture_component_s_params_are_the_row_s(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "prompts.jsonl", CHATS)
    mixture = [{"weight": 1, "temperature": 0.2}, {"weight": 1, "temperature": 0.9}]
    path = write_recipe(tmp_path, endpoints=["http://127.0.0.1:9"], sampling={"mixture": mixture})
    recipe = load_recipe(path)
    rows = [_row(source_id=f"s{i}", id=f"s{i}:1:0") for i in range(8)]
    for row, point in zip(rows, points(rows, recipe), strict=True):
        choice = draw(recipe, row["source_id"], 0)
        assert choice is not None
        assert point.sampling_params["temperature"] == choice.component.params["temperature"]


def test_categories_name_each_points_category(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path)
    rows = [_row(), _row(source_id="plain-2", id="plain-2:1:0")]
    found = points(rows, recipe, categories={"plain-1": "poetry"})
    assert [p.category for p in found] == ["poetry", None]
