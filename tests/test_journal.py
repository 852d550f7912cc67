"""The journal: durability, repair, exactly-once reading, shards, failures, manifest, write errors,
generations kept once and found by their request, private folders.

Real files and real processes: crashes are SIGKILLs of a writer, a full disk is RLIMIT_FSIZE (any
user) or a tiny tmpfs (root), a read-only journal is a read-only bind mount (root) or chmod.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import logging
import os
import random
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from eagle3_raw.errors import JournalError
from eagle3_raw.identity import Target
from eagle3_raw.journal import Journal, journal_root, pack_key
from eagle3_raw.journal.files import host_name
from eagle3_raw.journal.log import ENTRY
from eagle3_raw.journal.manifest import new_manifest
from eagle3_raw.rows import META_FIELDS, Row, RowKey, arrow_schema

TARGET = Target(
    {"model_path": "org/m", "served_model_name": "m", "weight_version": "default", "version": "0.5.23"},
    4096,
    4089,
)
CONFIG = "test-0123456789abcdef"
RECIPE = {"name": "test", "sampling": {"max_new_tokens": 8}}
HOST = host_name()


def fresh(config_id: str = CONFIG, fingerprint: str = "f" * 16) -> dict[str, Any]:
    return new_manifest(config_id=config_id, name="test", fingerprint=fingerprint, code="c", recipe=RECIPE,
                        target=TARGET.to_dict())  # fmt: skip


def make_row(index: int, turn: int = 0, sample: int = 0, tokens: int = 6, tag: str = "") -> Row:
    """A deterministic row: its content is a function of its key (and ``tag``)."""
    prompt = [(index * 7 + turn * 3 + k) % 50_000 for k in range(tokens)]
    output = [(index * 11 + sample * 5 + k) % 50_000 for k in range(tokens + 1 + index % 3)]
    meta = {"prompt_tokens": len(prompt), "completion_tokens": len(output), "endpoint": tag or "e0"}
    return Row(
        key=RowKey(index, turn, sample), source_id=f"src-{index}", prompt_ids=prompt, output_ids=output,
        finish_reason="length" if index % 4 == 0 else "stop", sampling_seed=index * 1000 + turn * 10 + sample,
        meta={name: {**meta, "max_new_tokens": 8, "attempts": 1}.get(name) for name in META_FIELDS},
    )  # fmt: skip


def digest_of(row: Row) -> bytes:
    """A stand-in request digest: a function of the row's content (as the real one is of the request)."""
    return hashlib.sha256(repr((row.prompt_ids, row.output_ids, row.meta["endpoint"])).encode()).digest()[:16]


def append(journal: Journal, row: Row) -> None:
    meta = {k: v for k, v in row.meta.items() if k not in ("max_new_tokens", "attempts")}
    generation = {"finish_reason": row.finish_reason, "sampling_params": {"max_new_tokens": 8}, "meta": meta}
    journal.add_generation(
        row.key, digest=digest_of(row), input_key=digest_of(row)[::-1], prompt_ids=row.prompt_ids,
        output_ids=row.output_ids,
        generation=generation,
        row={"source_id": row.source_id, "sampling_seed": row.sampling_seed, "attempts": 1},
    )  # fmt: skip


def open_journal(root: Path, **kwargs: Any) -> Journal:
    manifest = kwargs.pop("manifest", None) or fresh()
    return Journal.open(root, manifest, TARGET, **kwargs)


def write_rows(root: Path, rows: list[Row], **kwargs: Any) -> None:
    with open_journal(root, **kwargs) as journal:
        for row in rows:
            append(journal, row)


def read(root: Path, config_id: str = CONFIG) -> Journal:
    return Journal.read(root, config_id)


def done(root: Path) -> set[RowKey]:
    keys = read(root).done_keys().tolist()
    return {RowKey(k >> 24, ((k >> 12) & 0xFFF) - 1, (k & 0xFFF) - 1) for k in keys}


def expected_table(rows: list[Row]) -> pa.Table:
    records = [row.to_record() for row in sorted(rows, key=lambda row: row.key)]
    return pa.Table.from_pylist(records, schema=arrow_schema())


