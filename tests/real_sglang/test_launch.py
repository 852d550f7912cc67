"""``server.launch: sglang`` starting the real SGLang: the recipe gives the CPU flags and
environment (``server.sglang.extra_args`` and ``env``) and keeps the default executable, this
Python's ``-m sglang.launch_server``, so the client runs on the real-SGLang venv's Python (as on a
GPU node, one environment holds both). Each test starts its own real server (30-130 s here).
"""

from __future__ import annotations

import json
import signal
import subprocess
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from eagle3_raw.journal import Journal
from eagle3_raw.recipe import load_recipe
from eagle3_raw.run.build import journal_dir_for
from tests.helpers import launched_port, write_prompts, write_recipe
from tests.real_sglang.conftest import Pace
from tests.real_sglang.server import (
    CPU_FLAGS,
    client_command,
    client_env,
    healthy,
    launch_section,
    processes_marked,
)
from tests.reference.wire import wait_until

KEY = "k-real-5c1e9a"
STARTUP = 900.0  # a bound on one real start (30-130 s here), not a wait


def _recipe(tmp_path: Path, model: Path, marker: str, *extra: str, prompts: int = 6, **server: Any) -> Path:
    write_prompts(tmp_path, prompts)
    section = {**launch_section(model, *extra, marker=marker), "connect_timeout": 10, **server}
    sampling = {"max_new_tokens": 48, "temperature": 0.0}
    model_section = {"tokenizer": str(model)}
    return write_recipe(tmp_path, endpoints=[], server=section, model=model_section, sampling=sampling)


@pytest.fixture
def builds(tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Start ``eagle3-raw build RECIPE`` on the venv's Python, its output in ``tmp_path/build.log``;
    a build still running at the end (a failed test) is killed, and its guard then stops its server."""
    started: list[subprocess.Popen[bytes]] = []

    def start(recipe: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        args = ("build", str(recipe), "--quiet", "--log-interval", "1", "--journal-dir",
                str(tmp_path / "journals"), "--cache-dir", str(tmp_path / "cache"))  # fmt: skip
        with (tmp_path / "build.log").open("wb") as out:
            command, environment = client_command(*args), client_env(env)
            started.append(subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=environment))
        return started[-1]

    yield start
    for build in started:
        if build.poll() is None:
            build.send_signal(signal.SIGCONT)
            build.kill()
            build.wait(30)


def _launched_url(build: subprocess.Popen[bytes], log: Path) -> str:
    """The URL of the server the build started, once it answers ``/health``."""
    wait_until(lambda: "starting the SGLang server" in log.read_text() or build.poll() is not None, 120)
    url = f"http://127.0.0.1:{launched_port(log.read_text())}"
    wait_until(lambda: healthy(url, timeout=10) or build.poll() is not None, timeout=STARTUP)
    assert build.poll() is None, log.read_text()[-3000:]
    return url


def _status(url: str, path: str, key: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url + path, headers=headers), timeout=30) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def test_launch_sglang_starts_the_real_server_builds_with_its_key_and_stops_it(
    tmp_path: Path, real_model: Path, pace: Pace, builds: Callable[..., subprocess.Popen[bytes]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setenv("E3_REAL_KEY", KEY)  # for this process's reading of the recipe, below
    marker = uuid.uuid4().hex
    recipe = _recipe(tmp_path, real_model, marker, api_key_env="E3_REAL_KEY")
    log = tmp_path / "build.log"
    build = builds(recipe, {"E3_REAL_KEY": KEY})
    url = _launched_url(build, log)
    build.send_signal(signal.SIGSTOP)  # hold the client while the launched server is looked at
    try:
        assert _status(url, "/model_info") == 401 and _status(url, "/model_info", KEY) == 200
        assert all(KEY not in Path(f"/proc/{pid}/cmdline").read_text() for pid in processes_marked(marker))
    finally:
        build.send_signal(signal.SIGCONT)
    assert build.wait(pace.seconds_for(6 * 48)) == 0, log.read_text()[-3000:]
    wait_until(lambda: not processes_marked(marker), timeout=60)  # stopped, scheduler and all
    assert KEY not in log.read_text()
    manifest = orjson.loads(next((tmp_path / "journals").glob("sets/*/manifest.json")).read_bytes())
    (launch,) = manifest["launches"].values()
    command = launch["command"]
    assert command.endswith(" ".join(CPU_FLAGS)) and " -m sglang.launch_server " in command
    assert manifest["server"]["server_info"]["version"] == "0.5.23"
    with Journal.read_dir(journal_dir_for(load_recipe(recipe), tmp_path / "journals")) as journal:
        assert len({row.id for row in journal.iter_rows()}) == 6


def test_kill_9_of_the_client_leaves_no_real_server_process(
    tmp_path: Path, real_model: Path, builds: Callable[..., subprocess.Popen[bytes]]
) -> None:
    marker = uuid.uuid4().hex
    build = builds(_recipe(tmp_path, real_model, marker, prompts=40))
    _launched_url(build, tmp_path / "build.log")
    assert len(processes_marked(marker)) >= 3  # the guard, the launcher, its scheduler and detokenizer
    build.send_signal(signal.SIGKILL)
    assert build.wait(30) == -signal.SIGKILL
    wait_until(lambda: not processes_marked(marker), timeout=60)  # the guard's SIGTERM, then SIGKILL at 20 s


def test_a_real_server_that_fails_to_start_is_reported_with_its_log(
    tmp_path: Path, real_model: Path, builds: Callable[..., subprocess.Popen[bytes]]
) -> None:
    marker = uuid.uuid4().hex
    build = builds(_recipe(tmp_path, real_model, marker, "--attention-backend", "no-such-backend"))
    assert build.wait(STARTUP) == 1
    text = (tmp_path / "build.log").read_text()
    assert "the SGLang server exited with code 2 before it answered /health" in text, text[-3000:]
    assert "invalid choice: 'no-such-backend'" in text  # the real server's own message, from its log
    assert not processes_marked(marker)


def test_a_real_server_whose_preferred_sampling_params_fill_a_key_is_refused_and_stopped(
    tmp_path: Path, real_model: Path, builds: Callable[..., subprocess.Popen[bytes]]
) -> None:
    marker = uuid.uuid4().hex
    preferred = json.dumps({"ignore_eos": True})  # a key eagle3_raw leaves out unless the recipe sets it
    build = builds(_recipe(tmp_path, real_model, marker, "--preferred-sampling-params", preferred))
    assert build.wait(STARTUP) == 1
    text = (tmp_path / "build.log").read_text()
    assert "was started with --preferred-sampling-params" in text and "ignore_eos=True" in text, text[-3000:]
    assert "set sampling.ignore_eos in the recipe" in text
    wait_until(lambda: not processes_marked(marker), timeout=60)
