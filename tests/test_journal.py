"""The journal: durability, repair, exactly-once reading, shards, failures, manifest, write errors.

Real files and real processes: crashes are SIGKILLs of a writer, a full disk is RLIMIT_FSIZE (any
user) or a tiny tmpfs (root), a read-only journal is a read-only bind mount (root) or chmod.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import random
import shutil
import signal
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

from eagle3_raw.errors import JournalError, ServerMismatch
from eagle3_raw.journal import Journal, encode_record, journal_root
from eagle3_raw.rows import Row, RowKey, arrow_schema

FINGERPRINT = "0123456789abcdef"
RECIPE = {"name": "test", "sampling": {"max_new_tokens": 8}}
ROWS_FILE = "rows-0-of-1.bin"


def make_row(index: int, turn: int = 0, sample: int = 0, tokens: int = 6, tag: str = "") -> Row:
    """A deterministic row: its content is a function of its key (and ``tag``)."""
    prompt = [(index * 7 + turn * 3 + k) % 50_000 for k in range(tokens)]
    output = [(index * 11 + sample * 5 + k) % 50_000 for k in range(tokens + 1 + index % 3)]
    return Row(
        key=RowKey(index, turn, sample),
        source_id=f"src-{index}",
        prompt_ids=prompt,
        output_ids=output,
        finish_reason="length" if index % 4 == 0 else "stop",
        sampling_seed=index * 1000 + turn * 10 + sample,
        meta={"prompt_tokens": len(prompt), "completion_tokens": len(output), "endpoint": tag or "e0"},
    )


def open_journal(directory: Path, **kwargs: Any) -> Journal:
    kwargs.setdefault("fingerprint", FINGERPRINT)
    kwargs.setdefault("recipe", RECIPE)
    return Journal.open(directory, **kwargs)


def write_rows(directory: Path, rows: list[Row], **kwargs: Any) -> None:
    with open_journal(directory, **kwargs) as journal:
        for row in rows:
            journal.append(row)


def expected_table(rows: list[Row]) -> pa.Table:
    records = [row.to_record() for row in sorted(rows, key=lambda row: row.key)]
    return pa.Table.from_pylist(records, schema=arrow_schema())


def read_table(directory: Path, batch_rows: int = 1000) -> pa.Table:
    tables = list(Journal.read(directory).iter_tables(batch_rows=batch_rows))
    assert all(table.num_rows <= batch_rows for table in tables)
    return pa.concat_tables(tables) if tables else arrow_schema().empty_table()


def run_child(body: str, *args: object, **popen: Any) -> subprocess.Popen[str]:
    """A Python process running ``body`` with ``make_row`` defined and ``args`` in ``sys.argv[1:]``."""
    source = "\n".join(
        [
            "import os, sys, signal, resource",
            "from eagle3_raw.errors import JournalError",
            "from eagle3_raw.journal import Journal",
            "from eagle3_raw.rows import Row, RowKey",
            f"FINGERPRINT, RECIPE = {FINGERPRINT!r}, {RECIPE!r}",
            inspect.getsource(make_row),
            textwrap.dedent(body),
        ]
    )
    command = [sys.executable, "-c", source, *map(str, args)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, text=True, **popen)


# --- round trip, order, dedupe ---------------------------------------------------------------------


def test_round_trip_tables_equal_rows_to_record(tmp_path: Path) -> None:
    rows = [make_row(i, t, s) for i in range(40) for t in range(2) for s in range(3)]
    random.Random(1).shuffle(rows)
    write_rows(tmp_path / "j", rows)

    journal = Journal.read(tmp_path / "j")
    assert journal.done() == {row.key for row in rows}
    assert list(journal.iter_rows()) == sorted(rows, key=lambda row: row.key)
    assert read_table(tmp_path / "j", batch_rows=7).equals(expected_table(rows))


def test_reopen_and_append_more(tmp_path: Path) -> None:
    write_rows(tmp_path / "j", [make_row(i) for i in range(5)])
    with open_journal(tmp_path / "j") as journal:
        assert journal.done() == {RowKey(i, 0, 0) for i in range(5)}
        journal.append(make_row(5))
        assert RowKey(5, 0, 0) in journal.done()
    assert list(Journal.read(tmp_path / "j").iter_rows()) == [make_row(i) for i in range(6)]


def test_empty_journal_reads_empty(tmp_path: Path) -> None:
    open_journal(tmp_path / "j").close()
    journal = Journal.read(tmp_path / "j")
    assert journal.done() == set()
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
    first = open_journal(tmp_path / "j", shard="0-of-2")
    second = open_journal(tmp_path / "j", shard="1-of-2")
    second.append(make_row(1, tag="second"))
    first.append(make_row(1, tag="first"))
    second.append(make_row(2, tag="early"))
    second.append(make_row(2, tag="late"))
    first.append(make_row(0))
    second.flush()
    assert first.done() == {RowKey(i, 0, 0) for i in range(3)}  # a writer sees other shards too
    first.close()
    second.close()

    journal = Journal.read(tmp_path / "j")
    assert list(journal.iter_rows()) == [make_row(0), make_row(1, tag="first"), make_row(2, tag="early")]
    assert journal.stats()["duplicates"] == 2
    assert read_table(tmp_path / "j").num_rows == 3


def test_stats_counts_rows_tokens_reasons_failures(tmp_path: Path) -> None:
    rows = [make_row(i) for i in range(8)]
    with open_journal(tmp_path / "j") as journal:
        for row in rows + rows[:2]:
            journal.append(row)
        journal.record_failure(RowKey(20, 0, 0), "src-20:0:0", "skipped", "prompt too long")
        journal.record_failure(RowKey(21, 0, 0), "src-21:0:0", "failed", "HTTP 400")
        journal.record_failure(RowKey(22, 0, 0), "src-22:0:0", "failed", "HTTP 400")
    stats = Journal.read(tmp_path / "j").stats()
    assert stats == {
        "rows": 8,
        "duplicates": 2,
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
    journal = open_journal(tmp_path / "j", flush_interval=0.05)
    journal.append(make_row(0))
    deadline = time.monotonic() + 10
    while RowKey(0, 0, 0) not in Journal.read(tmp_path / "j").done():
        assert time.monotonic() < deadline, "the background flusher never wrote the row"
        time.sleep(0.02)
    journal.close()


# --- torn tails and corruption ---------------------------------------------------------------------


def copy_journal(source: Path, target: Path, rows_bytes: bytes) -> Path:
    target.mkdir()
    shutil.copy(source / "manifest.json", target / "manifest.json")
    (target / ROWS_FILE).write_bytes(rows_bytes)
    return target


def test_torn_last_record_at_every_offset_is_cut(tmp_path: Path) -> None:
    rows = [make_row(i, tokens=3) for i in range(3)]
    write_rows(tmp_path / "source", rows)
    data = (tmp_path / "source" / ROWS_FILE).read_bytes()
    start = len(data) - len(encode_record(rows[-1]))

    for cut in range(start + 1, len(data)):
        directory = copy_journal(tmp_path / "source", tmp_path / f"cut{cut}", data[:cut])
        assert Journal.read(directory).done() == {rows[0].key, rows[1].key}  # a reader leaves it
        assert (directory / ROWS_FILE).stat().st_size == cut
        with open_journal(directory) as journal:
            assert list(journal.iter_rows()) == rows[:2]
            journal.append(rows[2])
        assert list(Journal.read(directory).iter_rows()) == rows


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda data, start: data + b"\0" * 4096, id="zero-filled-tail"),
        pytest.param(lambda data, start: data[:-1] + bytes([data[-1] ^ 0xFF]), id="bad-checksum"),
        pytest.param(lambda data, start: data[:start] + b"E3J1" + b"\xff" * 8, id="bad-length"),
        pytest.param(lambda data, start: data[:start] + b"garbage", id="bad-magic"),
    ],
)
def test_damaged_tail_is_cut_to_the_last_complete_record(tmp_path: Path, damage: Any) -> None:
    rows = [make_row(i) for i in range(3)]
    write_rows(tmp_path / "source", rows)
    data = (tmp_path / "source" / ROWS_FILE).read_bytes()
    start = len(data) - len(encode_record(rows[-1]))
    directory = copy_journal(tmp_path / "source", tmp_path / "j", damage(data, start))

    with open_journal(directory) as journal:
        kept = list(journal.iter_rows())
    assert kept in (rows, rows[:2])
    assert (directory / ROWS_FILE).stat().st_size == sum(len(encode_record(row)) for row in kept)


def test_damage_followed_by_valid_records_is_refused_not_cut(tmp_path: Path) -> None:
    rows = [make_row(i) for i in range(3)]
    write_rows(tmp_path / "source", rows)
    data = bytearray((tmp_path / "source" / ROWS_FILE).read_bytes())
    data[30] ^= 0xFF  # inside the first record
    directory = copy_journal(tmp_path / "source", tmp_path / "j", bytes(data))

    with pytest.raises(JournalError, match=r"offset 0 is damaged .* valid records follow") as info:
        open_journal(directory)
    assert f"truncate -s 0 {directory / ROWS_FILE}" in str(info.value)  # keeps what precedes the damage
    with pytest.raises(JournalError, match="damaged"):
        Journal.read(directory).done()
    assert (directory / ROWS_FILE).read_bytes() == bytes(data)


def test_torn_failures_line_is_cut(tmp_path: Path) -> None:
    with open_journal(tmp_path / "j") as journal:
        journal.record_failure(RowKey(1, 0, 0), "a", "failed", "x")
    path = tmp_path / "j" / "failures-0-of-1.jsonl"
    with path.open("ab") as f:
        f.write(b'{"key":[2,0,0],"id":"b","ki')
    with open_journal(tmp_path / "j") as journal:
        assert [failure["id"] for failure in journal.failures()] == ["a"]
        journal.record_failure(RowKey(3, 0, 0), "c", "failed", "y")
    assert [failure["id"] for failure in Journal.read(tmp_path / "j").failures()] == ["a", "c"]


@pytest.mark.parametrize(("good", "bad"), [(b'"key":[1,', b'"kez":[1,'), (b'"kind":"failed"', b'"kind":7')])
def test_a_damaged_failures_line_is_never_read_as_another_failure(
    tmp_path: Path, good: bytes, bad: bytes
) -> None:
    with open_journal(tmp_path / "j") as journal:
        for i in range(3):
            journal.record_failure(RowKey(i, 0, 0), f"r{i}", "failed", "x")
    path = tmp_path / "j" / "failures-0-of-1.jsonl"
    lines = path.read_bytes().split(b"\n")
    lines[1] = lines[1].replace(good, bad)
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(JournalError, match="line 2 is damaged but valid lines follow it"):
        Journal.read(tmp_path / "j").failures()


SIGKILL_CHILD = """
    directory, total = sys.argv[1], int(sys.argv[2])
    journal = Journal.open(directory, fingerprint=FINGERPRINT, recipe=RECIPE, flush_interval=0.01)
    done = journal.done()
    print("ready", flush=True)
    for index in range(total):
        if RowKey(index, 0, 0) not in done:
            journal.append(make_row(index, tokens=500))
        if index % 50 == 49:
            journal.flush()
            print(index, flush=True)
    journal.close()
    print("finished", flush=True)
