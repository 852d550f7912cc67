"""``launch_reference``: a server on a free loopback port, restarts on the same port, clear failures."""

from __future__ import annotations

import contextlib
import inspect
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from eagle3_raw.errors import RecipeError, ServerUnreachable
from eagle3_raw.launching.reference import free_port, launch_reference, recipe_endpoints
from eagle3_raw.recipe import load_recipe
from tests.helpers import write_prompts, write_recipe
from tests.reference.conformance import Conformance
from tests.reference.wire import get
from tests.support.pace import scaled


def test_a_launched_server_answers_and_stops() -> None:
    with launch_reference() as server:
        assert server.url == f"http://127.0.0.1:{server.port}"
        assert get(server.url, "/health").status == 200
    assert server.process.poll() is not None
    assert not server.log_path.exists()


@pytest.mark.slow
def test_restart_keeps_the_port_and_the_options() -> None:
    with launch_reference(args=["--context-length", "512"]) as server:
        port, first = server.port, server.process.pid
        server.restart()
        assert server.port == port and server.process.pid != first
        assert get(server.url, "/v1/models").json()["data"][0]["max_model_len"] == 512


@pytest.mark.slow
def test_the_server_answers_health_within_3_s_of_its_start() -> None:
    """The issue's startup budget; the best of two launches, so one slow moment on CI does not fail it."""
    seconds = []
    for _ in range(2):
        started = time.monotonic()
        with launch_reference():  # returns once /health answers 200 (polled every 50 ms)
            seconds.append(time.monotonic() - started)
    assert min(seconds) < scaled(3.0), seconds  # 3 s on an idle machine


def test_the_start_up_limit_is_a_recipe_setting_with_a_generous_default(tmp_path: Path) -> None:
    """Issue 21, finding 10: 10 s, fixed, failed builds on a loaded laptop; now ``server.startup_timeout``
    (300 s unless set) bounds the wait of ``launch: reference`` and of the tests' launcher."""
    write_prompts(tmp_path, 2)
    recipe = write_recipe(tmp_path, endpoints=[], server={"launch": "reference", "endpoints": None})
    assert load_recipe(recipe).server.startup_timeout == 300
    assert inspect.signature(launch_reference).parameters["startup_timeout"].default == 300
    impatient = load_recipe(recipe, {"server.startup_timeout": 0.001})  # no server starts that fast
    too_soon = r"did not answer within 0\.001 s \(server\.startup_timeout\)"
    with pytest.raises(ServerUnreachable, match=too_soon), recipe_endpoints(impatient, None):
        pass
    with recipe_endpoints(load_recipe(recipe, {"server.startup_timeout": 600}), None) as (url,):
        assert get(url, "/health").status == 200
    with pytest.raises(RecipeError, match=r"server\.startup_timeout.*server\.sglang\.startup_timeout"):
        load_recipe(recipe, {"server.launch": "sglang", "server.sglang": {"model_path": "m"},
                             "server.startup_timeout": 60})  # fmt: skip


@pytest.mark.slow
def test_kill_stops_the_server_at_once_and_restart_brings_it_back(contract: ModuleType) -> None:
    with launch_reference() as server:
        server.kill()
        with pytest.raises(OSError):
            get(server.url, "/health", timeout=1)
        server.restart()
        Conformance(server.url, contract).ok({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1}})


def test_a_given_port_is_used() -> None:
    port = free_port()
    with launch_reference(port=port) as server:
        assert server.port == port and get(f"http://127.0.0.1:{port}", "/health").status == 200


def test_a_port_another_server_holds_is_not_taken_for_the_launched_one() -> None:
    """The free port can be taken between choosing it and binding it (seen under pytest-xdist):
    the other server answers /health, and the launch must not hand out its URL as its own."""
    with launch_reference() as other:
        with pytest.raises(ServerUnreachable, match=r"(?s)exited with code 1.*address already in use"):
            launch_reference(port=other.port)
        assert other.process.poll() is None


def test_a_server_that_cannot_start_is_reported_with_its_log() -> None:
    with pytest.raises(
        ServerUnreachable, match=r"(?s)exited with code 2.*--slots and --ms-per-token go together"
    ):
        launch_reference(args=["--slots", "2"])


def test_environment_additions_reach_the_server() -> None:
    with launch_reference(env={"EAGLE3_RAW_UNUSED": "1"}) as server:
        assert get(server.url, "/health").status == 200


