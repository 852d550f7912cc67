"""Scale-out (issue 6): N shard processes fill one journal; merge gives the single-process set."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import eagle3_raw
from eagle3_raw.errors import FatalError
from eagle3_raw.journal import Journal
from eagle3_raw.recipe import RecipeError, load_recipe
from eagle3_raw.run import build as run_module
from eagle3_raw.run.build import journal_dir_for
from eagle3_raw.run.plan import Shard
from eagle3_raw.run.shards import check_whole, mark_complete
from tests.helpers import generations, reference_server, rid_row_id, write_jsonl, write_recipe
from tests.support.pace import scaled


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "eagle3_raw.cli", *args], capture_output=True, text=True, timeout=scaled(120)
    )


@pytest.mark.slow
def test_shards_on_two_servers_merge_into_the_single_process_set(tmp_path: Path) -> None:
    rows = [{"id": f"q{i}", "prompt": f"Question number {i}?"} for i in range(30)]
    write_jsonl(tmp_path / "prompts.jsonl", rows)
    journals = tmp_path / "journals"
    with reference_server(tmp_path) as (a, ledger_a), reference_server(tmp_path) as (b, ledger_b):
        recipe = write_recipe(tmp_path, endpoints=[a.url], turns="last", sampling={"samples_per_prompt": 2})
        shards = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "eagle3_raw.cli.main",
                    "build",
                    str(recipe),
                    "--shard",
                    f"{i}/3",
                    "--quiet",
                    "--journal-dir",
                    str(journals),
                    "--set",
                    f"server.endpoints=[{url}]",
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for i, url in enumerate([a.url, b.url, a.url])
        ]
        outputs = [shard.communicate(timeout=scaled(120)) for shard in shards]
        assert [s.returncode for s in shards] == [0, 0, 0], [err[-2000:] for _, err in outputs]
        asked = [rid_row_id(g["rid"]) for g in generations(ledger_a) + generations(ledger_b)]
        clean = eagle3_raw.load(
            str(recipe), cache_dir=str(tmp_path / "clean"), journal_dir=tmp_path / "clean-j"
        )
    assert sorted(asked) == sorted(set(asked)) and len(asked) == 60  # disjoint shards, every row once
    hint = outputs[-1][0].strip().splitlines()[-1].strip()  # the merge command the shard printed
    assert hint.startswith("eagle3-raw merge") and f"--journal-dir {journals}" in hint, hint
    merged = _cli(*shlex.split(hint)[1:], "--cache-dir", str(tmp_path / "cache"))
    assert merged.returncode == 0, merged.stderr[-2000:]
    assert "rows              60" in merged.stdout
    built = eagle3_raw.load(str(recipe), cache_dir=str(tmp_path / "cache"), journal_dir=journals)
    assert built["id"] == clean["id"] and built["input_ids"] == clean["input_ids"]


@pytest.mark.slow
def test_merge_refuses_an_incomplete_journal(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "prompts.jsonl", [{"id": f"q{i}", "prompt": f"Q{i}?"} for i in range(4)])
    with reference_server(tmp_path) as (server, _):
        recipe = write_recipe(tmp_path, endpoints=[server.url])
        done = _cli("build", str(recipe), "--shard", "1/2", "--quiet", "--journal-dir", str(tmp_path / "j"))
        assert done.returncode == 0, done.stderr[-2000:]
    directory = journal_dir_for(load_recipe(recipe), tmp_path / "j")
    with pytest.raises(FatalError, match=r"missing \[0\]"):
        check_whole(directory)
    refused = _cli("merge", str(recipe), "--journal-dir", str(tmp_path / "j"))
    assert refused.returncode == 1 and "--force" in refused.stderr
    forced = _cli("merge", str(recipe), "--journal-dir", str(tmp_path / "j"), "--force",
                  "--cache-dir", str(tmp_path / "c"))  # fmt: skip
    assert forced.returncode == 0 and "rows              2" in forced.stdout
    assert "PARTIAL set (of 2: missing [0])" in forced.stdout
    with reference_server(tmp_path) as (server, _):
        other = _cli("build", str(recipe), "--shard", "0/2", "--quiet", "--journal-dir", str(tmp_path / "j"),
                     "--set", f"server.endpoints=[{server.url}]")  # fmt: skip
        assert other.returncode == 0, other.stderr[-2000:]
    merged = _cli(
        "merge", str(recipe), "--journal-dir", str(tmp_path / "j"), "--cache-dir", str(tmp_path / "c")
    )
    assert merged.returncode == 0 and "rows              4" in merged.stdout  # not the stale 2-row set


def test_shard_split_is_deterministic_and_disjoint() -> None:
    shards = [Shard.parse(f"{i}/4") for i in range(4)]
    owners = [[s.index for s in shards if s.takes(index)] for index in range(100)]
    assert all(len(o) == 1 for o in owners)
    with pytest.raises(RecipeError, match="0 <= i < N"):
        Shard.parse("4/4")


@pytest.mark.slow
def test_a_shard_is_marked_complete_only_once_its_rows_are_on_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A merge on another machine trusts the marker: every row must be durable before it exists."""
    write_jsonl(tmp_path / "prompts.jsonl", [{"id": f"q{i}", "prompt": f"Question {i}?"} for i in range(20)])
    on_disk: list[int] = []

    def checking(journal_dir: Path, shard: Shard, counts: dict[str, Any]) -> Path:
        on_disk.append(len(Journal.read_dir(journal_dir).done_keys()))  # what another process sees now
        return mark_complete(journal_dir, shard, counts)

    monkeypatch.setattr(run_module, "mark_complete", checking)
    with reference_server(tmp_path) as (server, _):
        recipe = load_recipe(write_recipe(tmp_path, endpoints=[server.url]))
        run_module.run(
            recipe,
            run_module.RunOptions(journal_dir=tmp_path / "j", shard=Shard.parse("0/2"), progress="none"),
        )
    assert on_disk == [10]
