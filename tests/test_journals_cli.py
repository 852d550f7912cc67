"""``eagle3-raw journals``: what a journal root holds, and removing what no set needs (issue 10)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import eagle3_raw
from eagle3_raw.cli.main import main
from eagle3_raw.errors import FatalError, JournalError
from eagle3_raw.journal import Journal
from eagle3_raw.journal.manifest import update_manifest
from eagle3_raw.journal.roots import list_sets, prune, remove_sets
from tests.helpers import generations, reference_server, write_jsonl, write_prompts, write_recipe
from tests.reference.wire import wait_until


def _load(recipe: Path, work: Path, cache: str = "cache") -> int:
    built = eagle3_raw.load(str(recipe), cache_dir=str(work / cache), journal_dir=work / "j", progress="none")
    return len(built)


def _generation_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in (root / "generations").rglob("gen-*.bin"))


@pytest.mark.slow
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
    assert two.name == "t2" and two.caches[0].startswith(str(tmp_path / "cache2"))  # its cache, recorded
    assert one.generated_tokens > 0 and one.bytes > 0 and "eagle3-raw-reference@" in one.target
    assert main(["journals", "list", "--journal-dir", str(root), "--cache-dir", str(tmp_path / "cache")]) == 0
    listed = capsys.readouterr().out
    assert one.config_id in listed and "8 rows (0 failed, 0 skipped)" in listed and "cached" in listed

    generations = _generation_bytes(root)
    shutil.rmtree(tmp_path / "cache2")
    report = prune(root, cache_dir=tmp_path / "cache")  # t2 is in no cache now: it goes
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


def _journals(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["journals", *args]) == 0
    return capsys.readouterr().out


def _sigterm_build(recipe: Path, work: Path, ledger: Path) -> None:
    """A build stopped by SIGTERM once it has journaled rows: what a preempted job leaves."""
    command = [
        sys.executable, "-m", "eagle3_raw.cli", "build", str(recipe), "--quiet",
        "--journal-dir", str(work / "j"), "--cache-dir", str(work / "cache"),
    ]  # fmt: skip
    build = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_until(lambda: len(generations(ledger)) >= 4, timeout=60)
    build.send_signal(signal.SIGTERM)
    _, stderr = build.communicate(timeout=60)
    assert build.returncode == 130 and "Run the same command again to resume" in stderr, stderr[-2000:]


@pytest.mark.slow
def test_prune_and_remove_keep_resumable_and_otherwise_cached_sets_and_show_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 21 finding 1: an interrupted build's journal, a set cached under another --cache-dir,
    and an empty set of a failed build; nothing is removed without --yes."""
    root, elsewhere = tmp_path / "j", tmp_path / "other-cache"
    for name, count in (("slow", 40), ("other", 4), ("empty", 0)):
        (tmp_path / name).mkdir()
        write_prompts(tmp_path / name, count)
    write_jsonl(tmp_path / "empty" / "prompts.jsonl", [{"id": "bad", "messages": []}])  # skipped: no rows
    with reference_server(tmp_path, "--slots", "2", "--ms-per-token", "5") as (server, ledger):
        slow = write_recipe(
            tmp_path / "slow", endpoints=[server.url], name="slow", sampling={"max_new_tokens": 64}
        )
        _sigterm_build(slow, tmp_path, ledger)
        other = write_recipe(tmp_path / "other", endpoints=[server.url], name="other")
        eagle3_raw.load(str(other), cache_dir=str(elsewhere), journal_dir=root, progress="none")
        empty = write_recipe(tmp_path / "empty", endpoints=[server.url], name="empty")
        with pytest.raises(FatalError, match="produced no rows"):
            eagle3_raw.load(str(empty), cache_dir=str(tmp_path / "cache"), journal_dir=root, progress="none")
        infos = {info.name: info for info in list_sets(root, cache_dir=tmp_path / "cache")}
        assert infos["slow"].resumable and infos["slow"].rows > 0 and not infos["slow"].cached
        assert infos["other"].caches and infos["other"].caches[0].startswith(str(elsewhere))  # recorded
        assert not infos["empty"].cached and not infos["empty"].resumable  # its cache folder holds nothing

        where = ["--journal-dir", str(root), "--cache-dir", str(tmp_path / "cache")]
        shown = _journals(capsys, "prune", *where)  # the default: show, remove nothing
        assert f"would remove      {infos['empty'].config_id}" in shown and "run again with --yes" in shown
        assert f"kept              {infos['slow'].config_id} (a rerun resumes it" in shown
        assert f"kept              {infos['other'].config_id} (cached in {elsewhere}" in shown
        assert len(list_sets(root)) == 3
        with pytest.raises(JournalError, match=r"slow-.* is resumable .*--force.*nothing was removed"):
            remove_sets(root, [infos["empty"].config_id, infos["slow"].config_id])
        with pytest.raises(JournalError, match=r"is cached in .*other-cache"):
            remove_sets(root, [infos["other"].config_id], cache_dir=tmp_path / "cache")
        assert len(list_sets(root)) == 3  # one refusal: nothing removed

        done = _journals(capsys, "prune", *where, "--yes")
        assert f"removed           {infos['empty'].config_id}" in done
        assert {info.name for info in list_sets(root)} == {"slow", "other"}
        asked = len(generations(ledger))
        assert "would remove" in _journals(capsys, "prune", *where, "--resumable")  # it may go, if asked
        assert _load(slow, tmp_path) == 40  # the rerun resumed from what prune kept
        assert len(generations(ledger)) - asked == 40 - infos["slow"].rows


