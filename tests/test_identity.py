"""A row is what was sent (issue 10): reuse by request, sets that never mix, sets read back without
their server, Hub sources that move.

Builds run against real reference servers; their ledgers say what was really asked.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import datasets
import pytest

import eagle3_raw
from eagle3_raw.errors import FatalError
from eagle3_raw.recipe import load_recipe
from eagle3_raw.run.build import RunOptions, run
from eagle3_raw.run.plan import Shard
from tests.helpers import generations, reference_server, requested_rids, rid_row_id, write_jsonl, write_recipe

try:
    from tests.support.hub_server import HubServer, hub, hub_server
except ImportError:  # pragma: no cover
    from support.hub_server import HubServer, hub, hub_server  # type: ignore[no-redef]  # noqa: F401


def _rows(count: int, start: int = 0) -> list[dict[str, Any]]:
    return [
        {"id": f"p{i:02d}", "prompt": f"Tell me about the number {i}."} for i in range(start, start + count)
    ]


def _build(recipe: Path, work: Path, name: str = "", **options: Any) -> datasets.Dataset:
    return eagle3_raw.load(
        str(recipe), cache_dir=str(work / f"cache{name}"), journal_dir=work / f"journals{name}",
        progress="none", **options,
    )  # fmt: skip


def _asked(ledger: Path, since: int) -> list[str]:
    return [rid_row_id(rid) for rid in requested_rids(ledger)[since:]]


def _same(a: datasets.Dataset, b: datasets.Dataset) -> None:
    assert a["id"] == b["id"] and a["input_ids"] == b["input_ids"] and a["loss_mask"] == b["loss_mask"]


@pytest.mark.slow
def test_raising_limit_fixing_a_line_or_renaming_the_file_asks_only_for_what_changed(tmp_path: Path) -> None:
    rows = _rows(12)
    rows[4] = {"id": "p04", "messages": [{"role": "bot", "content": "broken"}]}  # malformed: skipped
    write_jsonl(tmp_path / "prompts.jsonl", rows)
    with reference_server(tmp_path) as (server, ledger):
        recipe = write_recipe(tmp_path, endpoints=[server.url], prompts={"limit": 8})
        first = _build(recipe, tmp_path)
        assert len(first) == 7 and len(_asked(ledger, 0)) == 7

        asked = len(requested_rids(ledger))
        recipe = write_recipe(tmp_path, endpoints=[server.url], prompts={"limit": 12})
        raised = _build(recipe, tmp_path)
        assert sorted(_asked(ledger, asked)) == ["p08:1:0", "p09:1:0", "p10:1:0", "p11:1:0"]
        _same(raised, _build(recipe, tmp_path, "-fresh"))

        asked = len(requested_rids(ledger))
        rows[4] = {"id": "p04", "prompt": "Tell me about the number 4, fixed."}
        write_jsonl(tmp_path / "prompts.jsonl", rows)
        fixed = _build(recipe, tmp_path)
        assert _asked(ledger, asked) == ["p04:1:0"] and len(fixed) == 12
        _same(fixed, _build(recipe, tmp_path, "-fresh2"))

        asked = len(requested_rids(ledger))
        (tmp_path / "prompts.jsonl").rename(tmp_path / "renamed.jsonl")
        recipe = write_recipe(tmp_path, endpoints=[server.url], source="renamed.jsonl", prompts={"limit": 12})
        renamed = _build(recipe, tmp_path)
        assert _asked(ledger, asked) == []  # every request is the same as before: nothing generated
        _same(renamed, fixed)


@pytest.mark.slow
def test_a_change_that_leaves_a_request_identical_reuses_it(tmp_path: Path) -> None:
    """More samples and every turn: the rows whose requests are unchanged come from the journal."""
    conversation = {
        "id": "c1",
        "messages": [
            {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "How are you?"},
        ],
    }  # fmt: skip
    write_jsonl(tmp_path / "prompts.jsonl", [conversation, *_rows(3)])
    with reference_server(tmp_path) as (server, ledger):
        _build(write_recipe(tmp_path, endpoints=[server.url]), tmp_path)
        asked = len(requested_rids(ledger))
        more = write_recipe(tmp_path, endpoints=[server.url], sampling={"samples_per_prompt": 2}, turns="all")
        built = _build(more, tmp_path)
        new = sorted(_asked(ledger, asked))
        fresh = _build(more, tmp_path, "-fresh")
    assert new == sorted(["c1:1:0", "c1:1:1", "c1:3:1", "p00:1:1", "p01:1:1", "p02:1:1"])  # c1:3:0 reused
    _same(built, fresh)


@pytest.mark.slow
def test_a_complete_set_is_read_back_without_its_server(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "prompts.jsonl", _rows(6))
    with reference_server(tmp_path) as (server, _):
        recipe = write_recipe(tmp_path, endpoints=[server.url])
        built = _build(recipe, tmp_path)
    shutil.rmtree(tmp_path / "cache")  # the datasets cache is gone, and so is the server
    again = _build(recipe, tmp_path)
    _same(again, built)
    streamed = datasets.load_dataset(
        "eagle3_raw", recipe=str(recipe), split="train", streaming=True, journal_dir=tmp_path / "journals",
        progress="none",
    )  # fmt: skip
    rows = list(streamed)
    assert [r["id"] for r in rows] == built["id"] and [r["input_ids"] for r in rows] == built["input_ids"]


def _push_prompts(hub: HubServer, rows: list[dict[str, Any]]) -> str:
    from datasets import Dataset
    from huggingface_hub import HfApi

    Dataset.from_list(rows).push_to_hub("alice/prompts", token=hub.tokens.write)
    return str(HfApi(token=hub.tokens.write).dataset_info("alice/prompts").sha)


@pytest.mark.slow
def test_a_hub_source_that_moved_between_a_run_and_its_resume_is_refused(
    hub: HubServer, tmp_path: Path
) -> None:
    first = _push_prompts(hub, _rows(6))
    with reference_server(tmp_path) as (server, ledger):
        recipe = load_recipe(write_recipe(tmp_path, endpoints=[server.url], source="alice/prompts"))
        half = RunOptions(journal_dir=tmp_path / "journals", progress="none", shard=Shard(0, 2))
        run(recipe, half)
        moved = _push_prompts(hub, _rows(6, start=100))  # a new commit on main
        rest = RunOptions(journal_dir=tmp_path / "journals", progress="none", shard=Shard(1, 2))
        asked = len(requested_rids(ledger))
        with pytest.raises(FatalError, match=rf"it was at commit {first}, it is at {moved} now") as refused:
            run(recipe, rest)
        assert f"prompts.revision: {first}" in str(refused.value)
        assert len(requested_rids(ledger)) == asked
        pinned = load_recipe(recipe, {"prompts.revision": first})
        result = run(pinned, rest)
        assert sorted(_asked(ledger, asked)) == ["p01:1:0", "p03:1:0", "p05:1:0"]  # shard 1 only
        assert result.summary.run_rows == 3
        whole = run(pinned, RunOptions(journal_dir=tmp_path / "journals", progress="none"))
    assert whole.summary.rows == 6 and whole.summary.run_rows == 0 and len(generations(ledger)) == 6
