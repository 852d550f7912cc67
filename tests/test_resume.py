"""Never lose a generated token (issue 4): kills, faults, dying endpoints, identity, a full disk.

Builds run as real ``eagle3-raw build`` processes against real reference servers; the servers'
ledgers say what was really asked and answered.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pytest

import eagle3_raw
from eagle3_raw.errors import ServerUnreachable
from eagle3_raw.identity import Target, set_config_id
from eagle3_raw.journal import Journal, pack_key
from eagle3_raw.journal.generations import GenerationIndex, generations_dir
from eagle3_raw.launching.reference import launch_reference
from eagle3_raw.recipe import Recipe, load_recipe
from eagle3_raw.reference.ledger import read_ledger
from eagle3_raw.rows import RowKey
from eagle3_raw.run.build import RunOptions, journal_dir_for, resolve, run
from eagle3_raw.run.plan import KeySet
from tests.helpers import (
    generations,
    line_rid,
    reference_server,
    requested_digests,
    requested_rids,
    rid_attempt,
    rid_row_id,
    rid_run,
    row_digests,
    write_jsonl,
    write_prompts,
    write_recipe,
)  # fmt: skip
from tests.reference.wire import wait_until
from tests.support.pace import scaled

# Every test here builds, kills or resumes a set against a reference server started for it.
pytestmark = pytest.mark.slow


def _build_command(recipe: Path, work: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "eagle3_raw.cli", "build", str(recipe), "--quiet", "--log-interval", "1",
        "--journal-dir", str(work / "journals"), "--cache-dir", str(work / "cache"), *extra,
    ]  # fmt: skip


def _clean_build(recipe: Path, work: Path, **overrides: Any) -> datasets.Dataset:
    """The same recipe built once, uninterrupted, in its own cache and journal."""
    return eagle3_raw.load(
        str(recipe), cache_dir=str(work / "clean-cache"), journal_dir=work / "clean-journals",
        progress="none", **overrides,
    )  # fmt: skip


def _final(recipe: Path, work: Path) -> datasets.Dataset:
    result = subprocess.run(_build_command(recipe, work), capture_output=True, text=True, timeout=scaled(120))
    assert result.returncode == 0, result.stderr[-3000:]
    return eagle3_raw.load(
        str(recipe), cache_dir=str(work / "cache"), journal_dir=work / "journals", progress="none"
    )


def _assert_same_rows(built: datasets.Dataset, clean: datasets.Dataset) -> None:
    assert built["id"] == clean["id"]
    assert len(set(built["id"])) == len(built)
    assert built["input_ids"] == clean["input_ids"]
    assert built["loss_mask"] == clean["loss_mask"]


def _journaled_ids(recipe: Path | Recipe, work: Path) -> set[str]:
    directory = journal_dir_for(load_recipe(recipe), work / "journals")
    if not (directory / "manifest.json").exists():
        return set()
    with Journal.read_dir(directory) as journal:
        return {row.id for row in journal.iter_rows()}


def _indexed_bytes(directory: Path) -> int:
    """How much of the set's outcome index is on disk (it grows with every flush)."""
    return sum(path.stat().st_size for path in directory.glob("out-*.idx"))