def _refused(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(list(args)) == 1
    return capsys.readouterr().err


@pytest.mark.slow
def test_commands_refuse_a_root_others_may_write_or_own_and_follow_no_planted_link(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 22 finding 3: prune/remove on a root another user can write must not follow a link
    planted there into the user's own journal; merge, status and journals refuse a root another
    user owns (as build does). The second user is a folder of mode 777 and, as root, a chown to
    nobody (65534); without root the ownership half is skipped: only root can give a folder away."""
    write_prompts(tmp_path, 6)
    mine, shared = tmp_path / "mine", tmp_path / "shared"
    with reference_server(tmp_path) as (server, _):
        recipe = write_recipe(tmp_path, endpoints=[server.url])
        built = eagle3_raw.load(
            str(recipe), cache_dir=str(tmp_path / "cache"), journal_dir=mine, progress="none"
        )
    [model] = (mine / "generations").iterdir()
    precious = {p: p.read_bytes() for p in model.iterdir() if p.is_file()}
    assert any(p.name.startswith("gen-") for p in precious)

    (shared / "generations").mkdir(parents=True)
    (shared / "sets").mkdir()
    (shared / "generations" / "planted").symlink_to(model)  # another user's plant
    shared.chmod(0o777)  # a folder others may write (as a shared /scratch one)
    for command in (["journals", "prune", "--yes"], ["journals", "remove", "x", "--yes", "--force"]):
        err = _refused(capsys, *command, "--journal-dir", str(shared))
        assert f"{shared} may be written by other users (mode 777)" in err
    shared.chmod(0o700)  # a root of ours, still with the link in it
    assert "is a symbolic link, which a journal never makes nor follows" in _refused(
        capsys, "journals", "prune", "--yes", "--journal-dir", str(shared)
    )
    assert {p: p.read_bytes() for p in model.iterdir() if p.is_file()} == precious  # nothing deleted

    if os.geteuid() != 0:
        pytest.skip("giving a folder to another user needs root (the mode and link checks ran)")
    theirs = tmp_path / "theirs"
    shutil.copytree(mine, theirs, symlinks=True)
    for path in [theirs, *theirs.rglob("*")]:
        os.lchown(path, 65534, 65534)
    where = ["--journal-dir", str(theirs)]
    for command in (
        ["merge", str(recipe), *where, "--cache-dir", str(tmp_path / "cache2")],
        ["status", str(recipe), *where, "--sample", "0"],
        ["journals", "list", *where],
        ["journals", "prune", *where],
    ):
        assert f"{theirs} belongs to another user (uid 65534)" in _refused(capsys, *command), command
    assert not (tmp_path / "cache2").exists() or not list((tmp_path / "cache2").rglob("*.arrow"))
    assert len(built) == 6
