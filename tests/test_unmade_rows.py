"""Which rows a set lacks, and why (issue 21 finding 6): ``eagle3-raw journals rows``, the counts
of ``journals list``, the build summary's reasons with row ids and its command.

Real reference servers on 127.0.0.1 (a context too short for some prompts; injected HTTP 500s),
real ``eagle3-raw`` processes. Which rows failed is read from the server's ledger (the rows it
answered), never from eagle3_raw's journal.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from eagle3_raw.journal.unmade import reason_group
from eagle3_raw.reference.ledger import read_ledger
from tests.helpers import generations, reference_server, rid_row_id, write_jsonl, write_recipe
from tests.support.pace import scaled

SHORT = [f"p{i}:1:0" for i in range(8)]
LONG = ["long-0:1:0", "long-1:1:0"]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "eagle3_raw.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=scaled(120))


def _prompts(work: Path) -> None:
    rows = [{"id": f"p{i}", "prompt": f"Tell me about owls number {i}."} for i in range(8)]
    rows += [{"id": f"long-{i}", "prompt": "word " * (400 + i)} for i in range(2)]  # > a 256 context
    rows.append({"id": "no-messages", "title": "a row with nothing to prompt"})  # refused whole
    write_jsonl(work / "prompts.jsonl", rows)


def _build(work: Path) -> tuple[subprocess.CompletedProcess[str], set[str], int]:
    """A build where the long prompts are skipped and the server answers some rows with HTTP 500
    (no retries): its process, the row ids the server answered, and how many 500s it sent."""
    _prompts(work)
    faults = ("--context-length", "256", "--faults", "http500=0.4", "--fault-seed", "3")
    with reference_server(work, *faults) as (server, ledger):
        recipe = write_recipe(work, endpoints=[server.url], server={"max_retries": 0})
        journal, cache = str(work / "j"), str(work / "c")
        built = _cli("build", str(recipe), "--quiet", "--journal-dir", journal, "--cache-dir", cache)
        answered = {rid_row_id(g["rid"]) for g in generations(ledger)}
        refused = sum(line.get("status") == 500 for line in read_ledger(ledger))
    return built, answered, refused


@pytest.mark.slow
def test_journals_rows_lists_exactly_the_failed_and_skipped_rows_with_their_reasons(tmp_path: Path) -> None:
    built, answered, refused = _build(tmp_path)
    assert built.returncode == 4, built.stderr[-3000:]  # rows failed for good
    failed = set(SHORT) - answered
    assert failed and answered and len(failed) == refused  # some rows failed, some did not
    config_id = next((tmp_path / "j" / "sets").iterdir()).name

    text = _cli("journals", "rows", config_id, "--journal-dir", str(tmp_path / "j"))
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), text.stdout
    listed = {line.split()[1]: line.split()[0] for line in lines[:-1] if not line.startswith(" ")}
    assert listed == {**dict.fromkeys(failed, "failed"), **dict.fromkeys(LONG, "skipped"),
                      "no-messages": "skipped"}, text.stdout  # fmt: skip
    assert lines[-1] == f"{len(failed) + 3} rows not in the set: {len(failed)} failed, 3 skipped"

    every = _json_rows(config_id, tmp_path)
    assert {r["id"]: r["kind"] for r in every} == {k: v for k, v in listed.items()}
    assert [r["index"] for r in every] == sorted(r["index"] for r in every)  # in source order
    by_id = {r["id"]: r for r in every}
    for row in (by_id[row_id] for row_id in failed):
        assert "HTTP 500" in row["reason"] and (row["turn"], row["sample"]) == (1, 0)
    for i, row_id in enumerate(LONG):  # the long-prompt reason names its row and its length
        assert by_id[row_id]["reason"].startswith(f"row {row_id} ({409 + i} prompt tokens): prompt too long")
    assert by_id["no-messages"]["turn"] is None and by_id["no-messages"]["index"] == 10
    assert "row 'no-messages'" in by_id["no-messages"]["reason"]

    only_failed = _json_rows(config_id, tmp_path, "--failed")
    assert {r["id"] for r in only_failed} == failed
    both = _json_rows(config_id, tmp_path, "--failed", "--skipped")
    assert both == every and _json_rows(config_id, tmp_path, "--ended") == []


def _json_rows(config_id: str, work: Path, *flags: str) -> list[dict[str, object]]:
    listed = _cli("journals", "rows", config_id, "--journal-dir", str(work / "j"), "--json", *flags)
    assert listed.returncode == 0, listed.stderr
    return [json.loads(line) for line in listed.stdout.splitlines()]


@pytest.mark.slow
def test_the_build_summary_names_reasons_row_ids_and_the_command_that_lists_them(tmp_path: Path) -> None:
    built, answered, _ = _build(tmp_path)
    failed = sorted(set(SHORT) - answered)
    summary = built.stdout
    # the long prompts differ in length, yet are one reason, with their row ids
    too_long = "2 x prompt too long, the server accepts at most 249 tokens (rows long-0:1:0, long-1:1:0)"
    assert too_long in summary
    shown = ", ".join(failed[:3]) + (", ..." if len(failed) > 3 else "")
    assert f"{len(failed)} x 1 attempt failed; last: HTTP 500 from" in summary
    assert f"(rows {shown})" in summary
    assert "row 'no-messages'" in summary  # a reason of one row: as written, naming it
    lines = summary.splitlines()
    made = next(i for i, line in enumerate(lines) if line.startswith("not made"))
    assert f"{len(failed) + 3} rows (3 skipped, {len(failed)} failed)" in lines[made]
    command = shlex.split(lines[made + 1])
    assert command[:3] == ["eagle3-raw", "journals", "rows"]
    again = _cli(*command[1:])  # exactly as printed, from another folder: the same listing
    config_id = command[3]
    direct = _cli("journals", "rows", config_id, "--journal-dir", str(tmp_path / "j"))
    assert again.returncode == 0 and again.stdout == direct.stdout and failed[0] in again.stdout


def _list(work: Path) -> subprocess.CompletedProcess[str]:
    return _cli("journals", "list", "--journal-dir", str(work / "j"), "--cache-dir", str(work / "c"))


@pytest.mark.slow
def test_journals_list_counts_failed_and_skipped_rows_and_names_the_command(tmp_path: Path) -> None:
    _, answered, _ = _build(tmp_path)
    failed = len(set(SHORT) - answered)
    listed = _list(tmp_path)
    assert listed.returncode == 0, listed.stderr
    config_id = next((tmp_path / "j" / "sets").iterdir()).name
    assert f"{len(answered)} rows ({failed} failed, 3 skipped)" in listed.stdout, listed.stdout
    assert f"eagle3-raw journals rows {config_id} lists the {failed + 3} rows not made" in listed.stdout


@pytest.mark.slow
def test_rows_of_a_set_that_is_not_there_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "j").mkdir()
    for config_id in ("t-0000", "../sets", ""):
        missing = _cli("journals", "rows", config_id, "--journal-dir", str(tmp_path / "j"))
        assert missing.returncode == 1 and "Traceback" not in missing.stderr, missing.stderr
        assert "has no set" in missing.stderr and "journals list" in missing.stderr


@pytest.mark.slow
def test_ended_rollout_turns_are_listed_with_ended(tmp_path: Path) -> None:
    """A rollout cut at max_new_tokens ends: its later turns are ``ended``, each with its row id."""
    turns = [
        {"role": "user", "content": "Tell me about rivers."},
        {"role": "assistant", "content": "Another model's answer."},
        {"role": "user", "content": "And about owls?"},
    ]
    write_jsonl(tmp_path / "chats.jsonl", [{"id": f"c{i}", "messages": turns} for i in range(2)])
    with reference_server(tmp_path) as (server, _):
        sampling = {"max_new_tokens": 4, "min_new_tokens": 4}
        recipe = write_recipe(tmp_path, endpoints=[server.url], source="chats.jsonl", turns="rollout",
                              sampling=sampling)  # fmt: skip
        built = _cli("build", str(recipe), "--quiet", "--journal-dir", str(tmp_path / "j"),
                     "--cache-dir", str(tmp_path / "c"))  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    config_id = next((tmp_path / "j" / "sets").iterdir()).name
    ended = _json_rows(config_id, tmp_path, "--ended")
    assert [(r["id"], r["kind"]) for r in ended] == [("c0:3:0", "ended"), ("c1:3:0", "ended")]
    assert all(r["reason"].startswith("length") for r in ended), ended
    assert _json_rows(config_id, tmp_path, "--failed", "--skipped") == []
    listed = _list(tmp_path)
    assert "(0 failed, 0 skipped, 2 ended)" in listed.stdout, listed.stdout


def test_reason_group_takes_off_only_the_naming_of_its_own_row() -> None:
    long = "row a:1:0 (5,000 prompt tokens): prompt too long, the server accepts at most 4,095 tokens"
    assert reason_group(long, "a:1:0") == "prompt too long, the server accepts at most 4,095 tokens"
    refused = "row 'a' turn 3: the server's chat path refused it (HTTP 400: bad roles)"
    assert reason_group(refused, "a:3:0") == "the server's chat path refused it (HTTP 400: bad roles)"
    assert reason_group("row 'x': duplicate id, first seen at row 2 (f:3)", "x") == (
        "duplicate id, first seen at row 2 (f:3)"
    )
    assert reason_group("row abc: no messages", "ab") == "row abc: no messages"  # another row's name
    assert reason_group("3 attempts failed; last: HTTP 500", "a:1:0") == "3 attempts failed; last: HTTP 500"
