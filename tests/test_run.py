"""The run against real reference servers: where requests go, how many are in flight, the start-up
tokenizer check when ``/tokenize`` cannot answer, progress lines, and the summary (issues 3 and 6)."""

from __future__ import annotations

import logging
import os
import pty
import re
import select
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from eagle3_raw.builder import build
from eagle3_raw.errors import ServerMismatch
from eagle3_raw.recipe import load_recipe
from eagle3_raw.reference.ledger import read_ledger
from eagle3_raw.run.build import RunOptions, run
from tests.helpers import generations, reference_server, rid_row_id, write_jsonl, write_prompts, write_recipe
from tests.reference.wire import get
from tests.support.pace import scaled
from tests.support.router import Router


def _run(recipe: Path, tmp_path: Path, **options: Any) -> Any:
    defaults: dict[str, Any] = {"journal_dir": tmp_path / "journals", "progress": "none"}
    return run(load_recipe(recipe), RunOptions(**{**defaults, **options}))


def _source(rid: str) -> str:
    return rid_row_id(rid).split(":")[0]


@pytest.mark.slow
def test_samples_of_one_prompt_go_to_one_endpoint(tmp_path: Path) -> None:
    write_prompts(tmp_path, 40)
    # 80 ms a request, so both servers get work even on a busy machine; an in-flight limit neither
    # reaches, so a sibling never has to spill over to the other server (that is allowed when full)
    slow = ("--slots", "2", "--ms-per-token", "5")
    with (
        reference_server(tmp_path, *slow) as (a, ledger_a),
        reference_server(tmp_path, *slow) as (b, ledger_b),
    ):
        sampling = {"samples_per_prompt": 4, "max_new_tokens": 16, "ignore_eos": True}
        server = {"max_in_flight": 512}
        recipe = write_recipe(tmp_path, endpoints=[a.url, b.url], sampling=sampling, server=server)
        result = _run(recipe, tmp_path)
    assert result.summary.rows == 160
    servers_of: dict[str, set[str]] = defaultdict(set)
    for name, ledger in (("a", ledger_a), ("b", ledger_b)):
        for g in generations(ledger):
            servers_of[_source(g["rid"])].add(name)
    assert len(servers_of) == 40
    split = sorted(source for source, names in servers_of.items() if len(names) > 1)
    assert not split, f"samples of these prompts went to both servers (no prefix-cache hit): {split}"
    assert {n for names in servers_of.values() for n in names} == {"a", "b"}  # both did work


@pytest.mark.slow
def test_in_flight_default_follows_each_servers_max_running_requests(tmp_path: Path) -> None:
    """From ``--max-running-requests`` when passed; else from what the scheduler really runs
    (``internal_states``), since ``/server_info`` has null for a flag that was not passed."""
    write_prompts(tmp_path, 160)
    with (
        # 240 ms a request: long enough for the client to reach its limit even on a busy machine
        reference_server(tmp_path, "--slots", "4", "--ms-per-token", "10", "--max-running-requests", "8") as (
            a,
            _,
        ),
        reference_server(tmp_path, "--slots", "6", "--ms-per-token", "10") as (b, _),
    ):
        assert get(b.url, "/server_info").json()["max_running_requests"] is None
        sampling = {"max_new_tokens": 24, "ignore_eos": True}
        recipe = write_recipe(tmp_path, endpoints=[a.url, b.url], sampling=sampling)
        _run(recipe, tmp_path)
        stats = [get(s.url, "/reference/stats").json() for s in (a, b)]
    peaks = [s["max_queue_depth"] + s["slots"] for s in stats]
    # max_running_requests x 1.25 + 8 each: a full batch plus headroom, never more
    assert peaks == [int(8 * 1.25) + 8, int(6 * 1.25) + 8]


def _build(recipe: Path, tmp_path: Path, name: str) -> Any:
    options = {"journal_dir": tmp_path / f"journals-{name}", "progress": "none"}
    return build(recipe, cache_dir=tmp_path / f"cache-{name}", run_options=options)


@pytest.mark.slow
def test_behind_a_router_the_set_is_the_same_as_from_the_workers(tmp_path: Path) -> None:
    write_prompts(tmp_path, 30)
    greedy = {"temperature": 0, "max_new_tokens": 24}
    with reference_server(tmp_path) as (a, _), reference_server(tmp_path) as (b, _):
        direct = _build(write_recipe(tmp_path, endpoints=[a.url], sampling=greedy), tmp_path, "direct")
        with Router([a.url, b.url]) as router:
            routed = _build(
                write_recipe(tmp_path, endpoints=[router.url], sampling=greedy), tmp_path, "routed"
            )
        assert all(count > 0 for count in router.routed.values())  # both workers generated
    assert len(routed.dataset) == 30
    assert routed.dataset["input_ids"] == direct.dataset["input_ids"]


