"""A build inside someone else's program (issue 10): a running event loop, the host's signal
handlers, Ctrl-C through ``except Exception``, the open-file limit, and no journal I/O on the loop.

Every test drives a real build against a real reference server; interrupted builds run as real
processes, sent real signals.
"""

from __future__ import annotations

import asyncio
import builtins
import fcntl
import os
import re
import resource
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import datasets
import pytest

import eagle3_raw
from eagle3_raw.errors import Interrupted
from eagle3_raw.identity import Target, set_config_id
from eagle3_raw.recipe import load_recipe
from eagle3_raw.reference.ledger import read_ledger
from eagle3_raw.run.build import RunOptions, resolve, run
from tests.helpers import (
    generations,
    reference_server,
    requested_digests,
    row_digests,
    write_jsonl,
    write_prompts,
    write_recipe,
)  # fmt: skip
from tests.reference.wire import get, wait_until
from tests.support.pace import scaled

_HOST_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _load(recipe: Path, work: Path, name: str) -> datasets.Dataset:
    return eagle3_raw.load(
        str(recipe), cache_dir=str(work / f"{name}-cache"), journal_dir=work / f"{name}-journals",
        progress="none",
    )  # fmt: skip


def _same_rows(a: datasets.Dataset, b: datasets.Dataset) -> bool:
    return bool(a["id"] == b["id"] and a["input_ids"] == b["input_ids"] and a["loss_mask"] == b["loss_mask"])


def _target(recipe: Path, journals: Path) -> tuple[Target, str]:
    loaded = load_recipe(recipe)
    target = resolve(loaded, RunOptions(journal_dir=journals))
    return target, set_config_id(loaded, target)


# --- a running event loop ------------------------------------------------------------------------


@pytest.mark.slow
def test_load_inside_a_running_event_loop_gives_the_same_set_as_a_plain_call(tmp_path: Path) -> None:
    """As in a notebook cell: ``load`` called from a coroutine while its loop runs."""
    write_prompts(tmp_path, 12)
    with reference_server(tmp_path) as (server, ledger):
        recipe = write_recipe(tmp_path, endpoints=[server.url], sampling={"samples_per_prompt": 2})

        async def cell() -> tuple[datasets.Dataset, bool]:
            dataset = _load(recipe, tmp_path, "in-loop")
            await asyncio.sleep(0)  # the caller's loop is still usable afterwards
            return dataset, asyncio.get_running_loop().is_running()

        in_loop, loop_alive = asyncio.run(cell())
        asked_in_loop = len(generations(ledger))
        plain = _load(recipe, tmp_path, "plain")
    assert loop_alive and asked_in_loop == 24  # built from the server, not read from a cache
    assert len(generations(ledger)) == 48 and len(in_loop) == 24
    assert _same_rows(in_loop, plain)


# --- the host's signal handlers --------------------------------------------------------------------


class _Host:
    """A host program's own SIGINT and SIGTERM handlers and signal wakeup fd (as trio or Qt set one)."""

    def __init__(self) -> None:
        self.received: list[int] = []
        self.read_end, self.write_end = os.pipe()
        os.set_blocking(self.write_end, False)
        os.set_blocking(self.read_end, False)

    def handler(self, signum: int, frame: Any) -> None:
        self.received.append(signum)

    def __enter__(self) -> _Host:
        self._saved = {sig: signal.getsignal(sig) for sig in _HOST_SIGNALS}
        for sig in _HOST_SIGNALS:
            signal.signal(sig, self.handler)
        self._saved_fd = signal.set_wakeup_fd(self.write_end)
        return self

    def __exit__(self, *exc_info: object) -> None:
        signal.set_wakeup_fd(self._saved_fd)
        for sig, old in self._saved.items():
            signal.signal(sig, old)
        os.close(self.read_end)
        os.close(self.write_end)

    def assert_still_installed(self) -> None:
        """The handlers are the host's, and a signal really reaches them and the wakeup fd."""
        assert all(signal.getsignal(sig) == self.handler for sig in _HOST_SIGNALS)
        current = signal.set_wakeup_fd(self.write_end)
        assert current == self.write_end
        with _drained(self.read_end):
            self.received.clear()
            os.kill(os.getpid(), signal.SIGTERM)
            wait_until(lambda: self.received == [signal.SIGTERM], timeout=5)
            assert os.read(self.read_end, 16) == bytes([signal.SIGTERM])