def read_table(root: Path, batch_rows: int = 1000) -> pa.Table:
    tables = list(read(root).iter_tables(batch_rows=batch_rows))
    assert all(table.num_rows <= batch_rows for table in tables)
    return pa.concat_tables(tables) if tables else arrow_schema().empty_table()


def set_dir(root: Path) -> Path:
    return root / "sets" / CONFIG


def gen_dir(root: Path) -> Path:
    return root / "generations" / TARGET.model_digest.hex()


def gen_file(root: Path, n: int = 0) -> Path:
    return gen_dir(root) / f"gen-{HOST}-{n}.bin"


def run_child(body: str, *args: object, **popen: Any) -> subprocess.Popen[str]:
    """A Python process running ``body`` with the helpers above and ``args`` in ``sys.argv[1:]``."""
    source = "\n".join(
        [
            "import os, sys, signal, resource, hashlib",
            "from typing import Any",
            "from pathlib import Path",
            "from eagle3_raw.errors import JournalError",
            "from eagle3_raw.identity import Target",
            "from eagle3_raw.journal import Journal",
            "from eagle3_raw.journal.manifest import new_manifest",
            "from eagle3_raw.rows import META_FIELDS, Row, RowKey",
            f"TARGET = Target.from_dict({TARGET.to_dict()!r})",
            f"CONFIG, RECIPE = {CONFIG!r}, {RECIPE!r}",
            *(inspect.getsource(f) for f in (fresh, make_row, digest_of, append, open_journal)),
            textwrap.dedent(body),
        ]
    )
    command = [sys.executable, "-c", source, *map(str, args)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, text=True, **popen)


# --- round trip, order, dedupe ---------------------------------------------------------------------


def test_round_trip_tables_equal_rows_to_record(tmp_path: Path) -> None:
    rows = [make_row(i, t, s) for i in range(40) for t in range(2) for s in range(3)]
    random.Random(1).shuffle(rows)
    write_rows(tmp_path, rows)

    journal = read(tmp_path)
    assert done(tmp_path) == {row.key for row in rows}
    assert list(journal.iter_rows()) == sorted(rows, key=lambda row: row.key)
    assert read_table(tmp_path, batch_rows=7).equals(expected_table(rows))


def test_reopen_and_append_more(tmp_path: Path) -> None:
    write_rows(tmp_path, [make_row(i) for i in range(5)])
    with open_journal(tmp_path) as journal:
        assert len(journal.done_keys()) == 5
        append(journal, make_row(5))
        assert pack_key(RowKey(5, 0, 0)) in journal.done_keys().tolist()
    assert list(read(tmp_path).iter_rows()) == [make_row(i) for i in range(6)]
    assert sorted(p.name for p in gen_dir(tmp_path).glob("gen-*.bin")) == [f"gen-{HOST}-0.bin"]  # adopted


def test_empty_journal_reads_empty(tmp_path: Path) -> None:
    open_journal(tmp_path).close()
    journal = read(tmp_path)
    assert len(journal.done_keys()) == 0
    assert list(journal.iter_tables()) == []
    assert journal.stats()["rows"] == 0


def test_canonical_order_independent_of_append_order_and_shards(tmp_path: Path) -> None:
    rows = [make_row(i, t, s) for i in range(30) for t in range(2) for s in range(2)]
    write_rows(tmp_path / "sorted", rows)
    write_rows(tmp_path / "reversed", rows[::-1])
    shuffled = rows[:]
    random.Random(7).shuffle(shuffled)
    for shard in range(3):
        write_rows(tmp_path / "sharded", shuffled[shard::3], shard=f"{shard}-of-3")

    expected = expected_table(rows)
    for name in ("sorted", "reversed", "sharded"):
        assert read_table(tmp_path / name, batch_rows=16).equals(expected), name


def test_duplicates_across_and_within_shards_first_wins(tmp_path: Path) -> None:
    first = open_journal(tmp_path, shard="0-of-2")
    second = open_journal(tmp_path, shard="1-of-2")
    append(second, make_row(1, tag="second"))
    append(first, make_row(1, tag="first"))
    append(second, make_row(2, tag="early"))
    append(second, make_row(2, tag="late"))
    append(first, make_row(0))
    second.flush()
    assert len(first.done_keys()) == 3  # a writer sees other shards too
    first.close()
    second.close()

    journal = read(tmp_path)
    assert list(journal.iter_rows()) == [make_row(0), make_row(1, tag="first"), make_row(2, tag="early")]
    assert read_table(tmp_path).num_rows == 3