"""


def test_sigkill_while_appending_loses_nothing_reported_and_duplicates_nothing(tmp_path: Path) -> None:
    directory, total, rng = tmp_path / "j", 6000, random.Random(3)
    for _ in range(6):
        child = run_child(SIGKILL_CHILD, directory, total)
        assert child.stdout is not None
        assert child.stdout.readline() == "ready\n"
        time.sleep(rng.uniform(0.01, 0.15))
        child.send_signal(signal.SIGKILL)
        lines = child.stdout.read().split()
        child.wait()
        reported = max((int(line) for line in lines if line.isdigit()), default=-1)
        done = Journal.read(directory).done()
        assert {RowKey(i, 0, 0) for i in range(reported + 1)} <= done, "a flushed row was lost"

    rows = list(Journal.read(directory).iter_rows())
    assert rows == [make_row(row.key.index, tokens=500) for row in rows]  # complete rows only
    finisher = run_child(SIGKILL_CHILD, directory, total)
    assert finisher.communicate()[0].endswith("finished\n")
    journal = Journal.read(directory)
    assert journal.stats()["rows"] == total
    assert journal.stats()["duplicates"] == 0
    assert [row.key.index for row in journal.iter_rows()] == list(range(total))


# --- failures --------------------------------------------------------------------------------------


def test_failures_latest_per_key_rows_win_and_clear_by_kind(tmp_path: Path) -> None:
    k1, k2, k3, k4 = (RowKey(i, 0, 0) for i in range(1, 5))
    with open_journal(tmp_path / "j") as journal:
        journal.record_failure(k1, "r1", "failed", "HTTP 500 x5")
        journal.record_failure(k1, "r1", "failed", "HTTP 400")
        journal.record_failure(k2, "r2", "skipped", "prompt too long")
        journal.record_failure(k3, "r3", "failed", "timeout")
        journal.record_failure(k4, "r4", "failed", "reset")
        journal.append(make_row(4))
        assert [(f["key"], f["kind"], f["reason"]) for f in journal.failures()] == [
            (k1, "failed", "HTTP 400"),
            (k2, "skipped", "prompt too long"),
            (k3, "failed", "timeout"),
        ]
        journal.clear_failures()
        assert [f["key"] for f in journal.failures()] == [k2]
        journal.record_failure(k3, "r3", "failed", "timeout again")
    with open_journal(tmp_path / "j", shard="1-of-2") as other:
        other.record_failure(k1, "r1", "failed", "from another shard")

    failures = Journal.read(tmp_path / "j").failures()
    assert [(f["key"], f["id"], f["reason"]) for f in failures] == [
        (k1, "r1", "from another shard"),
        (k2, "r2", "prompt too long"),
        (k3, "r3", "timeout again"),
    ]
    with open_journal(tmp_path / "j") as journal:
        journal.clear_failures(["failed", "skipped"])
        assert journal.failures() == []


def test_bad_failure_kind_and_read_only_handle_are_programming_errors(tmp_path: Path) -> None:
    with open_journal(tmp_path / "j") as journal, pytest.raises(ValueError, match="kind"):
        journal.record_failure(RowKey(0, 0, 0), "x", "exploded", "?")
    with pytest.raises(ValueError, match="read-only"):
        Journal.read(tmp_path / "j").append(make_row(0))
    with pytest.raises(ValueError, match="closed"):
        journal.append(make_row(0))


# --- manifest and identity -------------------------------------------------------------------------


def test_manifest_records_recipe_and_refuses_another_fingerprint(tmp_path: Path) -> None:
    open_journal(tmp_path / "j").close()
    manifest = Journal.read(tmp_path / "j").manifest
    assert manifest["fingerprint"] == FINGERPRINT
    assert manifest["recipe"] == RECIPE
    assert sorted(path.name for path in (tmp_path / "j").iterdir() if path.name.startswith(".")) == []

    with pytest.raises(JournalError, match=rf"fingerprint {FINGERPRINT}, not ffff"):
        open_journal(tmp_path / "j", fingerprint="ffff")
    with pytest.raises(JournalError, match="not ffff"):
        Journal.read(tmp_path / "j", fingerprint="ffff")
    with pytest.raises(JournalError, match="no journal"):
        Journal.read(tmp_path / "missing")


def test_rows_without_manifest_are_not_adopted(tmp_path: Path) -> None:
    write_rows(tmp_path / "j", [make_row(0)])
    (tmp_path / "j" / "manifest.json").unlink()
    with pytest.raises(JournalError, match="no manifest"):
        open_journal(tmp_path / "j")


IDENTITY = {"model_path": "org/model-a", "tokenizer_hash": "abc", "version": "0.5.23", "endpoint": "u1"}


def test_server_identity_recorded_then_compared(tmp_path: Path) -> None:
    with open_journal(tmp_path / "j") as journal:
        journal.set_server_identity(IDENTITY, allow_change=False)
    with open_journal(tmp_path / "j") as journal:
        journal.set_server_identity({**IDENTITY, "endpoint": "u2"}, allow_change=False)  # not identity
        other = {**IDENTITY, "model_path": "org/model-b", "tokenizer_hash": "def"}
        with pytest.raises(ServerMismatch) as refused:
            journal.set_server_identity(other, allow_change=False)
    message = str(refused.value)
    for part in ("model_path", "org/model-a", "org/model-b", "tokenizer_hash", "--allow-server-change"):
        assert part in message
    assert "version" not in message.replace("--allow", "")  # only what differs
    assert Journal.read(tmp_path / "j").manifest["server"] == IDENTITY


def test_allowed_server_change_is_recorded(tmp_path: Path) -> None:
    other = {**IDENTITY, "model_path": "org/model-b"}
    with open_journal(tmp_path / "j") as journal:
        journal.set_server_identity(IDENTITY, allow_change=False)
        journal.set_server_identity(other, allow_change=True)
    manifest = Journal.read(tmp_path / "j").manifest
    assert manifest["server"] == other
    [change] = manifest["history"]
    assert change["event"] == "allow-server-change"
    assert change["changes"] == {"model_path": {"recorded": "org/model-a", "now": "org/model-b"}}
    with open_journal(tmp_path / "j") as journal:
        journal.set_server_identity(other, allow_change=False)


# --- processes -------------------------------------------------------------------------------------

HOLDER_CHILD = """
    journal = Journal.open(sys.argv[1], fingerprint=FINGERPRINT, recipe=RECIPE)
    journal.append(make_row(0))
    journal.flush()
    print("locked", flush=True)
    sys.stdin.readline()
    journal.close()