class _drained:
    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __enter__(self) -> None:
        try:
            while os.read(self.fd, 4096):
                pass
        except BlockingIOError:
            pass

    def __exit__(self, *exc_info: object) -> None:
        pass


def _in_mode(mode: str, call: Callable[[], Any]) -> Any:
    """``call()`` from a plain program (``plain``) or from a coroutine of a running loop (``loop``)."""
    if mode == "plain":
        return call()

    async def cell() -> Any:
        return call()

    return asyncio.run(cell())


def _signal_when(ledger: Path, count: int, sig: int) -> threading.Thread:
    def send() -> None:
        wait_until(lambda: len(generations(ledger)) >= count, timeout=60)
        os.kill(os.getpid(), sig)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["plain", "loop"])
def test_the_hosts_signal_handlers_are_still_installed_after_a_build_and_after_an_interrupted_one(
    tmp_path: Path, mode: str
) -> None:
    write_prompts(tmp_path, 30)
    with (
        reference_server(tmp_path, "--slots", "2", "--ms-per-token", "2") as (server, ledger),
        _Host() as host,
    ):
        recipe = write_recipe(tmp_path, endpoints=[server.url], sampling={"max_new_tokens": 256})
        quick = load_recipe(recipe, {"prompts.limit": 2})
        _in_mode(mode, lambda: eagle3_raw.load(quick, cache_dir=str(tmp_path / "c1"), progress="none"))
        host.assert_still_installed()
        host.received.clear()
        sender = _signal_when(ledger, len(generations(ledger)) + 3, signal.SIGTERM)  # SIGTERM stops it too
        with pytest.raises(Interrupted, match="Run the same command again to resume"):
            _in_mode(mode, lambda: _load(recipe, tmp_path, "interrupted"))
        sender.join()
        assert signal.SIGTERM not in host.received  # the build had it, not the host
        host.assert_still_installed()
    _, config_id = _target(recipe, tmp_path / "interrupted-journals")
    assert 0 < len(row_digests(tmp_path / "interrupted-journals", config_id)) < 30


# --- Ctrl-C in a script that catches Exception -----------------------------------------------------