_PARENT = """
import sys, time
from eagle3_raw.launching.reference import launch_reference
server = launch_reference()
print(server.process.pid, server.port, server.log_path, flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie (dead, not yet reaped by init) counts as exited."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return False
    return fields[0] not in ("Z", "X")


def test_the_server_exits_when_the_process_that_launched_it_is_killed() -> None:
    parent = subprocess.Popen([sys.executable, "-c", _PARENT], stdout=subprocess.PIPE, text=True)
    pid = None
    try:
        assert parent.stdout is not None
        pid_text, port, log = parent.stdout.readline().split()
        pid = int(pid_text)
        assert get(f"http://127.0.0.1:{port}", "/health").status == 200
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 5
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(pid), "the reference server outlived its SIGKILLed parent"
        Path(log).unlink(missing_ok=True)
    finally:
        parent.kill()
        parent.communicate()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


# --- secrets and the options a recipe may give (issue 13, finding 4) --------------------------------

KEY = "sk-e3raw-launch-key-77f3a9c1d2"


def _cmdlines() -> dict[int, str]:
    """Every process's command line, as any local user reads it (``ps``, ``/proc/<pid>/cmdline``)."""
    lines = {}
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if entry.name.isdigit():
                lines[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    return lines


def test_an_api_key_reaches_the_launched_server_by_its_environment_never_its_command_line() -> None:
    with launch_reference(api_key=KEY) as server:
        command = _cmdlines()[server.process.pid]
        assert "--api-key-env" in command and KEY not in command
        assert not [pid for pid, line in _cmdlines().items() if KEY in line]
        assert get(server.url, "/server_info").status == 401  # the key is in force
        info = get(server.url, "/server_info", headers={"Authorization": f"Bearer {KEY}"}).json()
        assert KEY not in str(info)


def test_a_recipe_that_launches_the_reference_server_keeps_its_key_off_every_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from eagle3_raw.recipe import load_recipe
    from eagle3_raw.run.build import launched_endpoints

    monkeypatch.setenv("E3RAW_LAUNCH_KEY", KEY)
    (tmp_path / "p.jsonl").write_text('{"prompt": "hi"}\n')
    server = {
        "launch": "reference",
        "api_key_env": "E3RAW_LAUNCH_KEY",
        "launch_args": ["--context-length", "512"],
    }
    raw = {"name": "t", "prompts": {"source": "p.jsonl"}, "sampling": {"max_new_tokens": 4}, "server": server}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(raw))
    with launched_endpoints(load_recipe(tmp_path / "r.yaml")) as (url,):
        assert get(url, "/health").status == 200 and get(url, "/server_info").status == 401
        launched = [
            line for line in _cmdlines().values() if "eagle3_raw.reference" in line and url[-5:] in line
        ]
        assert launched and not [line for line in _cmdlines().values() if KEY in line]


def test_serve_reference_reads_its_key_from_a_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    from eagle3_raw.reference.cli import main

    monkeypatch.delenv("E3RAW_UNSET_KEY", raising=False)
    assert main(["--api-key-env", "E3RAW_UNSET_KEY", "--port", str(free_port())]) == 2
    assert main(["--api-key", "a", "--api-key-env", "HOME", "--port", str(free_port())]) == 2


@pytest.mark.parametrize(
    ("args", "refused"),
    [
        (["--ledger", "/tmp/x"], "--ledger is not allowed in a recipe"),
        (["--ledger=/tmp/x"], "--ledger is not allowed in a recipe"),
        (["--host", "0.0.0.0"], "--host is not allowed"),
        (["--port", "80"], "--port is not allowed"),
        (["--api-key", "k"], "--api-key is not allowed"),
        (["--api-key-env", "HF_TOKEN"], "--api-key-env is not allowed"),
        (["--model-path", "/home"], "--model-path is not allowed"),
        (["--exit-with-stdin"], "--exit-with-stdin is not allowed"),
        (["--led", "x"], "'--led' is not a serve-reference option a recipe may give"),
        (["-h"], "'-h' is not a serve-reference option"),
        (["64"], "'64' is no option"),
        (["--slots"], "--slots needs a value after it"),
    ],
)
def test_launch_args_are_an_allowlist(args: list[str], refused: str) -> None:
    from eagle3_raw.errors import RecipeError
    from eagle3_raw.launching.reference import check_launch_args

    with pytest.raises(RecipeError, match=refused):
        check_launch_args(args)


def test_the_documented_launch_args_pass() -> None:
    from eagle3_raw.launching.reference import check_launch_args

    documented = ["--slots", "64", "--ms-per-token", "2", "--faults=http500=0.1", "--disable-radix-cache"]
    check_launch_args([*documented, "--served-model-name", "m", "--context-length", "512"])