def test_stats_counts_rows_tokens_reasons_failures(tmp_path: Path) -> None:
    rows = [make_row(i) for i in range(8)]
    with open_journal(tmp_path) as journal:
        for row in rows + rows[:2]:
            append(journal, row)
        journal.add_failure(RowKey(20, 0, 0), "src-20:0:0", "skipped", "prompt too long")
        journal.add_failure(RowKey(21, 0, 0), "src-21:0:0", "failed", "HTTP 400")
        journal.add_failure(RowKey(22, 0, 0), "src-22:0:0", "failed", "HTTP 400")
    stats = read(tmp_path).stats()
    assert stats == {
        "rows": 8,
        "reused": 0,
        "prompt_tokens": sum(len(row.prompt_ids) for row in rows),
        "generated_tokens": sum(len(row.output_ids) for row in rows),
        "finish_reasons": {"length": 2, "stop": 6},
        "tokens_by_reason": {
            reason: {
                "prompt_tokens": sum(len(r.prompt_ids) for r in rows if r.finish_reason == reason),
                "generated_tokens": sum(len(r.output_ids) for r in rows if r.finish_reason == reason),
            }
            for reason in ("length", "stop")
        },
        "failures": {"failed": {"HTTP 400": 2}, "skipped": {"prompt too long": 1}},
    }


def test_background_flush_makes_rows_durable_without_flush_calls(tmp_path: Path) -> None:
    journal = open_journal(tmp_path, flush_interval=0.05)
    append(journal, make_row(0))
    deadline = time.monotonic() + 10
    while RowKey(0, 0, 0) not in done(tmp_path):
        assert time.monotonic() < deadline, "the background flusher never wrote the row"
        time.sleep(0.02)
    journal.close()


# --- generations kept once, found by their request -------------------------------------------------


def test_a_generation_is_kept_once_and_reused_by_digest_and_by_input_key(tmp_path: Path) -> None:
    row = make_row(3)
    write_rows(tmp_path, [row])
    other = fresh("other-set-0000000000000000", fingerprint="e" * 16)
    with open_journal(tmp_path, manifest=other) as journal:
        index = journal.generation_index()
        assert index.memo(digest_of(row)[::-1]) == digest_of(row)  # the input key leads to the request
        assert index.memo(b"\x01" * 16) is None
        assert index.locate(digest_of(row)) is not None
        row_info = {"source_id": "elsewhere", "sampling_seed": 7, "attempts": 0}
        journal.add_reused(RowKey(0, 1, 0), digest=digest_of(row), row=row_info, alias=b"\x02" * 16)
    reused = read(tmp_path, "other-set-0000000000000000")
    [again] = list(reused.iter_rows())
    assert (again.prompt_ids, again.output_ids) == (row.prompt_ids, row.output_ids)
    assert again.source_id == "elsewhere" and again.key == RowKey(0, 1, 0)
    assert reused.stats()["reused"] == 1
    assert reused.generation_index().memo(b"\x02" * 16) == digest_of(row)  # the alias is remembered
    assert len(reused.generation_index()) == 1  # one generation, two sets


def test_a_row_counts_only_once_its_generation_is_in_the_store(tmp_path: Path) -> None:
    """Outcomes and generations are flushed by two threads: a kill between them leaves an outcome
    whose generation never reached the disk; that row is not done, and is planned again."""
    rows = [make_row(i) for i in range(3)]
    write_rows(tmp_path, rows)
    index = gen_file(tmp_path).with_suffix(".idx")
    index.write_bytes(index.read_bytes()[: 2 * ENTRY.size])  # the third generation never indexed
    assert done(tmp_path) == {rows[0].key, rows[1].key}
    assert list(read(tmp_path).iter_rows()) == rows[:2]
    assert read(tmp_path).stats()["rows"] == 2


# --- torn tails and corruption ---------------------------------------------------------------------


