"""What the progress line and the summary tell the user."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from eagle3_raw.run.endpoints import Endpoint
from eagle3_raw.run.progress import RunStats, Summary, status_line
from tests.helpers import reference_server, run_in_terminal, write_prompts, write_recipe
from tests.support.pace import scaled


def test_status_line_names_endpoints_that_are_down() -> None:
    stats = RunStats(rows=10, generated_tokens=5000, retries=3, failed=1, skipped=2)
    line = status_line(
        stats, [Endpoint("http://a:1", 8, in_flight=5), Endpoint("http://b:1", 8, healthy=False)]
    )
    assert "5 in flight" in line and "1/2 endpoints up (down: http://b:1)" in line
    assert "3 retries, 1 failed, 2 skipped" in line and "tok/s" in line


def test_summary_lists_counts_and_top_reasons() -> None:
    summary = Summary(
        rows=90, prompt_tokens=9000, generated_tokens=45000, finish_reasons={"stop": 80, "length": 10},
        dropped=0, skipped={"prompt has 5000 tokens; the server accepts at most 4089": 3},
        failed={"HTTP 400 from http://a:1: bad": 1}, wall_time=9.0, run_generated_tokens=45000, journal="/j",
        run_rows=40,
    )  # fmt: skip
    text = summary.render()
    assert "rows              90" in text and "finish reasons    length: 10, stop: 80" in text
    assert "skipped           3" in text and "3 x prompt has 5000 tokens" in text
    assert "failed            1" in text and "generated tok/s   5,000" in text
    assert "new rows          40 (generated this run" in text
    assert summary.to_dict()["generated_tokens_per_s"] == 5000.0


def _planned(stats: RunStats, indices: list[int], per_row: int = 1) -> RunStats:
    for index in indices:
        for _ in range(per_row):
            stats.note_planned(index)
    return stats


def test_the_total_is_estimated_from_the_rows_planned_per_source_row() -> None:
    fresh = _planned(RunStats(source_rows=1000), list(range(50)), per_row=2)
    assert fresh.total() == (2000, False)
    sharded = _planned(RunStats(source_rows=1000), list(range(1, 100, 2)))  # shard 1 of 2
    assert sharded.total()[0] in (499, 500, 501)
    # a resume after a kill: the first 600 rows were journaled, the planner starts at 600
    resumed = _planned(RunStats(source_rows=1000, replayed=600), list(range(600, 650)))
    assert resumed.total() == (1000, False)
    # a resume with scattered gaps (e.g. --retry-failed): one row in ten is missing
    scattered = _planned(RunStats(source_rows=1000, replayed=900), list(range(0, 300, 10)))
    assert scattered.total() == (1000, False)
    planned = _planned(RunStats(source_rows=1000, planned=7), [1, 2])
    assert planned.total() == (7, True)
    assert RunStats().total() == (None, False)  # nothing known yet


# --- where people run long jobs (issue 14) ----------------------------------------------------------

STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"


def _slow_build(tmp_path: Path, *extra: str) -> tuple[list[str], Any]:
    """A 600-row build against a server slow enough for several frames: more rows than the planner
    queues ahead, so the total stays an estimate (``~``) for most of the run."""
    write_prompts(tmp_path, 600)
    server = reference_server(tmp_path, "--slots", "8", "--ms-per-token", "4")
    return [
        sys.executable, "-m", "eagle3_raw.cli", "build", "RECIPE", "--journal-dir", str(tmp_path / "j"),
        "--cache-dir", str(tmp_path / "c"), *extra,
    ], server  # fmt: skip


def _with_recipe(command: list[str], tmp_path: Path, url: str) -> list[str]:
    recipe = write_recipe(
        tmp_path, endpoints=[url], sampling={"max_new_tokens": 8}, server={"max_in_flight": 8}
    )
    return [str(recipe) if part == "RECIPE" else part for part in command]


@pytest.mark.slow
def test_the_bar_at_80_columns_shows_the_row_count_the_bar_and_the_eta(tmp_path: Path) -> None:
    command, server = _slow_build(tmp_path)
    with server as (process, _):
        code, text = run_in_terminal(_with_recipe(command, tmp_path, process.url), columns=80)
    assert code == 0, text[-2000:]
    frames = re.findall(r"^t (━[━╸╺]*) +([\d,]+)/(~?)([\d,]+) rows +\d+% ETA (\S+)\r?$", text, re.MULTILINE)
    assert len(frames) >= 3, text[-3000:]
    assert all(len(bar) >= 10 for bar, *_ in frames)  # a real bar, not squeezed to nothing
    assert any(mark == "~" for _, _, mark, _, _ in frames)  # the estimate is marked while it is one
    assert frames[-1][1:4] == ("600", "", "600")  # then the exact total
    assert any(eta != "?" for *_, eta in frames)
    lines = re.split(r"[\r\n]+", text.split("rows              600")[0])
    assert max(map(len, lines)) <= 80  # nothing wraps: every frame fits the terminal
    assert re.search(r"^  [\d,]+ tok/s, \d+ in flight", text, re.MULTILINE)  # the status line under it
    assert "Generating train split" not in text  # datasets' own bar stays out of the summary


@pytest.mark.slow
def test_without_a_terminal_the_progress_is_timestamped_log_lines(tmp_path: Path) -> None:
    command, server = _slow_build(tmp_path, "--log-interval", "0.5")
    with server as (process, _):
        done = subprocess.run(
            _with_recipe(command, tmp_path, process.url), capture_output=True, text=True, timeout=scaled(120)
        )  # like nohup, CI or `| tee`: no terminal, and no --quiet
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert re.fullmatch(rf"{STAMP} t: started; progress every 0.5 s", lines[0]), lines[0]
    progress = [line for line in lines if re.match(rf"{STAMP} t: [\d,]+/~?[\d,]+ rows \(", line)]
    assert len(progress) >= 3, done.stderr
    assert any("/~" in line for line in progress) and "600/600 rows (100.0%)" in progress[-1]
    assert "━" not in done.stderr + done.stdout and "Generating train split" not in done.stderr
    assert done.stdout.startswith("rows              600\n")  # the summary, nothing before it


@pytest.mark.slow
def test_quiet_log_lines_have_timestamps_in_a_terminal_too(tmp_path: Path) -> None:
    command, server = _slow_build(tmp_path, "--quiet", "--log-interval", "0.5")
    with server as (process, _):
        code, text = run_in_terminal(_with_recipe(command, tmp_path, process.url), columns=80)
    assert code == 0, text[-2000:]
    assert len(re.findall(rf"^{STAMP} t: [\d,]+/~?[\d,]+ rows \(", text, re.MULTILINE)) >= 3, text[-2000:]
    assert "━" not in text


def test_library_warnings_print_once_and_the_length_warning_not_at_all(
    capfd: pytest.CaptureFixture[str],
) -> None:
    from eagle3_raw.reference.model_files import load_tokenizer
    from eagle3_raw.run.progress import configure_logging, quiet_libraries

    configure_logging()
    quiet_libraries()
    logging.getLogger("datasets.builder").warning("a datasets warning")
    logging.getLogger("huggingface_hub.file_download").warning("a hub warning")
    tokenizer = load_tokenizer()
    tokenizer.model_max_length = 8
    assert len(tokenizer("a long prompt " * 40)["input_ids"]) > 8
    err = capfd.readouterr().err
    assert err.count("a datasets warning") == 1 and err.count("a hub warning") == 1
    assert re.search(rf"{STAMP} WARNING datasets.builder: a datasets warning", err)
    assert "Token indices sequence length" not in err


def test_the_summary_says_when_rows_failed_for_good() -> None:
    summary = Summary(
        rows=8, prompt_tokens=80, generated_tokens=400, finish_reasons={"stop": 8}, dropped=0, skipped={},
        failed={"1 attempt failed; last: HTTP 500": 2}, wall_time=1.0, run_generated_tokens=400, journal="/j",
    )  # fmt: skip
    assert "not complete      2 rows failed for good and are not in the set; run the same command with " \
        "--retry-failed to try them again" in summary.render()  # fmt: skip
    ok = Summary(**{**summary.__dict__, "failed": {}})
    assert "not complete" not in ok.render()
