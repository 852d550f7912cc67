"""A journal on a shared folder (issue 10): shard processes writing one journal through different
paths to it (two bind mounts of one folder, or symbolic links) while readers scan it, and files of
another host (its logs, a tail it is writing, its temporary files), which no writer here touches.

No NFS here: this kernel has neither the NFS client nor the server (CONFIG_NFS_FS, CONFIG_NFSD), so
the paths are bind mounts (root) and links; hosts are told apart by the names of their files.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import eagle3_raw
from eagle3_raw.identity import set_config_id
from eagle3_raw.journal import Journal
from eagle3_raw.journal.files import host_name, temporary_name
from eagle3_raw.recipe import load_recipe
from eagle3_raw.run.build import RunOptions, resolve
from tests.helpers import generations, reference_server, rid_row_id, write_prompts, write_recipe
from tests.support.pace import scaled

HOST = host_name()


def _build(recipe: Path, root: Path, *extra: str) -> subprocess.Popen[str]:
    command = [
        sys.executable, "-m", "eagle3_raw.cli", "build", str(recipe), "--quiet", "--journal-dir", str(root),
        *extra,
    ]  # fmt: skip
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _merge(recipe: Path, root: Path, cache: Path) -> None:
    command = ["merge", str(recipe), "--journal-dir", str(root), "--cache-dir", str(cache)]
    merged = subprocess.run(
        [sys.executable, "-m", "eagle3_raw.cli", *command], capture_output=True, text=True
    )
    assert merged.returncode == 0, merged.stderr[-3000:]


def _config_id(recipe: Path, root: Path) -> str:
    loaded = load_recipe(recipe)
    return set_config_id(loaded, resolve(loaded, RunOptions(journal_dir=root)))


class _Reader(threading.Thread):
    """Scans a set's journal in a loop (done keys, every row, the stats) until stopped; keeps any
    error, and what each scan saw."""

    def __init__(self, root: Path, config_id: str) -> None:
        super().__init__(daemon=True)
        self.root, self.config_id = root, config_id
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.seen: list[tuple[int, int, int]] = []  # done keys, rows read, rows counted by stats

    def run(self) -> None:
        manifest = self.root / "sets" / self.config_id / "manifest.json"
        while not self.stop.wait(0.02):
            if not manifest.exists():
                continue
            try:
                with Journal.read(self.root, self.config_id) as journal:
                    done = journal.done_keys()
                    rows = sum(1 for _ in journal.iter_rows())
                    counted = journal.stats()["rows"]
                self.seen.append((len(done), rows, counted))
            except BaseException as exc:  # a false damage error, or anything else: the test fails
                self.errors.append(exc)
                return


@contextlib.contextmanager
def _two_paths(kind: str, real: Path, tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """Two different paths to the folder ``real``: two bind mounts of it, or two symbolic links
    (one to a folder above the journal root, one that is the root itself)."""
    if kind == "links":
        (tmp_path / "link-a").symlink_to(real.parent)
        (tmp_path / "link-b").symlink_to(real)
        yield tmp_path / "link-a" / real.name, tmp_path / "link-b"
        return
    points = [tmp_path / "mount-a", tmp_path / "mount-b"]
    mounted: list[Path] = []
    try:
        for point in points:
            point.mkdir(mode=0o700)
            result = subprocess.run(
                ["mount", "--bind", str(real), str(point)], capture_output=True, text=True
            )
            if result.returncode != 0:
                pytest.skip(
                    f"cannot bind-mount here ({result.stderr.strip()}); the links variant runs instead"
                )
            mounted.append(point)
        assert os.stat(points[0]).st_dev == os.stat(real).st_dev  # really mounted, one file system
        yield points[0], points[1]
    finally:
        for point in reversed(mounted):
            subprocess.run(["umount", str(point)], check=True)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["bind-mounts", "links"])
def test_two_shards_through_two_paths_with_readers_scanning_give_the_single_process_set(
    tmp_path: Path, kind: str
) -> None:
    write_prompts(tmp_path, 80)
    real = tmp_path / "shared" / "journals"
    real.mkdir(parents=True, mode=0o700)
    (tmp_path / "shared").chmod(0o700)
    with (
        reference_server(tmp_path, "--slots", "4", "--ms-per-token", "1") as (server, ledger),
        _two_paths(kind, real, tmp_path) as (root_a, root_b),
    ):
        sampling = {"samples_per_prompt": 2, "max_new_tokens": 96}
        recipe = write_recipe(tmp_path, endpoints=[server.url], sampling=sampling)
        config_id = _config_id(recipe, real)
        reader = _Reader(real, config_id)  # a third path: the folder itself
        reader.start()
        shards = [_build(recipe, root, "--shard", f"{i}/2") for i, root in enumerate((root_a, root_b))]
        outputs = [shard.communicate(timeout=scaled(180)) for shard in shards]
        reader.stop.set()
        reader.join(timeout=60)
        assert [s.returncode for s in shards] == [0, 0], [err[-2000:] for _, err in outputs]
        asked = [rid_row_id(g["rid"]) for g in generations(ledger)]
        _merge(recipe, root_b, tmp_path / "cache")
        merged = eagle3_raw.load(str(recipe), cache_dir=str(tmp_path / "cache"), journal_dir=root_a)
        single = eagle3_raw.load(
            str(recipe), cache_dir=str(tmp_path / "single-cache"), journal_dir=tmp_path / "single"
        )
    assert not reader.errors, reader.errors
    assert any(0 < rows < 160 for _, rows, _ in reader.seen), reader.seen[-5:]  # it read while they wrote
    for earlier, later in zip(reader.seen, reader.seen[1:], strict=False):  # nothing seen ever vanishes
        assert all(b >= a for a, b in zip(earlier, later, strict=True)), (earlier, later)
    assert sorted(asked) == sorted(set(asked)) and len(asked) == 160  # every row asked once, by one shard
    assert merged["id"] == single["id"] and merged["input_ids"] == single["input_ids"]
    assert merged["loss_mask"] == single["loss_mask"]


# --- another host's files -----------------------------------------------------------------------


def _as_other_host(source: Path, target: Path) -> list[Path]:
    """Copy the journal ``source`` (built here) into ``target`` as host ``otherhost`` wrote it: every
    log named after that host. Returns the copied logs."""
    copied = []
    for path in sorted(source.rglob("*")):
        if path.is_dir() or path.suffix == ".lock":
            continue
        name = path.name.replace(f"-{HOST}-", "-otherhost-")
        destination = target / path.parent.relative_to(source) / name
        destination.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        shutil.copy2(path, destination)
        if name != path.name:
            copied.append(destination)
    return copied


def _digests(paths: list[Path]) -> dict[Path, str]:
    return {path: hashlib.sha256(path.read_bytes()).hexdigest() for path in paths}


def _dead_pid() -> int:
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    return int(child.stdout)


@pytest.mark.slow
def test_a_writer_never_cuts_deletes_or_adopts_another_hosts_files(tmp_path: Path) -> None:
    """Shard 1 of 2 was built by ``otherhost`` (its logs copied in, named after it), which is still
    writing: torn tails on its data and index files, and temporary files of its own. Shard 0 built
    here leaves every one of them as it was, removes only this host's stale temporary file, reads
    the other host's tails as unfinished (not damage), and the merge is the single-process set."""
    write_prompts(tmp_path, 30)
    shared = tmp_path / "journals"
    with reference_server(tmp_path) as (server, ledger):
        recipe = write_recipe(tmp_path, endpoints=[server.url])
        config_id = _config_id(recipe, shared)
        other = _build(recipe, tmp_path / "other", "--shard", "1/2")
        assert other.wait(timeout=scaled(120)) == 0, other.communicate()[1][-2000:]
        logs = _as_other_host(tmp_path / "other", shared)
        assert {p.name.split("-otherhost-")[0] for p in logs} == {"gen", "out-1-of-2", "plan-1-of-2"}
        for log in logs:  # otherhost is writing a record and its entry right now
            with log.open("ab") as f:
                f.write(os.urandom(37) if log.suffix == ".bin" else b"\x07" * 20)
        set_folder = shared / "sets" / config_id
        theirs = [
            set_folder / ".manifest.json~otherhost~123.tmp", set_folder / ".manifest.json.otherhost.123.tmp",
            set_folder / f".manifest.json~x.{HOST}~{_dead_pid()}.tmp",  # a host whose name ends in ours
            set_folder / f".manifest.json.x.{HOST}.{_dead_pid()}.tmp",  # the same, named as before
            set_folder / ".complete-1-of-2.json~otherhost~7.tmp",
        ]  # fmt: skip
        ours = set_folder / f".manifest.json~{HOST}~{_dead_pid()}.tmp"  # left by a crash of this host
        for path in [*theirs, ours]:
            path.write_bytes(b"half a manifest")
        before = _digests([*logs, *theirs])
        here = _build(recipe, shared, "--shard", "0/2")
        _, err = here.communicate(timeout=scaled(120))
        assert here.returncode == 0, err[-2000:]
        assert _digests([*logs, *theirs]) == before  # not cut, not deleted, not written
        assert not ours.exists()
        assert "torn" not in err and "damaged" not in err
        with Journal.read(shared, config_id) as journal:
            assert len(journal.done_keys()) == 30 and journal.stats()["rows"] == 30
        _merge(recipe, shared, tmp_path / "cache")
        merged = eagle3_raw.load(str(recipe), cache_dir=str(tmp_path / "cache"), journal_dir=shared)
        single = eagle3_raw.load(str(recipe), cache_dir=str(tmp_path / "c1"), journal_dir=tmp_path / "single")
        assert len(generations(ledger)) == 60  # each shard's rows asked once; the single build asked all
    assert merged["id"] == single["id"] and merged["input_ids"] == single["input_ids"]
    mine = {p.name for p in (shared / "sets" / config_id).glob(f"out-0-of-2-{HOST}-*")}
    assert mine == {f"out-0-of-2-{HOST}-0.{suffix}" for suffix in ("bin", "idx", "lock")}


def test_temporary_files_are_unique_per_host_and_process(tmp_path: Path) -> None:
    target = tmp_path / "manifest.json"
    code = "import sys; from pathlib import Path; from eagle3_raw.journal.files import temporary_name as t; "
    code += "print(t(Path(sys.argv[1])))"
    names = {
        subprocess.run(
            [sys.executable, "-c", code, str(target)], capture_output=True, text=True
        ).stdout.strip()
        for _ in range(2)
    }
    assert len(names) == 2  # two processes, two names
    for name in names:
        _, host, pid = Path(name).name.removesuffix(".tmp").rsplit("~", 2)
        assert host == HOST and pid.isdigit()
    mine = temporary_name(target).name
    assert mine == f".manifest.json~{HOST}~{os.getpid()}.tmp" and mine not in {Path(n).name for n in names}