def test_torn_last_record_at_every_offset_is_cut(tmp_path: Path) -> None:
    rows = [make_row(i, tokens=3) for i in range(3)]
    write_rows(tmp_path / "source", rows[:2])
    with open_journal(tmp_path / "source") as journal:  # the third in a group of its own
        append(journal, rows[2])
    data = gen_file(tmp_path / "source").read_bytes()
    entries = gen_file(tmp_path / "source").with_suffix(".idx").read_bytes()
    start = int.from_bytes(entries[-16:-8], "little") >> 8  # the last record's offset

    for cut in range(start + 1, len(data), 7):
        root = tmp_path / f"cut{cut}"
        shutil.copytree(tmp_path / "source", root)
        gen_file(root).write_bytes(data[:cut])  # the crash: the record torn, its entry never written
        gen_file(root).with_suffix(".idx").write_bytes(entries[: -ENTRY.size])
        assert done(root) == {rows[0].key, rows[1].key}  # a reader reads the index alone
        assert gen_file(root).stat().st_size == cut  # and leaves the file as it is
        with open_journal(root) as journal:
            assert list(journal.iter_rows()) == rows[:2]
            append(journal, rows[2])
        assert list(read(root).iter_rows()) == rows


def test_records_durable_but_not_indexed_are_indexed_by_the_next_writer(tmp_path: Path) -> None:
    """A kill between the data fsync and the index fsync: the next writer indexes what is whole."""
    rows = [make_row(i) for i in range(4)]
    write_rows(tmp_path, rows)
    for path in (gen_file(tmp_path), set_dir(tmp_path) / f"out-0-of-1-{HOST}-0.bin"):
        index = path.with_suffix(".idx")
        index.write_bytes(index.read_bytes()[: ENTRY.size + 5])  # one entry, and a torn one
    assert len(done(tmp_path)) <= 1
    with open_journal(tmp_path):
        pass
    assert list(read(tmp_path).iter_rows()) == rows


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda data: data + b"\0" * 4096, id="zero-filled-tail"),
        pytest.param(lambda data: data + b"E3G2" + b"\xff" * 8, id="bad-length"),
        pytest.param(lambda data: data + b"garbage", id="bad-magic"),
        pytest.param(lambda data: data + data[-60:-1], id="short-record"),
    ],
)
def test_damaged_tail_is_cut_to_the_last_complete_record(tmp_path: Path, damage: Any) -> None:
    rows = [make_row(i) for i in range(3)]
    write_rows(tmp_path, rows)
    good = gen_file(tmp_path).read_bytes()
    gen_file(tmp_path).write_bytes(damage(good))
    with open_journal(tmp_path) as journal:
        assert list(journal.iter_rows()) == rows
    assert gen_file(tmp_path).read_bytes() == good


def test_damage_followed_by_valid_records_is_refused_not_cut(tmp_path: Path) -> None:
    rows = [make_row(i) for i in range(3)]
    write_rows(tmp_path, rows)
    index = gen_file(tmp_path).with_suffix(".idx")
    index.write_bytes(b"")  # nothing indexed: the writer scans the whole file
    data = bytearray(gen_file(tmp_path).read_bytes())
    data[40] ^= 0xFF  # inside the first record
    gen_file(tmp_path).write_bytes(bytes(data))

    with pytest.raises(JournalError, match=r"offset 0 is damaged .* valid records follow") as info:
        open_journal(tmp_path)
    assert f"truncate -s 0 {gen_file(tmp_path)}" in str(info.value)  # keeps what precedes the damage
    assert gen_file(tmp_path).read_bytes() == bytes(data)


def test_a_record_damaged_after_it_was_indexed_is_an_error_when_read(tmp_path: Path) -> None:
    write_rows(tmp_path, [make_row(i) for i in range(3)])
    data = bytearray(gen_file(tmp_path).read_bytes())
    data[40] ^= 0xFF
    gen_file(tmp_path).write_bytes(bytes(data))
    with pytest.raises(JournalError, match="changed after it was indexed"):
        list(read(tmp_path).iter_rows())