"""


def test_second_writer_of_a_shard_is_refused(tmp_path: Path) -> None:
    holder = run_child(HOLDER_CHILD, tmp_path / "j", stdin=subprocess.PIPE)
    assert holder.stdout is not None and holder.stdin is not None
    assert holder.stdout.readline() == "locked\n"
    with pytest.raises(JournalError, match=rf"another build is writing shard 0-of-1 .*pid {holder.pid}"):
        open_journal(tmp_path / "j")
    assert Journal.read(tmp_path / "j").done() == {RowKey(0, 0, 0)}  # readers need no lock
    with open_journal(tmp_path / "j", shard="1-of-2"):  # another shard is fine
        pass
    holder.communicate("\n")
    with open_journal(tmp_path / "j") as journal:
        with pytest.raises(JournalError, match="another build"):
            open_journal(tmp_path / "j")  # same process, second handle
        assert journal.done() == {RowKey(0, 0, 0)}


# --- write errors ----------------------------------------------------------------------------------

DISK_FULL_CHILD = """
    journal = Journal.open(sys.argv[1], fingerprint=FINGERPRINT, recipe=RECIPE, flush_interval=60)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # then writes past the limit fail with EFBIG
    limit = os.path.getsize(os.path.join(sys.argv[1], "rows-0-of-1.bin")) + 150_000
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    try:
        for index in range(10_000):
            journal.append(make_row(index, tokens=700))
            if index % 4 == 3:
                journal.flush()
                print(index, flush=True)
    except JournalError as error:
        print("ERROR", str(error).replace(chr(10), " "), flush=True)
    try:
        journal.append(make_row(10_001))
    except JournalError:
        print("STILL REFUSED", flush=True)
    journal.close()
    print("CLOSED", flush=True)
