"""Recipe-wide mistakes found before the rows (issue 21, finding 5): ``eagle3-raw validate`` checks
a recipe without generating it, a build checks its source before it starts a server, and a build
whose first rows all fail for one reason stops early, saying it once.

Against the reference server; what was sent is read from its ledger (one line per ``/generate``,
a refused one too).
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

import eagle3_raw
from eagle3_raw.errors import FatalError
from eagle3_raw.reference.ledger import read_ledger
from tests.helpers import (
    error_line,
    generations,
    ledgers_in,
    reference_server,
    requested_rids,
    run_main,
    sglang_section,
    write_jsonl,
    write_prompts,
    write_recipe,
)

BAD_BIAS = {"sampling": {"logit_bias": {"99999": 2.0}}}  # outside the 6,144-id vocabulary
EXTREME = {"model": {"reasoning_effort": "extreme"}}


def _places(tmp_path: Path) -> list[str]:
    return ["--journal-dir", str(tmp_path / "j"), "--cache-dir", str(tmp_path / "c")]


def _lines(out: str) -> dict[str, list[str]]:
    """Check name -> its lines (``<status> <name> <text>``)."""
    checks: dict[str, list[str]] = {}
    for line in out.splitlines():
        status, name, *_ = line.split()
        assert status in ("ok", "FAIL", "skip"), line
        checks.setdefault(name, []).append(line)
    return checks


@pytest.mark.slow
def test_validate_passes_on_the_demo_recipe(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(capsys, "validate", "demo", *_places(tmp_path))
    checks = _lines(out)
    assert code == 0, out
    for name in ("recipe", "prompts", "effort", "template", "render", "journal", "cache", "endpoint",
                 "target", "tokenizer", "sampling"):  # fmt: skip
        assert checks[name] and all(line.startswith("ok ") for line in checks[name]), out
    assert "renders through the server's chat path" in out  # the launched reference server's
    assert not (tmp_path / "j" / "sets").exists()  # nothing built


@pytest.mark.slow
def test_a_bad_logit_bias_is_caught_by_validate_on_one_small_request(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_prompts(tmp_path, 40)
    with reference_server(tmp_path) as (server, ledger):
        recipe = write_recipe(tmp_path, endpoints=[server.url], **BAD_BIAS)
        code, out, _ = run_main(capsys, "validate", str(recipe), *_places(tmp_path))
        sent = read_ledger(ledger)
    (sampling,) = _lines(out)["sampling"]
    assert code == 1 and sampling.startswith("FAIL  sampling  recipe field 'sampling.logit_bias'"), out
    assert "the server refuses it: HTTP 400" in sampling
    assert all(line.startswith("ok ") for line in _lines(out)["target"] + _lines(out)["render"]), out
    assert len(sent) == 1 and sent[0]["status"] == 400, sent  # one request, not the set
    assert sent[0]["body"]["sampling_params"]["max_new_tokens"] == 1
    assert not (tmp_path / "j" / "sets").exists()


@pytest.mark.slow
def test_a_build_with_a_bad_logit_bias_stops_after_the_first_requests_saying_it_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_prompts(tmp_path, 40)
    with reference_server(tmp_path) as (server, ledger):
        recipe = write_recipe(tmp_path, endpoints=[server.url], **BAD_BIAS)
        code, _, err = run_main(capsys, "build", str(recipe), "--quiet", *_places(tmp_path))
        line = error_line(err)
        assert code == 1 and "stopped early: the first 8 rows all failed for the same reason" in line, err
        assert "no row was generated" in line and line.count("logit_bias") == 1, line
        assert len(requested_rids(ledger)) == 8, read_ledger(ledger)  # not 40
        # the watch off (load_dataset's early_stop=0): every row is sent and fails on its own
        with pytest.raises(FatalError, match=r"produced no rows: 0 generated, 0 skipped, 40 failed"):
            eagle3_raw.load(str(recipe), cache_dir=str(tmp_path / "c"), journal_dir=tmp_path / "j",
                            progress="none", early_stop=0)  # fmt: skip
        assert len(requested_rids(ledger)) == 8 + 40  # the stopped build recorded none of its 8 as failed


@pytest.mark.slow
def test_fewer_rows_than_the_watch_all_failing_end_as_before(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_prompts(tmp_path, 3)
    with reference_server(tmp_path) as (server, _):
        recipe = write_recipe(tmp_path, endpoints=[server.url], **BAD_BIAS)
        code, _, err = run_main(capsys, "build", str(recipe), "--quiet", *_places(tmp_path))
    line = error_line(err)
    assert code == 1 and "produced no rows: 0 generated, 0 skipped, 3 failed" in line, err


@pytest.mark.slow
def test_early_failures_before_a_row_are_kept_once_rows_come(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows: list[dict[str, Any]] = [{"id": f"bad{i}", "messages": "not a list"} for i in range(3)]
    rows += [{"id": f"p{i}", "prompt": f"Say {i}."} for i in range(6)]
    write_jsonl(tmp_path / "prompts.jsonl", rows)
    with reference_server(tmp_path) as (server, ledger):
        recipe = write_recipe(tmp_path, endpoints=[server.url])
        code, out, err = run_main(capsys, "build", str(recipe), "--quiet", *_places(tmp_path))
    assert code == 0, err
    assert "rows              6" in out and "skipped           3" in out, out
    assert len(generations(ledger)) == 6


@pytest.mark.slow
def test_reasoning_effort_extreme_is_caught_by_validate_and_stops_a_build_early(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_prompts(tmp_path, 30)
    with reference_server(tmp_path) as (server, ledger):
        recipe = write_recipe(tmp_path, endpoints=[server.url], **EXTREME)
        code, out, _ = run_main(capsys, "validate", str(recipe), *_places(tmp_path))
        (effort,) = _lines(out)["effort"]
        assert code == 1 and effort.startswith("FAIL  effort    recipe field 'model.reasoning_effort'"), out
        assert "got 'extreme'" in effort and "'high'" in effort
        code, _, err = run_main(capsys, "build", str(recipe), "--quiet", *_places(tmp_path))
        line = error_line(err)
        assert code == 1 and "the first 8 rows were all skipped for the same reason" in line, err
        assert line.count("reasoning_effort") == 1 and "'p00" not in line, line  # one reason, no row ids
        assert generations(ledger) == []


def test_validate_local_contacts_no_server(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_prompts(tmp_path, 4)
    with socket.socket() as listener:  # an endpoint that would see any connection made to it
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        listener.setblocking(False)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        recipe = write_recipe(tmp_path, endpoints=[url], **EXTREME)
        code, out, _ = run_main(capsys, "validate", str(recipe), "--local", *_places(tmp_path))
        with pytest.raises(BlockingIOError):
            listener.accept()  # no connection is waiting
    checks = _lines(out)
    assert code == 1 and checks["effort"][0].startswith("FAIL"), out
    assert checks["server"] == ["skip  server    not contacted (--local)"]
    assert all(line.startswith("ok ") for line in checks["prompts"] + checks["journal"] + checks["cache"])


@pytest.mark.slow
@pytest.mark.parametrize("launch", ["reference", "sglang"])
def test_a_missing_prompt_source_is_reported_before_a_server_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, launch: str
) -> None:
    from eagle3_raw.launching import reference as reference_launch

    started: list[object] = []
    real = reference_launch.launch_reference

    def counted(**kwargs: Any) -> Any:  # the real launcher, counted
        started.append(kwargs)
        return real(**kwargs)

    monkeypatch.setattr(reference_launch, "launch_reference", counted)
    ledgers = tmp_path / "ledgers"
    server = {"endpoints": [], "launch": "reference"} if launch == "reference" else sglang_section(ledgers)
    recipe = write_recipe(tmp_path, endpoints=[], source="missing.jsonl", server=server,
                          sampling={"max_new_tokens": 8})  # fmt: skip
    code, _, err = run_main(capsys, "build", str(recipe), "--quiet", *_places(tmp_path))
    line = error_line(err)
    assert code == 1 and "prompt source 'missing.jsonl': no such file or folder" in line, err
    assert started == [] and not ledgers_in(ledgers)
    write_prompts(tmp_path, 2)  # the same build with its source: the server starts (the count works)
    code, _, err = run_main(capsys, "build", str(recipe), "--quiet", "--set", "prompts.source=prompts.jsonl",
                        *_places(tmp_path))  # fmt: skip
    assert code == 0, err
    assert len(started) == (launch == "reference") and len(ledgers_in(ledgers)) == (launch == "sglang")