SIGKILL_CHILD = """
    root, total = Path(sys.argv[1]), int(sys.argv[2])
    journal = Journal.open(root, fresh(), TARGET, flush_interval=0.01)
    done = set(journal.done_keys().tolist())
    print("ready", flush=True)
    for index in range(total):
        if (index << 24 | 1 << 12 | 1) not in done:
            append(journal, make_row(index, tokens=500))
        if index % 50 == 49:
            journal.flush()
            print(index, flush=True)
    journal.close()
    print("finished", flush=True)
"""


@pytest.mark.slow
def test_sigkill_while_appending_loses_nothing_reported_and_duplicates_nothing(tmp_path: Path) -> None:
    total, rng = 6000, random.Random(3)
    for _ in range(6):
        child = run_child(SIGKILL_CHILD, tmp_path, total)
        assert child.stdout is not None
        assert child.stdout.readline() == "ready\n"
        time.sleep(rng.uniform(0.01, 0.15))
        child.send_signal(signal.SIGKILL)
        lines = child.stdout.read().split()
        child.wait()
        reported = max((int(line) for line in lines if line.isdigit()), default=-1)
        assert {RowKey(i, 0, 0) for i in range(reported + 1)} <= done(tmp_path), "a flushed row was lost"

    rows = list(read(tmp_path).iter_rows())
    assert rows == [make_row(row.key.index, tokens=500) for row in rows]  # complete rows only
    finisher = run_child(SIGKILL_CHILD, tmp_path, total)
    assert finisher.communicate()[0].endswith("finished\n")
    journal = read(tmp_path)
    assert journal.stats()["rows"] == total
    assert [row.key.index for row in journal.iter_rows()] == list(range(total))
    assert len(list(gen_dir(tmp_path).glob("gen-*.bin"))) == 1  # each run adopted the dead one's log


# --- failures --------------------------------------------------------------------------------------


def test_failures_latest_per_key_rows_win_and_a_retry_epoch_clears_failed_ones(tmp_path: Path) -> None:
    k1, k2, k3, k4 = (RowKey(i, 0, 0) for i in range(1, 5))
    with open_journal(tmp_path) as journal:
        journal.add_failure(k1, "r1", "failed", "HTTP 500 x5")
        journal.add_failure(k1, "r1", "failed", "HTTP 400")
        journal.add_failure(k2, "r2", "skipped", "prompt too long")
        journal.add_failure(k3, "r3", "failed", "timeout")
        journal.add_failure(k4, "r4", "failed", "reset")
        append(journal, make_row(4))
        assert [(f["key"], f["kind"], f["reason"]) for f in journal.failures()] == [
            (k1, "failed", "HTTP 400"),
            (k2, "skipped", "prompt too long"),
            (k3, "failed", "timeout"),
        ]
        journal.sets.retry_failed()
        assert [f["key"] for f in journal.failures()] == [k2]  # skips stay: the prompt is unusable
        journal.add_failure(k3, "r3", "failed", "timeout again")
    with open_journal(tmp_path, shard="1-of-2") as other:
        other.add_failure(k1, "r1", "failed", "from another shard")  # in the epoch the manifest says

    failures = read(tmp_path).failures()
    assert [(f["key"], f["id"], f["reason"]) for f in failures] == [
        (k1, "r1", "from another shard"),
        (k2, "r2", "prompt too long"),
        (k3, "r3", "timeout again"),
    ]
    assert read(tmp_path).manifest["retry_epoch"] == 1


def test_bad_failure_kind_and_read_only_handle_are_programming_errors(tmp_path: Path) -> None:
    with open_journal(tmp_path) as journal, pytest.raises(ValueError, match="kind"):
        journal.add_failure(RowKey(0, 0, 0), "x", "exploded", "?")
    with pytest.raises(ValueError, match="read-only"):
        read(tmp_path).add_failure(RowKey(0, 0, 0), "x", "failed", "?")


# --- manifest ----------------------------------------------------------------------------------------


def test_manifest_records_recipe_and_target_and_refuses_another_set(tmp_path: Path) -> None:
    open_journal(tmp_path).close()
    manifest = read(tmp_path).manifest
    assert manifest["config_id"] == CONFIG and manifest["recipe"] == RECIPE
    assert manifest["target"] == TARGET.to_dict()
    assert [p.name for p in set_dir(tmp_path).iterdir() if p.name.startswith(".")] == []  # no temp left

    with pytest.raises(JournalError, match="records fingerprint 'ffffffffffffffff', not 'eeee"):
        open_journal(tmp_path, manifest=fresh(fingerprint="e" * 16))
    with pytest.raises(JournalError, match="no set journal"):
        read(tmp_path, "missing-0000000000000000")