"""


def test_disk_full_stops_with_journal_error_and_keeps_journal_readable(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_rows(tmp_path / "j", [make_row(index, tokens=700) for index in range(3)])
    output = run_child(DISK_FULL_CHILD, tmp_path / "j").communicate()[0].splitlines()
    error = next(line for line in output if line.startswith("ERROR"))
    assert str(tmp_path / "j" / ROWS_FILE) in error
    assert "File too large (EFBIG)" in error
    assert output[-2:] == ["STILL REFUSED", "CLOSED"]

    flushed = max(int(line) for line in output if line.isdigit())
    journal = Journal.read(tmp_path / "j")
    assert journal.done() == {RowKey(i, 0, 0) for i in range(flushed + 1)}  # no partial group
    with caplog.at_level(logging.WARNING), open_journal(tmp_path / "j"):
        pass
    assert "torn" not in caplog.text  # the failed group was already truncated away


BACKGROUND_FULL_CHILD = """
    import time
    journal = Journal.open(sys.argv[1], fingerprint=FINGERPRINT, recipe=RECIPE, flush_interval=0.02)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    limit = os.path.getsize(os.path.join(sys.argv[1], "rows-0-of-1.bin")) + 50_000
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    try:  # the background flusher runs into the limit; nobody calls flush()
        for index in range(100):
            journal.append(make_row(index, tokens=700))
        time.sleep(0.5)
        journal.close()
    except JournalError as error:
        print("RAISED", str(error).replace(chr(10), " "), flush=True)