@pytest.mark.parametrize(("status", "refused"), [(404, False), (500, True), (400, True)])
def test_a_tokenizer_that_cannot_be_checked(
    tmp_path: Path, status: int, refused: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """No /tokenize at all (a router that does not forward it): a warning, and the run goes on.
    A /tokenize that fails: refused before any generation, naming the URL."""
    write_prompts(tmp_path, 3)
    with (
        reference_server(tmp_path) as (server, ledger),
        Router([server.url], tokenize_status=status) as router,
    ):
        recipe = write_recipe(tmp_path, endpoints=[router.url], server={"connect_timeout": 2})
        if refused:
            with pytest.raises(ServerMismatch, match=rf"cannot check that {re.escape(router.url)} tokenizes"):
                _run(recipe, tmp_path)
            assert generations(ledger) == []
        else:
            assert _run(recipe, tmp_path).summary.rows == 3
            assert f"{router.url} has no /tokenize" in caplog.text


def test_a_server_without_tokenizer_is_used_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_prompts(tmp_path, 3)
    with reference_server(tmp_path, "--skip-tokenizer-init") as (server, _):
        result = _run(write_recipe(tmp_path, endpoints=[server.url]), tmp_path)
    assert result.summary.rows == 3
    assert "--skip-tokenizer-init" in caplog.text


_LINE = re.compile(r"t: ([\d,]+)/(~?)([\d,]+|\?) rows")  # <recipe name>: <done>/<total> rows


@pytest.mark.slow
def test_log_mode_writes_completed_rows_of_an_estimated_total_with_an_eta(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_prompts(tmp_path, 300)  # more rows than the planner may queue ahead
    caplog.set_level(logging.INFO, logger="eagle3_raw.run.progress")
    with reference_server(tmp_path, "--slots", "8", "--ms-per-token", "2") as (server, _):
        recipe = write_recipe(  # rendered here: the planner, slower than the queue, has a total to estimate
            tmp_path, endpoints=[server.url], sampling={"samples_per_prompt": 2, "max_new_tokens": 24},
            model={"render": "local"},
        )  # fmt: skip
        result = _run(recipe, tmp_path, progress="log", log_interval=0.05)
    assert result.summary.rows == 600
    lines = [r.getMessage() for r in caplog.records if r.name == "eagle3_raw.run.progress"]
    assert lines.pop(0) == "t: started; progress every 0.05 s"
    parsed = [m.groups() for line in lines if (m := _LINE.match(line))]
    assert len(parsed) == len(lines) >= 3
    done = [int(d.replace(",", "")) for d, _, _ in parsed]
    assert done == sorted(done) and done[-1] <= 600  # completed rows, never more than exist
    totals = [(approx, int(t.replace(",", ""))) for _, approx, t in parsed if t != "?"]
    assert ("~", 600) in totals  # estimated long before the planner reached the end
    assert all(total == 600 for _, total in totals)  # 2 rows per prompt: the estimate is exact
    assert any("ETA" in line and "tok/s" in line for line in lines)


@pytest.mark.slow
def test_log_mode_is_visible_from_python_without_logging_setup(tmp_path: Path) -> None:
    write_prompts(tmp_path, 40)
    with reference_server(tmp_path, "--slots", "4", "--ms-per-token", "2") as (server, _):
        recipe = write_recipe(tmp_path, endpoints=[server.url], sampling={"max_new_tokens": 24})
        script = (
            "import eagle3_raw, sys; "
            f"eagle3_raw.load({str(recipe)!r}, cache_dir={str(tmp_path / 'c')!r}, "
            f"journal_dir={str(tmp_path / 'j')!r}, progress='log', log_interval=0.05)"
        )
        done = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=scaled(120)
        )
    assert done.returncode == 0, done.stderr
    assert re.search(r"\d+/~?40 rows \(", done.stderr), done.stderr


@pytest.mark.slow
def test_summary_of_a_dropping_recipe_counts_only_the_rows_of_the_set(tmp_path: Path) -> None:
    write_prompts(tmp_path, 12)
    with reference_server(tmp_path) as (server, _):
        sampling = {"max_new_tokens": 40, "samples_per_prompt": 3}
        recipe = write_recipe(tmp_path, endpoints=[server.url], on_truncation="drop", sampling=sampling)
        built = _build(recipe, tmp_path, "drop")
    assert built.run_result is not None
    summary, rows = built.run_result.summary, built.dataset
    assert summary.dropped > 0 and summary.rows == len(rows) == 36 - summary.dropped
    assert summary.prompt_tokens == sum(rows["prompt_len"])
    assert summary.generated_tokens == sum(
        len(ids) - n for ids, n in zip(rows["input_ids"], rows["prompt_len"], strict=True)
    )
    assert "length" not in summary.finish_reasons and sum(summary.finish_reasons.values()) == len(rows)


def _run_in_terminal(command: list[str], timeout: float = 120) -> tuple[int, str]:
    """Run ``command`` with a pseudo-terminal as stdout and stderr (as a user at a shell would);
    its exit code and output with the terminal control sequences removed."""
    master, slave = pty.openpty()
    env = {**os.environ, "COLUMNS": "200"}
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=env)
    os.close(slave)
    output, deadline = b"", time.monotonic() + timeout
    while time.monotonic() < deadline:
        if select.select([master], [], [], 0.5)[0]:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            output += chunk
        elif process.poll() is not None:
            break
    os.close(master)
    code = process.wait(timeout=scaled(10))
    return code, re.sub(rb"\x1b\[[0-9;?]*[a-zA-Z]", b"", output).decode(errors="replace")


