"""What the progress line and the summary tell the user."""

from __future__ import annotations

from eagle3_raw.endpoints import Endpoint
from eagle3_raw.progress import RunStats, Summary, status_line


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