"""


def test_background_write_error_is_raised_by_the_next_call(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The flusher thread's error surfaces in the writer: the next append, or close at the latest."""
    open_journal(tmp_path / "j").close()
    output = run_child(BACKGROUND_FULL_CHILD, tmp_path / "j").communicate()[0]
    assert output.startswith("RAISED cannot write the journal file")
    assert "EFBIG" in output

    rows = list(Journal.read(tmp_path / "j").iter_rows())
    assert rows == [make_row(index, tokens=700) for index in range(len(rows))]  # whole groups only
    with caplog.at_level(logging.WARNING), open_journal(tmp_path / "j"):
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
    """A 192 KiB tmpfs: a disk that really fills up (ENOSPC)."""
    mount_point = tmp_path / "tmpfs"
    mount_point.mkdir()
    _try_mount("-t", "tmpfs", "-o", "size=192k", "tmpfs", str(mount_point))
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=True)


def test_no_space_left_stops_with_journal_error_and_keeps_journal_readable(tiny_tmpfs: Path) -> None:
    directory = tiny_tmpfs / "j"
    journal = open_journal(directory, flush_interval=60)
    flushed = -1
    with pytest.raises(JournalError) as refused:
        for index in range(1000):
            journal.append(make_row(index, tokens=1000))
            journal.flush()
            flushed = index
    assert str(directory / ROWS_FILE) in str(refused.value)
    assert "No space left on device (ENOSPC)" in str(refused.value)
    with pytest.raises(JournalError, match="ENOSPC"):
        journal.append(make_row(2000))
    journal.close()  # the error was raised already: close releases without raising it again

    rows = list(Journal.read(directory).iter_rows())
    assert flushed > 0
    assert rows == [make_row(index, tokens=1000) for index in range(flushed + 1)]