def test_sigkilled_build_resumes_to_the_same_rows_without_asking_twice(tmp_path: Path) -> None:
    """Killed three times at random points, then resumed: by request digest, no generation the store
    held when a build started was asked again by it, the store holds each generation once, and every
    row is the generation of the same request as in an uninterrupted build."""
    write_prompts(tmp_path, 150)
    rng = random.Random(7)
    with reference_server(tmp_path, "--slots", "4", "--ms-per-token", "0.5") as (server, ledger):
        sampling = {"samples_per_prompt": 2, "max_new_tokens": 256}
        recipe = write_recipe(tmp_path, endpoints=[server.url], sampling=sampling)
        target, config_id = _target_of(recipe, tmp_path / "journals")
        set_dir = journal_dir_for(load_recipe(recipe), tmp_path / "journals")
        journaled: set[str] = set()
        builds: list[_Before] = []  # what each build started with, and its runs
        for _ in range(3):  # killed at a random point after a flush, three times over
            before = _Before.now(ledger, tmp_path / "journals", target, journaled)
            size = _indexed_bytes(set_dir)
            build = subprocess.Popen(
                _build_command(recipe, tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
            )
            wait_until(lambda: _indexed_bytes(set_dir) > size or build.poll() is not None, timeout=60)  # noqa: B023
            time.sleep(rng.uniform(0.0, 0.5))
            build.kill()
            assert build.wait() == -signal.SIGKILL, "the build finished before it could be killed"
            builds.append(before.runs_since(ledger))
            builds[-1].assert_not_asked_again(ledger, target)
            now = _journaled_ids(recipe, tmp_path)
            assert now > journaled, "the killed build journaled nothing new"
            journaled = now
        before = _Before.now(ledger, tmp_path / "journals", target, journaled)
        resumed = _final(recipe, tmp_path)
        builds.append(before.runs_since(ledger))
        for build_runs in builds:  # again: a killed build's late lines are in the ledger by now
            build_runs.assert_not_asked_again(ledger, target)
        clean = _clean_build(recipe, tmp_path)
    _assert_same_rows(resumed, clean)
    rows = row_digests(tmp_path / "journals", config_id)
    assert rows == row_digests(tmp_path / "clean-journals", config_id)  # the same request for every row
    store = GenerationIndex(generations_dir(tmp_path / "journals", target))
    assert len(store) == len(rows) == 300  # each generation kept once, though asked for across kills


def _target_of(recipe: Path, journals: Path) -> tuple[Target, str]:
    loaded = load_recipe(recipe)
    target = resolve(loaded, RunOptions(journal_dir=journals))
    return target, set_config_id(loaded, target)


@dataclass(frozen=True)
class _Before:
    """What a build started with (the ledger's rids so far, the rows journaled, a snapshot of the
    generation store) and, once it has run, the runs it made (the run part of their rids)."""

    asked: int
    journaled: set[str]
    store: GenerationIndex
    runs: frozenset[str] = frozenset()

    @classmethod
    def now(cls, ledger: Path, journals: Path, target: Target, journaled: set[str]) -> _Before:
        return cls(len(requested_rids(ledger)), journaled, GenerationIndex(generations_dir(journals, target)))

    def runs_since(self, ledger: Path) -> _Before:
        """With the runs first seen in the ledger after its first ``asked`` rids: the build started
        then. Not simply every line after ``asked``: the server may still write lines for the
        in-flight requests of a build killed before."""
        rids = requested_rids(ledger)
        runs = {rid_run(rid) for rid in rids[self.asked :]} - {rid_run(rid) for rid in rids[: self.asked]}
        return replace(self, runs=frozenset(runs))

    def assert_not_asked_again(self, ledger: Path, target: Target) -> None:
        """No row journaled, and no generation in the store, when the build started was requested
        by it: every request counts, answered or not, delivered or cut off, compared by row id and
        by request digest.

        Both were read after the previous build was killed, so they hold only what was flushed
        before that kill: a request the killed build had in flight may rightly be asked again."""
        asked = {rid: d for rid, d in requested_digests(ledger, target).items() if rid_run(rid) in self.runs}
        again = {rid_row_id(rid) for rid in asked} & self.journaled
        assert not again, sorted(again)[:10]
        held = self.store.has(np.array(list(asked.values()), "S16"))
        assert not held.any(), [rid for rid, h in zip(asked, held, strict=True) if h][:10]


def test_the_set_of_done_keys_answers_as_a_set_in_any_order() -> None:
    """KeySet, the planner's bookkeeping of done rows (8 bytes a key), looked up in key order (the
    planner's), in reverse and at random, with keys on both sides of every gap."""
    rng = random.Random(3)
    held = sorted(
        {RowKey(rng.randrange(3000), rng.randrange(-1, 6), rng.randrange(-1, 5)) for _ in range(5000)}
    )
    keys = KeySet(np.array([pack_key(k) for k in held], np.int64))
    every = [RowKey(i, t, s) for i in range(3002) for t in range(-1, 7) for s in range(-1, 6)]
    expected = set(held)
    for order in (every, every[::-1], rng.sample(every, len(every))):
        assert [k in keys for k in order] == [k in expected for k in order]
    assert len(keys) == len(held) and "p0:1:0" not in keys
    assert RowKey(0, 1, 0) not in KeySet(np.zeros(0, np.int64))


def test_faults_at_several_percent_give_the_same_set_as_a_clean_run(tmp_path: Path) -> None:
    write_prompts(tmp_path, 80)
    faults = "http500=0.04,http503=0.04,reset=0.04,abort=0.04,hang=0.02"
    with reference_server(tmp_path, "--faults", faults, "--fault-seed", "3") as (server, ledger):
        recipe = write_recipe(
            tmp_path, endpoints=[server.url],
            server={"request_timeout": 2, "max_retries": 12}, sampling={"samples_per_prompt": 2},
        )  # fmt: skip
        built = _final(recipe, tmp_path)
    injected = {r.get("fault") for r in read_ledger(ledger)} - {None}
    assert injected >= {"http500", "http503", "reset", "abort", "hang"}
    _assert_a_new_rid_per_attempt(ledger)
    with reference_server(tmp_path) as (clean_server, _):
        clean = _clean_build(recipe, tmp_path, **{"server.endpoints": [clean_server.url]})
    _assert_same_rows(built, clean)


def _assert_a_new_rid_per_attempt(ledger: Path) -> None:
    """Every request carried its own rid, and a row that met a fault was asked again under another."""
    rids = requested_rids(ledger)
    assert rids and len(set(rids)) == len(rids), [r for r in set(rids) if rids.count(r) > 1][:10]
    faulted = {line_rid(r) for r in read_ledger(ledger) if r.get("fault")} - {None}
    retried = [
        (rid, again) for rid in sorted(faulted) for again in rids
        if rid_row_id(again) == rid_row_id(rid) and rid_attempt(again) > rid_attempt(rid)
    ]  # fmt: skip
    assert retried, f"no row that met a fault was asked again: {sorted(faulted)[:10]}"


def test_an_endpoint_killed_mid_run_and_restarted_later(tmp_path: Path) -> None:
    # 200 generations of exactly 64 tokens at 4 ms a token on 4 slots: ~16 a second per endpoint, so
    # b alone has ~12 s of work after the kill, and a, restarted ~1-2 s after it, is back in the pool
    # at the next /health probe (1, 2.5, 4.75, 8.1 s after it was taken out) with work left for it.
    write_prompts(tmp_path, 100)
    slow = ("--slots", "4", "--ms-per-token", "4")
    with (
        reference_server(tmp_path, *slow) as (a, ledger_a),
        reference_server(tmp_path, *slow) as (b, ledger_b),
    ):
        sampling = {"samples_per_prompt": 2, "max_new_tokens": 64, "ignore_eos": True}
        recipe = write_recipe(tmp_path, endpoints=[a.url, b.url], sampling=sampling)
        build = subprocess.Popen(
            _build_command(recipe, tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        wait_until(lambda: len(generations(ledger_a)) >= 8 or build.poll() is not None, timeout=60)
        a.kill()
        served_by_b = len(generations(ledger_b))
        wait_until(
            lambda: len(generations(ledger_b)) >= served_by_b + 8 or build.poll() is not None, timeout=60
        )
        assert build.poll() is None, "the build finished before a was restarted"
        restarted_at = time.time()
        a.restart()
        _, stderr = build.communicate(timeout=scaled(120))
        log = stderr.decode()
        assert build.returncode == 0, log[-3000:]
        taken_out = log.find(f"endpoint {a.url} taken out")
        back = log.find(f"endpoint {a.url} answers /health again; back in the pool")
        assert 0 <= taken_out < back, log[-3000:]
        after_restart = [g for g in generations(ledger_a) if g["time"] >= restarted_at]
        assert after_restart, "the restarted endpoint was sent nothing"
        built = eagle3_raw.load(
            str(recipe), cache_dir=str(tmp_path / "cache"), journal_dir=tmp_path / "journals"
        )
    with reference_server(tmp_path) as (fast, _):  # the same rows, sooner
        clean = _clean_build(recipe, tmp_path, **{"server.endpoints": [fast.url]})
    assert len(built) == 200
    _assert_same_rows(built, clean)
    assert {rid_row_id(g["rid"]) for g in after_restart} <= set(built["id"])


def test_another_model_or_weights_never_reuses_a_row(tmp_path: Path) -> None:
    """Same recipe, same tokenizer: a server serving another model name or weights version makes
    another set, and every one of its rows is generated by it (none comes from the first model)."""
    write_prompts(tmp_path, 6)
    options = RunOptions(journal_dir=tmp_path / "journals", progress="none")
    ids = set()
    for args in (
        ("--served-model-name", "model-a"),
        ("--served-model-name", "model-b"),
        ("--served-model-name", "model-a", "--weight-version", "v2"),
    ):
        with reference_server(tmp_path, *args) as (server, ledger):
            recipe = load_recipe(write_recipe(tmp_path, endpoints=[server.url]))
            result = run(recipe, options)
        assert result.summary.run_rows == 6 and result.summary.run_reused == 0
        assert len({rid_row_id(g["rid"]) for g in generations(ledger)}) == 6  # all asked of this server
        ids.add(result.config_id)
    assert len(ids) == 3  # three sets: nothing mixes
    with reference_server(tmp_path, "--served-model-name", "model-b") as (server, ledger):
        again = run(load_recipe(write_recipe(tmp_path, endpoints=[server.url])), options)
    assert again.config_id in ids and generations(ledger) == []  # model-b's set is whole: read back


def test_a_smaller_context_regenerates_exactly_the_rows_whose_request_changed(tmp_path: Path) -> None:
    rows = [{"id": f"p{i}", "prompt": "word " * (4 * i + 2)} for i in range(12)]
    write_jsonl(tmp_path / "prompts.jsonl", rows)
    options = RunOptions(journal_dir=tmp_path / "journals", progress="none")
    sampling = {"max_new_tokens": 40, "temperature": 0.0}
    with reference_server(tmp_path) as (server, _):
        first = run(load_recipe(write_recipe(tmp_path, endpoints=[server.url], sampling=sampling)), options)
    with reference_server(tmp_path, "--context-length", "70") as (server, ledger):
        recipe = load_recipe(write_recipe(tmp_path, endpoints=[server.url], sampling=sampling))
        second = run(recipe, options)
        asked = {rid_row_id(g["rid"]) for g in generations(ledger)}
        small = eagle3_raw.load(recipe, journal_dir=tmp_path / "journals", progress="none",
                                cache_dir=str(tmp_path / "cache"))  # fmt: skip
        fresh = _clean_build(write_recipe(tmp_path, endpoints=[server.url], sampling=sampling), tmp_path)
    assert first.config_id != second.config_id
    fitted = {row["id"] for row in small if row["meta"]["max_new_tokens"] < 40}
    skipped = set(second.summary.skipped)
    assert fitted and asked == fitted  # only the rows whose fitted max_new_tokens changed were asked
    assert second.summary.run_reused == len(small) - len(fitted) and not skipped
    assert all(len(row["input_ids"]) <= 70 for row in small)  # no row of the other server's limits
    _assert_same_rows(small, fresh)


def _file_size_limit(limit: int) -> Callable[[], None]:
    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def test_a_journal_that_cannot_be_written_stops_the_build_and_stays_readable(tmp_path: Path) -> None:
    write_prompts(tmp_path, 120)
    with reference_server(tmp_path, "--slots", "4", "--ms-per-token", "0.5") as (server, _):
        sampling = {"max_new_tokens": 256, "ignore_eos": True}
        recipe = write_recipe(tmp_path, endpoints=[server.url], sampling=sampling)
        full = subprocess.run(
            _build_command(recipe, tmp_path), capture_output=True, text=True, timeout=scaled(120),
            preexec_fn=_file_size_limit(64 * 1024),
        )  # fmt: skip
        assert full.returncode == 1
        assert "error:" in full.stderr and "File too large (EFBIG)" in full.stderr, full.stderr[-2000:]
        kept = _journaled_ids(recipe, tmp_path)
        assert 0 < len(kept) < 120
        finished = _final(recipe, tmp_path)
    assert len(finished) == 120 and kept <= set(finished["id"])


def _interrupted_build(recipe: Path, work: Path, ledger: Path, signals: int) -> str:
    """Start a build, send it ``signals`` SIGINTs 50 ms apart once it has rows, and return its
    stderr after checking it exited with 130."""
    build = subprocess.Popen(_build_command(recipe, work), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_until(lambda: len(generations(ledger)) >= 3, timeout=60)
    for _ in range(signals):
        build.send_signal(signal.SIGINT)
        time.sleep(0.05)
    _, stderr = build.communicate(timeout=scaled(30))
    text = stderr.decode()
    assert build.returncode == 130, text[-2000:]
    return text


def test_ctrl_c_aborts_in_flight_requests_and_says_how_to_resume(tmp_path: Path) -> None:
    write_prompts(tmp_path, 12)
    with reference_server(tmp_path, "--slots", "2", "--ms-per-token", "2") as (server, ledger):
        recipe = write_recipe(tmp_path, endpoints=[server.url], sampling={"max_new_tokens": 256})
        text = _interrupted_build(recipe, tmp_path, ledger, signals=1)
        assert "aborting" in text and "Run the same command again to resume" in text
        assert "taken out" not in text and "down" not in text  # our own aborts are not endpoint faults
        aborted = [r for r in read_ledger(ledger) if (r.get("finish_reason") or {}).get("type") == "abort"]
        assert aborted, "no in-flight request was aborted on the server"
        kept = _journaled_ids(recipe, tmp_path)
        finished = _final(recipe, tmp_path)
    assert kept and kept <= set(finished["id"]) and len(finished) == 12


def test_a_second_ctrl_c_does_not_break_the_clean_stop(tmp_path: Path) -> None:
    """An impatient second Ctrl-C (or ``timeout``, which signals the process and its group) while
    the build aborts its requests: still every in-flight request aborted, no traceback."""
    write_prompts(tmp_path, 40)
    with reference_server(tmp_path, "--slots", "2", "--ms-per-token", "2") as (server, ledger):
        recipe = write_recipe(tmp_path, endpoints=[server.url], sampling={"max_new_tokens": 256})
        text = _interrupted_build(recipe, tmp_path, ledger, signals=2)
        assert "Run the same command again to resume" in text and "already stopping" in text
        for noise in ("Traceback", "never retrieved", "never awaited", "destroyed but it is pending"):
            assert noise not in text, text[-3000:]
        match = re.search(r"aborting (\d+) in-flight requests", text)
        assert match, text[-2000:]
        announced = int(match.group(1))

        def aborted() -> int:
            return sum((r.get("finish_reason") or {}).get("type") == "abort" for r in read_ledger(ledger))

        with contextlib.suppress(AssertionError):  # the server writes its lines as the aborts land
            wait_until(lambda: aborted() >= 0.8 * announced, timeout=10)
        # a request can finish on its own while its abort is on the way; losing the aborts lost ~half
        assert aborted() >= 0.8 * announced, (aborted(), announced)


def test_rows_that_fail_for_good_are_recorded_and_retried_on_request(tmp_path: Path) -> None:
    write_jsonl(
        tmp_path / "prompts.jsonl", [{"id": "ok", "prompt": "hi"}, {"id": "bad", "prompt": "hello there"}]
    )
    # stop strings are refused by a --skip-tokenizer-init server: a 400 for every request
    recipe = write_recipe(tmp_path, endpoints=["http://127.0.0.1:9"], sampling={"stop": ["\n\n"]})
    with reference_server(tmp_path, "--skip-tokenizer-init") as (server, ledger):
        moved = load_recipe(recipe, {"server.endpoints": [server.url]})
        options = RunOptions(journal_dir=tmp_path / "journals", progress="none")
        result = run(moved, options)
        assert sum(result.summary.failed.values()) == 2 and result.summary.rows == 0
        asked = len(generations(ledger))
        run(moved, options)
        assert len(generations(ledger)) == asked, "failed rows were asked again without --retry-failed"
    _assert_failures_retried(moved, tmp_path)


def test_a_resume_passes_over_done_source_rows_without_reading_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 26: a resume shows the planner only the source rows with a key still to make; the done
    ones are not parsed (past the rows the start-up checks sample). Failed rows retried on request
    are read again, and the set is the one an uninterrupted build makes; without plan records (an
    older journal) a rerun reads every row again and makes nothing twice."""
    import eagle3_raw.source.prompts as prompts_module
    from eagle3_raw.run.plan import Planner

    write_prompts(tmp_path, 260)
    with reference_server(tmp_path, "--faults", "http500=0.2", "--fault-seed", "5") as (server, _):
        recipe = write_recipe(
            tmp_path, endpoints=[server.url], server={"max_retries": 0}, sampling={"samples_per_prompt": 2}
        )
        first = run(load_recipe(recipe), RunOptions(journal_dir=tmp_path / "journals", progress="none"))
    failed_rows = {f["id"].split(":")[0] for f in _failure_records(recipe, tmp_path)}
    shutil.copytree(tmp_path / "journals", tmp_path / "old-journals")
    assert first.summary.failed and 0 < len(failed_rows) < 200
    shown: list[str] = []
    parsed: list[str] = []
    plan, parse = Planner.plan, prompts_module._parse_line

    def spy_plan(self: Planner, conversations: Any) -> Any:
        return plan(self, (c for c in conversations if shown.append(c.source_id) or True))

    monkeypatch.setattr(Planner, "plan", spy_plan)
    monkeypatch.setattr(prompts_module, "_parse_line", lambda line: parsed.append(line) or parse(line))
    with reference_server(tmp_path) as (clean_server, _):
        again = load_recipe(recipe, {"server.endpoints": [clean_server.url]})
        options = RunOptions(journal_dir=tmp_path / "journals", progress="none", retry_failed=True)
        resumed = run(again, options)
        monkeypatch.undo()
        assert sorted(shown) == sorted(failed_rows)  # the done rows never reach the planner
        late = {orjson_id(line) for line in parsed if int(orjson_id(line)[1:]) >= 200}  # past the checks
        assert late == {r for r in failed_rows if int(r[1:]) >= 200}
        assert resumed.summary.run_rows > 0 and not resumed.summary.failed
        for plans in journal_dir_for(again, tmp_path / "old-journals").glob("plan-*.bin"):
            plans.unlink()  # as an older journal has none
        monkeypatch.setattr(Planner, "plan", spy_plan)
        shown.clear()
        old = run(again, replace(options, journal_dir=tmp_path / "old-journals"))
        monkeypatch.undo()
        assert len(shown) == 260 and old.summary.run_rows == resumed.summary.run_rows  # all read, same work
        moved = {"server.endpoints": [clean_server.url]}
        built = [
            eagle3_raw.load(
                str(recipe),
                cache_dir=str(tmp_path / f"cache-{j}"),
                journal_dir=tmp_path / j,
                progress="none",
                **moved,
            )
            for j in ("journals", "old-journals")
        ]
        clean = _clean_build(recipe, tmp_path, **moved)
    for made in built:
        _assert_same_rows(made, clean)
    assert len(clean) == 520


def orjson_id(line: bytes) -> str:
    import orjson

    return str(orjson.loads(line)["id"])


def _failure_records(recipe: Path, work: Path) -> list[dict[str, Any]]:
    with Journal.read_dir(journal_dir_for(load_recipe(recipe), work / "journals")) as journal:
        return journal.failures()


def _assert_failures_retried(recipe: Any, work: Path) -> None:
    with reference_server(work) as (server, ledger):
        again = load_recipe(recipe, {"server.endpoints": [server.url]})
        options = RunOptions(journal_dir=work / "journals", progress="none", retry_failed=True)
        result = run(again, options)
    assert result.summary.rows == 2 and not result.summary.failed
    assert {rid_row_id(g["rid"]) for g in generations(ledger)} == {"ok:1:0", "bad:1:0"}


def test_with_every_endpoint_down_the_run_waits_for_one_then_gives_up_clearly(tmp_path: Path) -> None:
    write_prompts(tmp_path, 24)
    with reference_server(tmp_path, "--slots", "4", "--ms-per-token", "0.5") as (server, ledger):
        wait = round(scaled(20))  # long enough for the restart below, on a busy machine too
        recipe = write_recipe(tmp_path, endpoints=[server.url], server={"wait_for_server": wait})
        build = subprocess.Popen(
            _build_command(recipe, tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        wait_until(lambda: len(generations(ledger)) >= 5, timeout=60)
        server.kill()
        time.sleep(1.5)
        server.restart()  # back within the deadline: the run goes on
        _, stderr = build.communicate(timeout=scaled(120))
        assert build.returncode == 0, stderr.decode()[-2000:]
        assert f"every endpoint is down; waiting up to {wait} s".encode() in stderr
        # a new recipe (other seed), its only server killed for good mid-run: a clear error after 2 s
        short = load_recipe(recipe, {"server.wait_for_server": 2, "sampling.seed": 9})
        asked = len(generations(ledger))
        killer = threading.Thread(target=_kill_after, args=(server, ledger, asked + 5))
        killer.start()
        with pytest.raises(ServerUnreachable, match=r"no endpoint answered for 2 s"):
            run(short, RunOptions(journal_dir=tmp_path / "journals", progress="none"))
        killer.join()
        assert _journaled_ids(short, tmp_path)  # what finished before the end is kept
    assert len(_final(recipe, tmp_path)) == 24


def _kill_after(server: Any, ledger: Path, count: int) -> None:
    wait_until(lambda: len(generations(ledger)) >= count, timeout=60)
    server.kill()


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds it
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_an_endpoint_that_comes_back_as_another_model_stays_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_prompts(tmp_path, 200)
    slow = ("--slots", "4", "--ms-per-token", "1")
    caplog.set_level(logging.WARNING, logger="eagle3_raw")
    with (
        reference_server(tmp_path, *slow) as (a, _),
        reference_server(tmp_path, *slow) as (b, ledger_b),
    ):
        # a's requests wait while a is stopped: no timeout of theirs may end the run meanwhile
        patient = {"request_timeout": 3600}
        recipe = load_recipe(write_recipe(tmp_path, endpoints=[a.url, b.url], server=patient))
        impostors: list[Any] = []

        def swap() -> None:  # b dies mid-run; another model comes up on its port
            wait_until(lambda: len(generations(ledger_b)) >= 5, timeout=60)
            os.kill(a.process.pid, signal.SIGSTOP)  # the run cannot finish before b's probe has run
            try:
                b.kill()
                wait_until(lambda: _port_free(b.port), timeout=30)
                impostor = ["--served-model-name", "impostor", *slow]
                impostors.append(launch_reference(port=b.port, args=impostor))
                wait_until(lambda: "stays out" in caplog.text, timeout=60)  # the re-admission probe ran
            finally:
                os.kill(a.process.pid, signal.SIGCONT)

        swapper = threading.Thread(target=swap)
        swapper.start()
        try:
            result = run(recipe, RunOptions(journal_dir=tmp_path / "journals", progress="none"))
        finally:
            swapper.join()
            for impostor in impostors:
                impostor.stop()
        assert impostors, "the impostor never came up"
    assert result.summary.rows == 200 and not result.summary.failed
    assert "stays out" in caplog.text and "impostor" in caplog.text


# --- a full journal disk (issue 21 finding 2) -----------------------------------------------------


@contextlib.contextmanager
def _tiny_disk(folder: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` at ``folder``: a disk that really fills up (ENOSPC). Root only (mount);
    RLIMIT_FSIZE, the non-root way, gives EFBIG, a write error that is not a full disk."""
    if os.geteuid() != 0:
        pytest.skip("a disk that really fills up needs a tmpfs mount: root only")
    folder.mkdir(parents=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                             capture_output=True, text=True)  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount here: {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)


def _fill(disk: Path) -> Path:
    filler = disk / "filler"
    with contextlib.suppress(OSError), filler.open("wb", buffering=0) as f:
        while True:
            f.write(b"\0" * 4096)
    return filler


class _Stderr(threading.Thread):
    """The lines a process writes to stderr, read as they come."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        super().__init__(daemon=True)
        self.process = process
        self.lines: list[str] = []
        self.start()

    def run(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(line)

    def finish(self, timeout: float = 120) -> str:
        """Wait for the process to exit (and its stderr to be read); its stdout."""
        assert self.process.stdout is not None
        out = self.process.stdout.read()
        self.process.wait(timeout=timeout)
        self.join(timeout=timeout)
        return out

    def has(self, text: str) -> bool:
        return any(text in line for line in self.lines)

    @property
    def text(self) -> str:
        return "".join(self.lines)


def _disk_build(recipe: Path, work: Path, *extra: str) -> tuple[subprocess.Popen[str], _Stderr]:
    command = [
        sys.executable, "-m", "eagle3_raw.cli", "build", str(recipe), "--quiet", "--log-interval", "0.5",
        "--journal-dir", str(work / "disk" / "j"), "--cache-dir", str(work / "cache"), *extra,
    ]  # fmt: skip
    environment = {**os.environ, "EAGLE3_RAW_SPILL_DIR": str(work / "spill")}
    build = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment
    )
    return build, _Stderr(build)


# rows of ~5 KB, above a page: a full disk's slack (the unfilled end of a file's last block) takes
# at most one at a time, so the disk stays full once the test fills it
_BIG_ROWS = {"max_new_tokens": 1200, "ignore_eos": True}
_BIG_AND_SLOW = ("--slots", "2", "--ms-per-token", "0.2")


def _asked_once(ledger: Path, rows: int) -> None:
    """Every row was generated exactly once over every run: nothing held was lost and regenerated."""
    asked = [rid_row_id(g["rid"]) for g in generations(ledger)]
    assert len(asked) == len(set(asked)) == rows, (len(asked), len(set(asked)))


def test_a_full_journal_disk_is_shown_and_its_rows_are_written_when_space_comes_back(tmp_path: Path) -> None:
    write_prompts(tmp_path, 80)
    with reference_server(tmp_path, *_BIG_AND_SLOW) as (server, ledger), _tiny_disk(
        tmp_path / "disk", "2m"
    ) as disk:  # fmt: skip
        recipe = write_recipe(tmp_path, endpoints=[server.url], sampling=_BIG_ROWS)
        build, stderr = _disk_build(recipe, tmp_path)
        wait_until(lambda: len(generations(ledger)) >= 10, timeout=60)
        filler = _fill(disk)
        wait_until(lambda: stderr.has("JOURNAL DISK FULL"), timeout=60)  # the progress line says it
        assert stderr.has("the journal's disk is full") and stderr.has("no new request is sent")
        asked = len(generations(ledger))
        wait_until(lambda: stderr.text.count("JOURNAL DISK FULL") >= 3, timeout=60)
        assert len(generations(ledger)) - asked <= 12  # paused: at most those in flight finished
        filler.unlink()  # space comes back
        out = stderr.finish()
        assert build.returncode == 0, stderr.text[-3000:]
        assert stderr.has("space is back on the journal's disk")
        assert re.search(r"journal disk +full for \d+ s this run: up to \d+ generated rows held", out), out
        assert "rows              80" in out
        _asked_once(ledger, 80)


def test_a_journal_disk_full_for_too_long_stops_spills_and_the_rerun_takes_the_rows_back(
    tmp_path: Path,
) -> None:
    write_prompts(tmp_path, 80)
    with reference_server(tmp_path, *_BIG_AND_SLOW) as (server, ledger), _tiny_disk(
        tmp_path / "disk", "2m"
    ) as disk:  # fmt: skip
        recipe = write_recipe(tmp_path, endpoints=[server.url], sampling=_BIG_ROWS)
        build, stderr = _disk_build(recipe, tmp_path, "--disk-wait", "2")
        wait_until(lambda: len(generations(ledger)) >= 10, timeout=60)
        filler = _fill(disk)
        stderr.finish()
        assert build.returncode == 1, stderr.text[-3000:]
        error = next(line for line in stderr.lines if line.startswith("error:"))
        assert "the journal's disk has had no space for 2 s (--disk-wait): stopping" in error
        held = int(
            re.search(r"(\d+) generated rows held in memory were written to the spill folder", error)[1]
        )  # type: ignore[index]
        assert held > 0
        assert str(tmp_path / "spill") in error and "run the same command again" in error
        assert list((tmp_path / "spill").rglob("gen-*.bin"))
        with Journal.read_dir(journal_dir_for(load_recipe(recipe), tmp_path / "disk" / "j")) as journal:
            journaled = {row.id for row in journal.iter_rows()}
        asked = {rid_row_id(g["rid"]) for g in generations(ledger)}
        assert len(asked - journaled) == held  # what the disk had no room for, and no more

        filler.unlink()
        rerun, stderr = _disk_build(recipe, tmp_path)
        out = stderr.finish()
        assert rerun.returncode == 0, stderr.text[-3000:]
        assert stderr.has("took back") and "rows              80" in out, stderr.text + out
        assert not list((tmp_path / "spill").rglob("*.bin"))  # taken back, then removed
        _asked_once(ledger, 80)  # the held rows were not generated again


def test_a_resumed_build_counts_the_rows_its_journal_held_and_the_bar_ends_at_100(tmp_path: Path) -> None:
    """Issue 21 finding 8: after a resume, rows = journaled + new + reused, and the bar's total is
    the summary's."""
    write_prompts(tmp_path, 40)
    with reference_server(tmp_path, "--slots", "2", "--ms-per-token", "2") as (server, ledger):
        recipe = write_recipe(tmp_path, endpoints=[server.url], sampling={"max_new_tokens": 64})
        _interrupted_build(recipe, tmp_path, ledger, signals=1)
        held = len(_journaled_ids(recipe, tmp_path))
        resumed = subprocess.run(
            _build_command(recipe, tmp_path), capture_output=True, text=True, timeout=120
        )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    out = resumed.stdout

    def count(name: str) -> int:
        found = re.search(rf"^{name} +([\d,]+)", out, re.M)
        assert found is not None, (name, out)
        return int(found[1].replace(",", ""))

    assert 0 < held < 40 and count("journaled rows") == held
    assert count("rows") == 40 == count("journaled rows") + count("new rows") + count("reused rows")
    last = [line for line in resumed.stderr.splitlines() if " rows (" in line][-1]
    assert "40/40 rows (100.0%)" in last, last