@pytest.mark.slow
def test_the_bar_in_a_terminal_counts_completed_rows_with_rate_and_time_left(tmp_path: Path) -> None:
    write_prompts(tmp_path, 60)
    with reference_server(tmp_path, "--slots", "4", "--ms-per-token", "2") as (server, _):
        recipe = write_recipe(tmp_path, endpoints=[server.url], sampling={"max_new_tokens": 24})
        command = [
            sys.executable, "-m", "eagle3_raw.cli", "build", str(recipe),
            "--journal-dir", str(tmp_path / "j"), "--cache-dir", str(tmp_path / "c"),
        ]  # fmt: skip
        code, text = _run_in_terminal(command)
    assert code == 0, text[-2000:]
    frames = re.findall(r"t [━╸╺ ]+ (\d+)/(\d+) rows \d+% ETA (\S+)\s+([\d,]+) tok/s, (\d+) in flight", text)
    assert len(frames) >= 3, text[-2000:]
    done = [int(f[0]) for f in frames]
    assert done == sorted(done) and done[-1] == 60 and {int(f[1]) for f in frames} == {60}
    assert all(int(f[0]) + int(f[4]) <= 60 for f in frames)  # completed rows, not submitted ones
    assert any(int(f[4]) > 0 and int(f[0]) > 0 for f in frames)
    assert any(f[2] != "?" for f in frames)  # a time left was shown
    assert "rows              60" in text  # then the summary


@pytest.mark.slow
def test_prompts_near_the_limit_fit_a_speculative_servers_reserved_slots(tmp_path: Path) -> None:
    """An EAGLE-3 server reserves draft slots per request and counts them with the prompt: the
    client fits prompts and max_new_tokens (and min_new_tokens under it) to what is left."""
    rows = [{"id": f"w{k}", "prompt": "word " * k} for k in range(220, 320, 2)]
    write_jsonl(tmp_path / "prompts.jsonl", rows)
    speculative = ("--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3")
    speculative += ("--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "4")
    with reference_server(tmp_path, "--context-length", "300", *speculative) as (server, ledger):
        sampling = {"max_new_tokens": 64, "min_new_tokens": 16}
        built = _build(write_recipe(tmp_path, endpoints=[server.url], sampling=sampling), tmp_path, "spec")
        refused = [g for g in read_ledger(ledger) if g.get("status") == 400]
    assert built.run_result is not None
    summary, made = built.run_result.summary, built.dataset
    assert not summary.failed and not refused, summary.failed
    assert summary.skipped and all("accepts at most" in reason for reason in summary.skipped)
    fitted = [m["max_new_tokens"] for m in made["meta"] if m["max_new_tokens"] < 64]
    assert fitted and min(fitted) < 16  # some came close to the limit: min_new_tokens lowered too
    assert max(len(ids) for ids in made["input_ids"]) <= 300 - 6  # 6 slots reserved: max(2 x 3, 4)


@pytest.mark.slow
def test_a_server_whose_preferred_sampling_params_would_change_the_rows_is_refused(tmp_path: Path) -> None:
    write_prompts(tmp_path, 4)
    preferred = ("--preferred-sampling-params", '{"ignore_eos": true, "temperature": 0.1}')
    with reference_server(tmp_path, *preferred) as (server, ledger):
        recipe = write_recipe(tmp_path, endpoints=[server.url])
        with pytest.raises(
            ServerMismatch, match=r"preferred-sampling-params .*ignore_eos=True.*sampling\.ignore_eos"
        ):
            _run(recipe, tmp_path)
        assert generations(ledger) == []
        # temperature is sent on every request: only the key left out matters; set it, and it runs
        sampling = {"ignore_eos": False, "max_new_tokens": 200}
        result = _run(write_recipe(tmp_path, endpoints=[server.url], sampling=sampling), tmp_path)
    assert result.summary.rows == 4 and result.summary.finish_reasons.get("stop", 0) > 0


@pytest.mark.slow
def test_preferred_sampling_params_that_cannot_change_a_row_are_accepted(tmp_path: Path) -> None:
    write_prompts(tmp_path, 3)
    harmless = '{"sampling_seed": 5, "stream_interval": 4, "temperature": 0.1}'  # all sent by every job
    with reference_server(tmp_path, "--preferred-sampling-params", harmless) as (server, _):
        assert _run(write_recipe(tmp_path, endpoints=[server.url]), tmp_path).summary.rows == 3
    with (
        reference_server(tmp_path, "--preferred-sampling-params", '{"n": 2}') as (server, _),
        pytest.raises(ServerMismatch, match=r"n=2\); .*: restart the server without them"),
    ):  # a new journal: the set above is whole, and reading it back asks no server
        _run(write_recipe(tmp_path, endpoints=[server.url]), tmp_path, journal_dir=tmp_path / "other")
