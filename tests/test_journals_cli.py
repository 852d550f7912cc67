"""``eagle3-raw journals``: what a journal root holds, and removing what no set needs (issue 10)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import eagle3_raw
from eagle3_raw.cli import main
from eagle3_raw.errors import JournalError
from eagle3_raw.journal import Journal
from eagle3_raw.journal.manifest import update_manifest
from eagle3_raw.journal.roots import list_sets, prune, remove_sets
from tests.helpers import reference_server, write_prompts, write_recipe


def _load(recipe: Path, work: Path, cache: str = "cache") -> int:
    built = eagle3_raw.load(str(recipe), cache_dir=str(work / cache), journal_dir=work / "j", progress="none")
    return len(built)


def _generation_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in (root / "generations").rglob("gen-*.bin"))


def test_list_prune_and_remove_keep_exactly_what_a_set_needs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_prompts(tmp_path, 8)
    root = tmp_path / "j"
    with reference_server(tmp_path) as (server, _):
        keep = write_recipe(tmp_path, endpoints=[server.url])
        assert _load(keep, tmp_path) == 8
        (tmp_path / "b").mkdir()
        write_prompts(tmp_path / "b", 8)  # the same prompts, another recipe (another folder)
        dropping = write_recipe(tmp_path / "b", endpoints=[server.url], on_truncation="drop", name="t2")
        _load(dropping, tmp_path, cache="cache2")  # every generation reused: kept once
    one, two = sorted(list_sets(root, cache_dir=tmp_path / "cache"), key=lambda s: s.name)
    assert (one.name, one.rows, one.whole, one.cached) == ("t", 8, True, True)
    assert two.name == "t2" and not two.cached  # cached in another folder
    assert one.generated_tokens > 0 and one.bytes > 0 and "eagle3-raw-reference@" in one.target
    assert main(["journals", "list", "--journal-dir", str(root), "--cache-dir", str(tmp_path / "cache")]) == 0
    listed = capsys.readouterr().out
    assert one.config_id in listed and "8 rows (0 failed)" in listed and "cached" in listed

    generations = _generation_bytes(root)
    report = prune(root, cache_dir=tmp_path / "cache")  # t2 is not in this cache: it goes
    assert [info.name for info in report.removed] == ["t2"] and [info.name for info in report.kept] == ["t"]
    assert report.freed_bytes == 0 and _generation_bytes(root) == generations  # t still names all of them
    shutil.rmtree(tmp_path / "cache")
    assert _load(keep, tmp_path) == 8  # rebuilt from the journal alone: the server is gone

    update_manifest(root / "sets" / one.config_id, lambda m: m.update(pushed=["alice/x@v1"]))
    with pytest.raises(JournalError, match=r"was pushed .*alice/x@v1.*--force"):
        remove_sets(root, [one.config_id])
    [removed] = remove_sets(root, [one.config_id], force=True)
    assert removed.name == "t" and list_sets(root) == []
    assert _generation_bytes(root) == 0  # nothing names them any more


def test_nothing_is_collected_while_a_build_writes_the_root(tmp_path: Path) -> None:
    from eagle3_raw.identity import Target
    from eagle3_raw.journal.manifest import new_manifest

    target = Target({"model_path": "m", "served_model_name": "m", "weight_version": "w", "version": "v"})
    fresh = new_manifest(
        config_id="t-1", name="t", fingerprint="f", code="c", recipe={}, target=target.to_dict()
    )
    with Journal.open(tmp_path / "j", fresh, target):
        with pytest.raises(JournalError, match="a build is writing to the journal"):
            prune(tmp_path / "j")
        [info] = list_sets(tmp_path / "j")
        assert info.writing
    assert [info.config_id for info in prune(tmp_path / "j").removed] == ["t-1"]