def test_outcomes_without_manifest_are_not_adopted(tmp_path: Path) -> None:
    write_rows(tmp_path, [make_row(0)])
    (set_dir(tmp_path) / "manifest.json").unlink()
    with pytest.raises(JournalError, match="no manifest"):
        open_journal(tmp_path)


# --- processes -------------------------------------------------------------------------------------

HOLDER_CHILD = """
    journal = open_journal(Path(sys.argv[1]))
    append(journal, make_row(0))
    journal.flush()
    print("locked", flush=True)
    sys.stdin.readline()
    journal.close()
"""


@pytest.mark.slow
def test_second_writer_of_a_shard_is_refused(tmp_path: Path) -> None:
    holder = run_child(HOLDER_CHILD, tmp_path, stdin=subprocess.PIPE)
    assert holder.stdout is not None and holder.stdin is not None
    assert holder.stdout.readline() == "locked\n"
    with pytest.raises(JournalError, match=rf"another build is writing shard 0-of-1 .*pid {holder.pid}"):
        open_journal(tmp_path)
    assert done(tmp_path) == {RowKey(0, 0, 0)}  # readers need no lock
    with open_journal(tmp_path, shard="1-of-2"):  # another shard is fine, with a log of its own
        assert len(list(gen_dir(tmp_path).glob("gen-*.bin"))) == 2
    holder.communicate("\n")
    with open_journal(tmp_path) as journal:
        with pytest.raises(JournalError, match="another build"):
            open_journal(tmp_path)  # same process, second handle
        assert len(journal.done_keys()) == 1


# --- private folders, no links -------------------------------------------------------------------------


def test_journal_folders_are_private_and_files_not_readable_by_others(tmp_path: Path) -> None:
    root = tmp_path / "journals"
    write_rows(root, [make_row(0)])
    for folder in (root, root / "sets", set_dir(root), root / "generations", gen_dir(root)):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    for path in [*set_dir(root).iterdir(), *gen_dir(root).iterdir()]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def test_a_folder_others_may_write_or_that_another_user_owns_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "journals"
    write_rows(root, [make_row(0)])
    (root / "sets").chmod(0o777)
    with pytest.raises(JournalError, match=r"may be written by other users \(mode 777\)"):
        open_journal(root)
    (root / "sets").chmod(0o700)
    if os.geteuid() == 0:  # only root can give a folder away
        os.chown(set_dir(root), 65534, 65534)
        with pytest.raises(JournalError, match="belongs to another user"):
            open_journal(root)


def test_a_planted_link_is_never_written_through(tmp_path: Path) -> None:
    root, victim = tmp_path / "journals", tmp_path / "victim"
    victim.write_bytes(b"precious")
    open_journal(root).close()
    log = set_dir(root) / f"out-0-of-1-{HOST}-0.bin"
    log.unlink()
    log.symlink_to(victim)  # another user's plant, where the next build will write
    with pytest.raises(JournalError, match="symbolic link"):
        write_rows(root, [make_row(0)])
    assert victim.read_bytes() == b"precious"
    shutil.rmtree(set_dir(root))
    set_dir(root).symlink_to(tmp_path)  # the folder itself
    with pytest.raises(JournalError, match="not a folder"):
        open_journal(root)


# --- write errors ----------------------------------------------------------------------------------

DISK_FULL_CHILD = """
    journal = open_journal(Path(sys.argv[1]), flush_interval=60)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # then writes past the limit fail with EFBIG
    limit = os.path.getsize(sys.argv[2]) + 150_000
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    try:
        for index in range(10_000):
            append(journal, make_row(index, tokens=700))
            if index % 4 == 3:
                journal.flush()
                print(index, flush=True)
    except JournalError as error:
        print("ERROR", str(error).replace(chr(10), " "), flush=True)
    try:
        append(journal, make_row(10_001))
        journal.flush()
    except JournalError:
        print("STILL REFUSED", flush=True)
    try:
        journal.close()
    except JournalError:
        pass
    print("CLOSED", flush=True)
"""


