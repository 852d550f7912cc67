"""Ctrl-C during a build on the real SGLang: the client aborts its in-flight requests on the server
(``/abort_request``; the real server's own request log shows them finished with ``abort``), and the
resumed build asks only for the rows the journal lacks, once each."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from eagle3_raw.journal import Journal
from eagle3_raw.recipe import load_recipe
from eagle3_raw.run.build import journal_dir_for
from tests.helpers import rid_row_id, rid_run, write_prompts, write_recipe
from tests.real_sglang.conftest import Pace
from tests.real_sglang.server import RealSGLang
from tests.reference.wire import wait_until

PROMPTS = 40
MAX_NEW = 1500  # the reference model's answers end at their own EOS, most of them long before this


def _events(server: RealSGLang, run: str | None, event: str) -> list[dict[str, object]]:
    """The real server's request-log events of one kind for this test's requests (``run``: only
    one run's, by the part of the rid unique to the run)."""
    return [
        e for e in server.requests()
        if e.get("event") == event and str(e.get("rid", "")).startswith("ctrl-c-")
        and (run is None or rid_run(str(e["rid"])) == run)
    ]  # fmt: skip


def _finish(event: dict[str, object]) -> str:
    out = event.get("out")
    meta = out.get("meta_info", {}) if isinstance(out, dict) else {}
    reason = meta.get("finish_reason") if isinstance(meta, dict) else None
    return str(reason.get("type")) if isinstance(reason, dict) else str(reason)


def test_ctrl_c_aborts_in_flight_requests_on_the_real_server_and_the_resume_is_exactly_once(
    tmp_path: Path, real_server: RealSGLang, real_model: Path, pace: Pace
) -> None:
    source = write_prompts(tmp_path, PROMPTS)
    source.write_text(source.read_text().replace('"id":"p', '"id":"ctrl-c-p'))
    # an attempt may take as long as six answers at the measured pace: no retry for a slow one
    server = {"max_in_flight": 6, "request_timeout": pace.seconds_for(6 * MAX_NEW)}
    recipe = write_recipe(
        tmp_path, endpoints=[real_server.url], model={"tokenizer": str(real_model)}, server=server,
        sampling={"max_new_tokens": MAX_NEW, "temperature": 0.0},
    )  # fmt: skip
    args = [sys.executable, "-m", "eagle3_raw.cli", "build", str(recipe), "--quiet",
            "--journal-dir", str(tmp_path / "journals"), "--cache-dir", str(tmp_path / "cache")]  # fmt: skip
    first = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_until(
        lambda: len(_events(real_server, None, "request.finished")) >= 4,
        timeout=pace.seconds_for(4 * MAX_NEW),
    )
    first.send_signal(signal.SIGINT)
    _, err = first.communicate(timeout=120)
    assert first.returncode == 130 and "Run the same command again to resume" in err, err[-2000:]
    (run,) = {rid_run(str(e["rid"])) for e in _events(real_server, None, "request.received")}
    aborted = [e for e in _events(real_server, run, "request.finished") if _finish(e) == "abort"]
    assert aborted, "no request of the interrupted build was aborted on the server"
    directory = journal_dir_for(load_recipe(recipe), tmp_path / "journals")
    with Journal.read_dir(directory) as journal:
        kept = {row.id for row in journal.iter_rows()}
    assert kept and not {rid_row_id(str(e["rid"])) for e in aborted} & kept  # an aborted row is no row

    again = subprocess.run(args, capture_output=True, text=True, timeout=pace.seconds_for(PROMPTS * MAX_NEW))
    assert again.returncode == 0, again.stderr[-2000:]
    second = {rid_run(str(e["rid"])) for e in _events(real_server, None, "request.received")} - {run}
    (resumed,) = second
    asked = [rid_row_id(str(e["rid"])) for e in _events(real_server, resumed, "request.received")]
    twice = {row for row in asked if asked.count(row) > 1}
    finished = [
        (e["rid"], _finish(e)) for e in _events(real_server, resumed, "request.finished")
        if rid_row_id(str(e["rid"])) in twice
    ]  # fmt: skip
    assert not set(asked) & kept and not twice, (
        finished,
        again.stderr[-3000:],
    )  # the missing rows, each once
    with Journal.read_dir(directory) as journal:
        assert sorted(row.id for row in journal.iter_rows()) == sorted(kept | set(asked))
        assert len(kept | set(asked)) == PROMPTS