_SCRIPT = """
import asyncio, json, signal, sys
import eagle3_raw

recipe, cache, journals, mode = sys.argv[1:5]


def on_term(signum, frame):
    print("host SIGTERM handler", flush=True)


signal.signal(signal.SIGTERM, on_term)


def build():
    try:
        return eagle3_raw.load(recipe, cache_dir=cache, journal_dir=journals, progress="none")
    except Exception as exc:  # what a careful training script does around a data step
        print("SWALLOWED", type(exc).__name__, exc, flush=True)
        sys.exit(0)


def checked(call):
    before = {int(s): signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return call()
    finally:
        kept = {s: signal.getsignal(s) is h for s, h in before.items()}
        print("HANDLERS KEPT", json.dumps(kept, sort_keys=True), flush=True)


async def cell():
    return checked(build)


if mode == "loop":
    asyncio.run(cell())
else:
    checked(build)
print("COMPLETED", flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["plain", "loop"])
def test_ctrl_c_through_except_exception_ends_the_script_and_a_rerun_resumes(
    tmp_path: Path, mode: str
) -> None:
    """A script that wraps the build in ``except Exception`` is stopped by Ctrl-C (plain, and with
    the build on run_sync's thread inside a running loop): it ends with KeyboardInterrupt, the
    in-flight requests are aborted, the journal keeps what finished and a rerun asks only for the rest."""
    write_prompts(tmp_path, 40)
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(_SCRIPT))
    journals, cache = tmp_path / "journals", tmp_path / "cache"
    with reference_server(tmp_path, "--slots", "2", "--ms-per-token", "2") as (server, ledger):
        sampling = {"max_new_tokens": 256, "ignore_eos": True}  # 0.5 s a row, 2 at a time: 10 s in all
        recipe = write_recipe(tmp_path, endpoints=[server.url], sampling=sampling)
        child = subprocess.Popen(
            [sys.executable, str(script), str(recipe), str(cache), str(journals), mode],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        wait_until(lambda: len(generations(ledger)) >= 3 or child.poll() is not None, timeout=60)
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=scaled(60))
        # the script ends on an uncaught Interrupted (a KeyboardInterrupt subclass, so CPython exits
        # with 1 and its traceback, not by re-raising SIGINT as it does for KeyboardInterrupt itself)
        assert child.returncode == 1, err[-3000:]
        assert "SWALLOWED" not in out and "COMPLETED" not in out, out
        last_line = err.strip().splitlines()[-1]
        assert last_line.startswith("eagle3_raw.errors.Interrupted: interrupted:"), err[-3000:]
        assert 'HANDLERS KEPT {"2": true, "15": true}' in out, out  # SIGINT's and SIGTERM's
        aborted = [r for r in read_ledger(ledger) if (r.get("finish_reason") or {}).get("type") == "abort"]
        assert aborted, "the in-flight requests were not aborted on the server"
        target, config_id = _target(recipe, journals)
        kept = set(row_digests(journals, config_id).values())
        assert 0 < len(kept) < 40  # stopped mid-build, with what finished journaled
        asked_before = set(requested_digests(ledger, target))
        resumed = eagle3_raw.load(str(recipe), cache_dir=str(cache), journal_dir=journals, progress="none")
        asked = requested_digests(ledger, target)
        asked_by_rerun = [digest for rid, digest in asked.items() if rid not in asked_before]
        clean = _load(recipe, tmp_path, "clean")
    assert not kept & set(asked_by_rerun)  # nothing journaled was asked again
    assert len(asked_by_rerun) == 40 - len(kept) == len(set(asked_by_rerun))
    assert len(resumed) == 40 and _same_rows(resumed, clean)


# --- the open-file limit ---------------------------------------------------------------------------


def _nofile(soft: int, hard: int | None) -> Callable[[], None]:
    def apply() -> None:
        current_hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard if hard is not None else current_hard))

    return apply


def _soft_limit_of(pid: int) -> int | None:
    try:
        limits = Path(f"/proc/{pid}/limits").read_text()
    except OSError:
        return None
    match = re.search(r"^Max open files\s+(\d+)", limits, re.M)
    return int(match[1]) if match else None


def _many_in_flight_build(
    tmp_path: Path, hard: int | None
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any], list[int]]:
    """Build 600 rows with ``server.max_in_flight: 1024`` under a soft open-file limit of 256 (and
    that hard limit too when given); the result, the server's stats, the build's soft limits seen."""
    write_prompts(tmp_path, 600)
    slots = ("--slots", "8", "--ms-per-token", "5")
    with reference_server(tmp_path, *slots) as (server, _):  # the server keeps this process's limits
        recipe = write_recipe(
            tmp_path, endpoints=[server.url], server={"max_in_flight": 1024, "max_retries": 0},
            sampling={"max_new_tokens": 16, "ignore_eos": True},
        )  # fmt: skip
        command = [
            sys.executable, "-m", "eagle3_raw.cli", "build", str(recipe), "--quiet",
            "--journal-dir", str(tmp_path / "journals"), "--cache-dir", str(tmp_path / "cache"),
        ]  # fmt: skip
        build = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_nofile(256, hard)
        )  # fmt: skip
        seen: list[int] = []
        while build.poll() is None:
            limit = _soft_limit_of(build.pid)
            if limit is not None and (not seen or seen[-1] != limit):
                seen.append(limit)
            threading.Event().wait(0.02)
        out, err = build.communicate(timeout=scaled(120))
        stats = get(server.url, "/reference/stats").json()
    return subprocess.CompletedProcess(command, build.returncode, out, err), stats, seen


@pytest.mark.slow
def test_a_soft_open_file_limit_of_256_is_raised_for_1024_requests_in_flight(tmp_path: Path) -> None:
    result, stats, seen = _many_in_flight_build(tmp_path, hard=None)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "rows              600" in result.stdout and "Too many open files" not in result.stderr
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    assert seen[0] == 256 and seen[-1] == hard  # raised to the hard limit
    assert stats["slots"] + stats["max_queue_depth"] > 256  # more at once than 256 descriptors allow
    assert "keeping" not in result.stderr  # not clamped


@pytest.mark.slow
def test_under_a_hard_open_file_limit_of_256_in_flight_requests_are_clamped(tmp_path: Path) -> None:
    result, stats, _ = _many_in_flight_build(tmp_path, hard=256)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "rows              600" in result.stdout and "Too many open files" not in result.stderr
    clamped = r"1024 requests in flight need as many open files; .* keeping (\d+) in flight"
    match = re.search(clamped, result.stderr)
    assert match, result.stderr[-3000:]
    kept = int(match[1])
    assert kept <= 256 - 64
    peak = stats["slots"] + stats["max_queue_depth"]  # a request waits only when every slot is busy
    assert kept // 2 < peak <= kept, (peak, kept)


# --- journal I/O stays off the event loop ----------------------------------------------------------


class _LoopIO:
    """Records every file operation on the journal root made by code running on an event loop's thread."""

    _PATH_CALLS = ("open", "stat", "lstat", "scandir", "listdir", "unlink", "replace", "rename", "mkdir")
    _FD_CALLS = ("fsync", "pread", "pwrite", "write", "read", "ftruncate", "fstat", "close")

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.root = str(root)
        self.fds: set[int] = set()
        self.on_loop: list[str] = []
        self.off_loop = 0
        for name in self._PATH_CALLS:
            monkeypatch.setattr(os, name, self._by_path(name, getattr(os, name)))
        for name in self._FD_CALLS:
            monkeypatch.setattr(os, name, self._by_fd(name, getattr(os, name)))
        monkeypatch.setattr(builtins, "open", self._by_path("builtins.open", builtins.open))
        monkeypatch.setattr(fcntl, "flock", self._by_fd("flock", fcntl.flock))

    def _note(self, what: str) -> None:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            self.off_loop += 1
            return
        self.on_loop.append(what)

    def _ours(self, path: Any) -> bool:
        return isinstance(path, (str, os.PathLike)) and os.fspath(path).startswith(self.root)

    def _by_path(self, name: str, call: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(path: Any = ".", *args: Any, **kwargs: Any) -> Any:
            result = call(path, *args, **kwargs)
            if self._ours(path):
                self._note(f"{name}({path})")
                if name == "open" and isinstance(result, int):
                    self.fds.add(result)
            return result

        return wrapped

    def _by_fd(self, name: str, call: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(fd: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(fd, int) and fd in self.fds:
                self._note(f"{name}(fd {fd})")
                if name == "close":
                    self.fds.discard(fd)
            return call(fd, *args, **kwargs)

        return wrapped


@pytest.fixture
def loop_io(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[_LoopIO]:
    yield _LoopIO(tmp_path / "journals", monkeypatch)


@pytest.mark.slow
def test_no_journal_file_io_runs_on_the_event_loop_thread(tmp_path: Path, loop_io: _LoopIO) -> None:
    """Generations, reuses, skips, flushes, markers, summaries, a Ctrl-C's stop: every journal read,
    write, fsync, lock and close of a build, of its resume and of an interrupted one happens off the
    loop's thread."""
    rows = [{"id": f"p{i}", "prompt": f"Question {i}?"} for i in range(40)] + [{"id": "bad", "messages": 3}]
    write_jsonl(tmp_path / "prompts.jsonl", rows)
    options = RunOptions(journal_dir=tmp_path / "journals", progress="none")
    with reference_server(tmp_path) as (server, _):
        recipe = write_recipe(tmp_path, endpoints=[server.url], server={"max_in_flight": 4})
        first = run(load_recipe(recipe, {"prompts.limit": 20}), options)  # generates
        grown = run(load_recipe(recipe), options)  # another set: 20 reused by memo, 20 generated, 1 skip
    with reference_server(tmp_path, "--slots", "2", "--ms-per-token", "2") as (server, ledger):
        slow = load_recipe(recipe, {"server.endpoints": [server.url], "sampling.seed": 7,
                                    "sampling.max_new_tokens": 256})  # fmt: skip
        sender = _signal_when(ledger, 3, signal.SIGINT)
        with pytest.raises(Interrupted):  # stopping: aborts, the last flush, closing
            run(slow, options)
        sender.join()
    assert first.summary.run_rows == 20 and grown.summary.run_reused == 20 and grown.summary.run_rows == 20
    assert sum(grown.summary.skipped.values()) == 1
    assert loop_io.off_loop > 100  # the instrument saw the journal's I/O ...
    assert loop_io.on_loop == []  # ... and none of it on the loop


def test_the_loop_io_instrument_catches_io_on_the_loop(tmp_path: Path, loop_io: _LoopIO) -> None:
    """The check above can fail: a coroutine touching a journal file is caught."""
    (tmp_path / "journals").mkdir()

    async def careless() -> None:
        fd = os.open(tmp_path / "journals" / "x", os.O_CREAT | os.O_WRONLY, 0o600)
        os.fsync(fd)
        os.close(fd)

    asyncio.run(careless())
    assert [entry.split("(")[0] for entry in loop_io.on_loop] == ["open", "fsync", "close"]