def test_a_file_too_large_stops_with_journal_error_and_keeps_journal_readable(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_rows(tmp_path, [make_row(index, tokens=700) for index in range(3)])
    output = run_child(DISK_FULL_CHILD, tmp_path, gen_file(tmp_path)).communicate()[0].splitlines()
    error = next(line for line in output if line.startswith("ERROR"))
    assert str(gen_file(tmp_path)) in error
    assert "File too large (EFBIG)" in error
    assert output[-2:] == ["STILL REFUSED", "CLOSED"]

    flushed = max(int(line) for line in output if line.isdigit())
    assert done(tmp_path) == {RowKey(i, 0, 0) for i in range(flushed + 1)}  # no partial group
    with caplog.at_level(logging.WARNING), open_journal(tmp_path):
        pass
    assert "torn" not in caplog.text  # the failed group was already truncated away


BACKGROUND_FULL_CHILD = """
    import time
    journal = open_journal(Path(sys.argv[1]), flush_interval=0.02)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    limit = os.path.getsize(sys.argv[2]) + 50_000
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    try:  # the background flusher runs into the limit; nobody calls flush()
        for index in range(100):
            append(journal, make_row(index, tokens=700))
        time.sleep(0.5)
        journal.close()
    except JournalError as error:
        print("RAISED", str(error).replace(chr(10), " "), flush=True)
"""


def test_background_write_error_is_raised_by_the_next_call(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The flusher thread's error surfaces in the writer: the next append, or close at the latest."""
    write_rows(tmp_path, [make_row(10_000)])
    output = run_child(BACKGROUND_FULL_CHILD, tmp_path, gen_file(tmp_path)).communicate()[0]
    assert output.startswith("RAISED") and "EFBIG" in output, output

    rows = [row for row in read(tmp_path).iter_rows() if row.key.index < 10_000]
    assert rows == [make_row(index, tokens=700) for index in range(len(rows))]  # whole groups only
    with caplog.at_level(logging.WARNING), open_journal(tmp_path):
        pass
    assert "torn" not in caplog.text


def _try_mount(*args: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting needs root (the RLIMIT_FSIZE / chmod variants cover non-root)")
    result = subprocess.run(["mount", *args], capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount here: {result.stderr.strip()}")


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 512 KiB tmpfs: a disk that really fills up (ENOSPC)."""
    mount_point = tmp_path / "tmpfs"
    mount_point.mkdir(mode=0o700)
    _try_mount("-t", "tmpfs", "-o", "size=512k,mode=0700", "tmpfs", str(mount_point))
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=True)


def test_no_space_left_keeps_the_rows_until_space_comes_back(tiny_tmpfs: Path) -> None:
    root = tiny_tmpfs / "j"
    journal = open_journal(root, flush_interval=60)
    filler = tiny_tmpfs / "filler"
    with filler.open("wb") as f, contextlib.suppress(OSError):
        f.write(b"\0" * (512 << 10))  # the disk is full now
    rows = [make_row(index, tokens=1000) for index in range(40)]  # ~300 KB
    for row in rows:
        append(journal, row)
    with pytest.raises(JournalError, match="no space left"):
        journal.flush()
    assert journal.generations.writer.pending_bytes > 0  # held in memory, not dropped
    filler.unlink()  # space comes back
    journal.flush()
    journal.close()
    assert list(read(root).iter_rows()) == rows


@contextlib.contextmanager
def read_only(directory: Path) -> Iterator[str]:
    """Make ``directory`` unwritable by a real mechanism; yields the error name writes will get."""
    if os.geteuid() != 0:
        modes = {path: path.stat().st_mode for path in [directory, *directory.rglob("*")]}
        for path in modes:
            path.chmod(0o555 if path.is_dir() else 0o444)
        try:
            yield "EACCES"
        finally:
            for path, mode in modes.items():
                path.chmod(mode)
        return
    _try_mount("--bind", str(directory), str(directory))
    try:
        _try_mount("-o", "remount,bind,ro", str(directory))
        yield "EROFS"
    finally:
        subprocess.run(["umount", str(directory)], check=True)


def test_read_only_journal_refuses_to_open_for_writing_and_stays_readable(tmp_path: Path) -> None:
    rows = [make_row(i) for i in range(5)]
    root = tmp_path / "j"
    write_rows(root, rows)
    with read_only(root) as error_name:
        with pytest.raises(JournalError) as refused:
            open_journal(root)
        assert str(root) in str(refused.value)
        assert f"({error_name})" in str(refused.value)
        assert list(read(root).iter_rows()) == rows


# --- memory ----------------------------------------------------------------------------------------


def iteration_peaks(root: Path) -> tuple[int, int]:
    """Peak Python (tracemalloc) and Arrow bytes allocated while iterating, after a warm-up pass."""
    reader = read(root)
    for _ in reader.iter_tables(batch_rows=100):
        pass
    arrow_base, arrow_peak = pa.total_allocated_bytes(), 0
    tracemalloc.start()
    try:
        for table in reader.iter_tables(batch_rows=100):
            arrow_peak = max(arrow_peak, pa.total_allocated_bytes() - arrow_base)
            del table
        return tracemalloc.get_traced_memory()[1], arrow_peak
    finally:
        tracemalloc.stop()


@pytest.mark.slow
def test_index_is_small_and_iteration_memory_grows_only_by_the_index(tmp_path: Path) -> None:
    small, large = 5_000, 25_000
    for name, count in (("small", small), ("large", large)):
        with open_journal(tmp_path / name) as journal:
            for index in range(count):
                append(journal, make_row(count - 1 - index, tokens=100))  # ~850 bytes each
            journal.flush()
            assert journal.generation_index().nbytes <= 120 * count  # no row data in the index
            assert journal.done_keys().nbytes == 8 * count  # 8 bytes a done row

    python_small, arrow_small = iteration_peaks(tmp_path / "small")
    python_large, arrow_large = iteration_peaks(tmp_path / "large")
    extra_rows = large - small  # ~17 MB more rows; only the index (~200 B/row) may show
    assert python_large - python_small < 256 * extra_rows, (python_small, python_large)
    assert arrow_large - arrow_small < 256 * extra_rows, (arrow_small, arrow_large)
    assert python_large < 12_000_000 and arrow_large < 8_000_000


def test_journal_root_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("EAGLE3_RAW_JOURNAL_DIR", str(tmp_path / "journals"))
    assert journal_root() == tmp_path / "journals"
    monkeypatch.delenv("EAGLE3_RAW_JOURNAL_DIR")
    assert journal_root() == Path.home() / ".cache" / "eagle3_raw" / "journals"


def test_plan_records_survive_a_torn_tail_and_damage_only_costs_the_rows_they_name(tmp_path: Path) -> None:
    """The plan records a resume passes over done source rows by (issue 26): a torn or zeroed tail
    (a kill, a crash before the file's blocks were written) and damaged or disagreeing records are
    left out, never misread; a row counts as done only when all its keys have outcomes."""
    import numpy as np

    from eagle3_raw.journal.plans import PlanLog, pass_over, read_plans
    from eagle3_raw.journal.sets import pack_keys

    first = PlanLog(tmp_path / "plan-0-of-1-a-0.bin")
    for index in range(8):
        first.add(index, 1000 + index, 2)
    first.close()
    second = PlanLog(tmp_path / "plan-0-of-1-a-1.bin")
    second.add(3, 1003, 2)  # the same fact again: kept
    second.add(5, 1005, 3)  # disagrees about row 5: it is read from the source
    second.close()
    with (tmp_path / "plan-0-of-1-a-0.bin").open("r+b") as f:
        f.seek(24 * 6 + 9)  # damage record 6
        f.write(b"\xff")
        f.seek(0, os.SEEK_END)
        f.write(bytes(24) + b"\x01" * 11)  # a zeroed record, then a torn one
    records = read_plans(tmp_path)
    assert records["index"].tolist() == [0, 1, 2, 3, 4, 7]
    keys = [pack_keys(i, t, 0) for i in range(8) for t in (1, 3) if (i, t) != (2, 3)]  # row 2: one missing
    passed = pass_over(records, np.sort(np.array(keys, np.int64)))
    assert [i for i in range(9) if passed.skips(i)] == [0, 1, 3, 4, 7]
    assert len(passed) == 5