@contextlib.contextmanager
def read_only(directory: Path) -> Iterator[str]:
    """Make ``directory`` unwritable by a real mechanism; yields the error name writes will get."""
    if os.geteuid() != 0:
        modes = {path: path.stat().st_mode for path in [directory, *directory.iterdir()]}
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
    write_rows(tmp_path / "j", rows)
    with read_only(tmp_path / "j") as error_name:
        with pytest.raises(JournalError) as refused:
            open_journal(tmp_path / "j")
        assert str(tmp_path / "j") in str(refused.value)
        assert f"({error_name})" in str(refused.value)
        assert list(Journal.read(tmp_path / "j").iter_rows()) == rows
        with pytest.raises(JournalError, match=error_name):
            open_journal(tmp_path / "j" / "new-journal")


# --- memory ----------------------------------------------------------------------------------------


def iteration_peaks(directory: Path) -> tuple[int, int]:
    """Peak Python (tracemalloc) and Arrow bytes allocated while iterating, after a warm-up pass."""
    reader = Journal.read(directory)
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


def test_index_is_small_and_iteration_memory_grows_only_by_the_index(tmp_path: Path) -> None:
    small, large = 5_000, 25_000
    for name, count in (("small", small), ("large", large)):
        with open_journal(tmp_path / name) as journal:
            for index in range(count):
                journal.append(make_row(count - 1 - index, tokens=100))  # ~850 bytes each
            journal.flush()
            assert journal._own is not None
            assert journal._own.nbytes() <= 40 * count  # no row data in the index

    python_small, arrow_small = iteration_peaks(tmp_path / "small")
    python_large, arrow_large = iteration_peaks(tmp_path / "large")
    extra_rows = large - small  # ~17 MB more rows; only the ~100 B/row index may show
    assert python_large - python_small < 128 * extra_rows, (python_small, python_large)
    assert arrow_large - arrow_small < 128 * extra_rows, (arrow_small, arrow_large)
    assert python_large < 8_000_000 and arrow_large < 8_000_000


def test_journal_root_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("EAGLE3_RAW_JOURNAL_DIR", str(tmp_path / "journals"))
    assert journal_root() == tmp_path / "journals"
    monkeypatch.delenv("EAGLE3_RAW_JOURNAL_DIR")
    assert journal_root() == Path.home() / ".cache" / "eagle3_raw" / "journals"
