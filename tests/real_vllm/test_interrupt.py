"""Ctrl-C during a build on the real vLLM: the client aborts its in-flight completions on the
server (``/inference/v1/abort_requests``, in the real server's access log), the server is left
running nothing of them, no aborted generation is a row, and the resumed build asks only for the
rows the journal lacks, once each (the completions its metrics count as finished)."""

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


def _samples(server: RealVLLM, name: str) -> list[tuple[str, float]]:
    """The server's Prometheus samples of metric ``name``: (labels, value)."""
    with urllib.request.urlopen(server.url + "/metrics", timeout=scaled(30)) as response:
        lines = response.read().decode().splitlines()
    samples = [line.rsplit(" ", 1) for line in lines if line.startswith(name + "{")]
    return [(labels, float(value)) for labels, value in samples]


def _running(server: RealVLLM) -> float:
    return sum(value for _, value in _samples(server, "vllm:num_requests_running"))


def _finished(server: RealVLLM) -> float:
    """Requests the server finished generating (an aborted one is not counted)."""
    done = _samples(server, "vllm:request_success_total")
    return sum(value for labels, value in done if 'reason="length"' in labels or 'reason="stop"' in labels)


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
    finished, aborts = _finished(real_vllm), _log_count(real_vllm, "/inference/v1/abort_requests")
    first = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_until(lambda: _finished(real_vllm) >= finished + 2 and _running(real_vllm) > 0, timeout=600)
    first.send_signal(signal.SIGINT)
    _, err = first.communicate(timeout=scaled(120))
    assert first.returncode == 130 and "Run the same command again to resume" in err, err[-2000:]
    wait_until(
        lambda: _log_count(real_vllm, "/inference/v1/abort_requests") > aborts, timeout=60
    )  # it aborted
    wait_until(lambda: _running(real_vllm) == 0, timeout=60)  # nothing of the build left running
    directory = journal_dir_for(load_recipe(recipe), tmp_path / "journals")
    with Journal.read_dir(directory) as journal:
        kept = [row for row in journal.iter_rows()]
    assert 0 < len(kept) < PROMPTS
    assert all(len(row.output_ids) == MAX_NEW for row in kept)  # an aborted generation is no row

    before = _finished(real_vllm)
    again = subprocess.run(args, capture_output=True, text=True, timeout=scaled(1200))
    assert again.returncode == 0, again.stderr[-2000:]
    assert _finished(real_vllm) - before == PROMPTS - len(kept)  # the missing rows, each generated once
    with Journal.read_dir(directory) as journal:
        rows = sorted(row.id for row in journal.iter_rows())
    assert len(rows) == PROMPTS and {row.id for row in kept} <= set(rows)
