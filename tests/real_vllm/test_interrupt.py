"""Ctrl-C during a build on the real vLLM: the client aborts its in-flight completions on the
server (``/inference/v1/abort_requests``, in the real server's access log), the server is left
running nothing of them, no aborted generation is a row, and the resumed build asks only for the
rows the journal lacks, once each (the completions the server's log shows)."""

from __future__ import annotations

import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

from eagle3_raw.journal import Journal
from eagle3_raw.recipe import load_recipe
from eagle3_raw.run.build import journal_dir_for
from tests.helpers import write_prompts, write_recipe
from tests.real_vllm.server import RealVLLM
from tests.reference.wire import wait_until
from tests.support.pace import scaled

PROMPTS = 16
MAX_NEW = 600  # ignore_eos: every answer is this long, a few seconds each at the tier's pace


def _log_count(server: RealVLLM, route: str) -> int:
    return server.log().count(f'"POST {route} HTTP/1.1" 200')


def _running(server: RealVLLM) -> float:
    with urllib.request.urlopen(server.url + "/metrics", timeout=scaled(30)) as response:
        lines = response.read().decode().splitlines()
    running = [line for line in lines if line.startswith("vllm:num_requests_running{")]
    return sum(float(line.rsplit(" ", 1)[1]) for line in running)


def test_ctrl_c_aborts_in_flight_completions_on_the_real_vllm_and_the_resume_is_exactly_once(
    tmp_path: Path, real_vllm: RealVLLM, vllm_model: Path
) -> None:
    write_prompts(tmp_path, PROMPTS)
    recipe = write_recipe(
        tmp_path, endpoints=[real_vllm.url], model={"tokenizer": str(vllm_model)},
        server={"max_in_flight": 4, "request_timeout": round(scaled(600))},
        sampling={"max_new_tokens": MAX_NEW, "temperature": 0.0, "ignore_eos": True},
    )  # fmt: skip
    args = [sys.executable, "-m", "eagle3_raw.cli", "build", str(recipe), "--quiet",
            "--journal-dir", str(tmp_path / "journals"), "--cache-dir", str(tmp_path / "cache")]  # fmt: skip
    completions = _log_count(real_vllm, "/v1/completions")
    aborts = _log_count(real_vllm, "/inference/v1/abort_requests")
    first = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    started = lambda: _log_count(real_vllm, "/v1/completions") >= completions + 2 and _running(real_vllm) > 0  # noqa: E731
    wait_until(started, timeout=600)
    first.send_signal(signal.SIGINT)
    _, err = first.communicate(timeout=scaled(120))
    assert first.returncode == 130 and "Run the same command again to resume" in err, err[-2000:]
    assert _log_count(real_vllm, "/inference/v1/abort_requests") > aborts, "no abort reached the server"
    wait_until(lambda: _running(real_vllm) == 0, timeout=60)  # nothing of the build left running
    directory = journal_dir_for(load_recipe(recipe), tmp_path / "journals")
    with Journal.read_dir(directory) as journal:
        kept = [row for row in journal.iter_rows()]
    assert 0 < len(kept) < PROMPTS
    assert all(len(row.output_ids) == MAX_NEW for row in kept)  # an aborted generation is no row

    before = _log_count(real_vllm, "/v1/completions")
    again = subprocess.run(args, capture_output=True, text=True, timeout=scaled(1200))
    assert again.returncode == 0, again.stderr[-2000:]
    asked = _log_count(real_vllm, "/v1/completions") - before
    assert asked == PROMPTS - len(kept)  # the missing rows, each once
    with Journal.read_dir(directory) as journal:
        rows = sorted(row.id for row in journal.iter_rows())
    assert len(rows) == PROMPTS and {row.id for row in kept} <= set(rows)
