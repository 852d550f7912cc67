"""``server.launch: sglang`` (issue 16): the recipe section, the command line, and the launched
server's life: started for the run through the same code path real SGLang takes, with the reference
server standing in for ``python -m sglang.launch_server`` (SGLang cannot run on these CPUs), and
gone after every way the run can end, including a client killed with SIGKILL.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

import eagle3_raw
from eagle3_raw.errors import RecipeError, ServerUnreachable
from eagle3_raw.recipe import load_recipe
from eagle3_raw.reference.ledger import read_ledger
from eagle3_raw.run.build import journal_dir_for
from eagle3_raw.sglang.launch import sglang_command
from tests.helpers import (
    generations,
    launched_port,
    ledgers_in,
    processes_with,
    requested_rids,
    rid_row_id,
    sglang_section,
    write_prompts,
    write_recipe,
)  # fmt: skip
from tests.reference.wire import wait_until
from tests.support.pace import scaled

_SLOW = ("--slots", "2", "--ms-per-token", "2")


def _recipe(
    tmp_path: Path, *extra: str, prompts: int = 12, server: dict[str, Any] | None = None, **fields: Any
) -> Path:
    """A recipe of ``prompts`` prompts launching the stand-in SGLang (``extra`` its extra_args,
    ``fields`` more of ``server.sglang``, ``server`` more of ``server``)."""
    write_prompts(tmp_path, prompts)
    section = {
        **sglang_section(tmp_path / "ledgers", *extra, **fields),
        "connect_timeout": 5,
        **(server or {}),
    }
    return write_recipe(tmp_path, endpoints=[], server=section, sampling={"max_new_tokens": 48})


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "eagle3_raw.cli", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env={**os.environ, **(env or {})},
    )  # fmt: skip


def _gone(port: int, timeout: float = 15.0) -> None:
    """Every process of the server on ``port`` (its guard, the server) has exited."""
    wait_until(lambda: not processes_with("--port", str(port)), timeout=timeout)


@pytest.mark.parametrize(
    ("sglang", "field", "says"),
    [
        ({}, "server.sglang.model_path", "required"),
        ({"model_path": "m", "tp_sise": 2}, "server.sglang.tp_sise", "did you mean 'tp_size'"),
        ({"model_path": "m", "tp_size": 0}, "server.sglang.tp_size", ">= 1"),
        ({"model_path": "m", "extra_args": ["--port", "9"]}, "server.sglang.extra_args", "a free port"),
        (
            {"model_path": "m", "extra_args": ["--po=9"]},
            "server.sglang.extra_args",
            "would read it as --port",
        ),
        ({"model_path": "m", "extra_args": ["--tp", "2"]}, "server.sglang.extra_args", "--tp-size"),
        ({"model_path": "m", "extra_args": ["--api-key", "k"]}, "server.sglang.extra_args", "api_key_env"),
        (
            {"model_path": "m", "extra_args": ["--ssl-keyfile-password", "x"]},
            "server.sglang.extra_args",
            "ps",
        ),
        ({"model_path": "m", "extra_args": [8]}, "server.sglang.extra_args", "list of strings"),
        ({"model_path": "m", "env": {"A": 1}}, "server.sglang.env.A", "string value"),
        ({"model_path": "m", "startup_timeout": 0}, "server.sglang.startup_timeout", "positive"),
    ],
)
def test_the_section_is_checked_with_the_recipe(
    tmp_path: Path, sglang: dict[str, Any], field: str, says: str
) -> None:
    write_prompts(tmp_path, 1)
    recipe = write_recipe(
        tmp_path, endpoints=[], server={"endpoints": None, "launch": "sglang", "sglang": sglang}
    )
    with pytest.raises(RecipeError) as refused:
        load_recipe(recipe)
    assert refused.value.field == field and says in str(refused.value), str(refused.value)


def test_the_section_goes_with_launch_sglang_only(tmp_path: Path) -> None:
    write_prompts(tmp_path, 1)
    path = write_recipe(tmp_path, endpoints=["http://h:1"], server={"sglang": {"model_path": "m"}})
    with pytest.raises(RecipeError, match=r"only read with server\.launch: sglang"):
        load_recipe(path)
    path = write_recipe(tmp_path, endpoints=[], server={"endpoints": None, "launch": "sglang"})
    with pytest.raises(RecipeError, match=r"required with server\.launch: sglang"):
        load_recipe(path)
    path = write_recipe(tmp_path, endpoints=[], server={"endpoints": None, "launch": "sglang",
                        "sglang": {"model_path": "m"}, "launch_args": ["--slots", "2"]})  # fmt: skip
    with pytest.raises(RecipeError, match=r"server\.sglang\.extra_args"):
        load_recipe(path)
    launched = _recipe(tmp_path)
    override = load_recipe(launched, ["server.endpoints=[http://gpu-1:30000]"])  # your server instead
    assert override.server.launch is None and override.server.sglang is None
    again = load_recipe(load_recipe(launched).to_dict())  # the section round-trips
    assert again.server.sglang == load_recipe(launched).server.sglang


def test_the_command_line_holds_every_field_and_no_secret(tmp_path: Path) -> None:
    section = {
        "model_path": "Qwen/Qwen3-8B", "revision": "abc123", "served_model_name": "qwen", "tp_size": 8,
        "dp_size": 2, "context_length": 32768, "reasoning_parser": "qwen3", "tool_call_parser": "qwen25",
        "trust_remote_code": True, "extra_args": ["--mem-fraction-static", "0.85"],
        "executable": ["/opt/sglang/bin/python", "-m", "sglang.launch_server"],
    }  # fmt: skip
    write_prompts(tmp_path, 1)
    path = write_recipe(
        tmp_path, endpoints=[], server={"endpoints": None, "launch": "sglang", "sglang": section}
    )
    launch = load_recipe(path).server.sglang
    assert launch is not None
    command = sglang_command(launch, 31234, key_file=tmp_path / "key.yaml")
    assert command == [
        "/opt/sglang/bin/python", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3-8B",
        "--revision", "abc123", "--host", "127.0.0.1", "--port", "31234", "--tp-size", "8", "--dp-size", "2",
        "--context-length", "32768", "--served-model-name", "qwen", "--reasoning-parser", "qwen3",
        "--tool-call-parser", "qwen25", "--trust-remote-code", "--enable-deterministic-inference",
        "--config", str(tmp_path / "key.yaml"), "--mem-fraction-static", "0.85",
    ]  # fmt: skip


def test_the_stand_in_takes_the_flags_the_launcher_passes(tmp_path: Path) -> None:
    """The reference server reads what the launcher writes: tp/dp sizes, revision, the
    deterministic flag, parsers, and --config with the key (SGLang's way: the file under the command line)."""
    from eagle3_raw.launching.reference import free_port

    key_file = tmp_path / "key.yaml"
    key_file.write_text('{"api-key": "s3cret", "dp-size": 3}')
    port = free_port()
    command = [
        sys.executable, "-m", "eagle3_raw.reference", "--host", "127.0.0.1", "--port", str(port),
        "--tp-size", "4", "--dp-size", "2", "--revision", "abc", "--trust-remote-code",
        "--enable-deterministic-inference", "--reasoning-parser", "qwen3", "--config", str(key_file),
    ]  # fmt: skip
    server = subprocess.Popen(command, stderr=subprocess.PIPE)
    try:
        import urllib.request

        wait_until(lambda: _answers(f"http://127.0.0.1:{port}/health"), timeout=30)
        request = urllib.request.Request(f"http://127.0.0.1:{port}/server_info",
                                         headers={"Authorization": "Bearer s3cret"})  # fmt: skip
        with urllib.request.urlopen(request, timeout=5) as response:
            info = orjson.loads(response.read())
        assert not _answers(f"http://127.0.0.1:{port}/server_info")  # the key from the file is required
    finally:
        server.terminate()
        server.wait(scaled(10))
    assert (info["tp_size"], info["dp_size"], info["revision"], info["trust_remote_code"]) == (
        4,
        2,
        "abc",
        True,
    )
    assert info["reasoning_parser"] == "qwen3" and info["enable_deterministic_inference"] is True


def _answers(url: str) -> bool:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@pytest.mark.slow
def test_a_launched_server_builds_the_set_is_recorded_and_a_cached_load_starts_none(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, "--max-running-requests", "8", tp_size=2)
    journals, ledgers = tmp_path / "journals", tmp_path / "ledgers"
    built = eagle3_raw.load(
        str(recipe), cache_dir=str(tmp_path / "cache"), journal_dir=journals, progress="none"
    )
    (ledger,) = ledgers_in(ledgers)
    assert len(built) == 12 and sorted(rid_row_id(g["rid"]) for g in generations(ledger)) == sorted(
        built["id"]
    )
    manifest = orjson.loads(next(journals.glob("sets/*/manifest.json")).read_bytes())
    (launch,) = manifest["launches"].values()
    port = launched_port(f"starting the SGLang server: {launch['command']}")
    assert (
        "--tp-size 2 --dp-size 1 --enable-deterministic-inference --max-running-requests 8"
        in launch["command"]
    )
    assert manifest["server"]["server_info"]["tp_size"] == 2  # what the launched server reported
    assert manifest["target"]["model"]["model_path"] == load_recipe(recipe).server.sglang.model_path  # type: ignore[union-attr]
    _gone(port)
    shutil.rmtree(tmp_path / "cache")  # the set from its journal: the launch record gives the target
    again = eagle3_raw.load(
        str(recipe), cache_dir=str(tmp_path / "cache"), journal_dir=journals, progress="none"
    )
    assert ledgers_in(ledgers) == [ledger] and again["input_ids"] == built["input_ids"]


@pytest.mark.slow
def test_a_merge_on_a_node_without_the_set_starts_no_server(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path)
    merge = _cli("merge", str(recipe), "--journal-dir", str(tmp_path / "journals"))
    _, err = merge.communicate(timeout=scaled(120))
    assert merge.returncode == 1 and "built with this server.sglang configuration" in err, err[-2000:]
    assert not ledgers_in(tmp_path / "ledgers")


@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGINT", "SIGTERM", "SIGKILL"])
def test_the_server_never_outlives_its_client(tmp_path: Path, how: str) -> None:
    """Ctrl-C, SIGTERM (aborts reach the server first) and kill -9 of the client: the guard stops the
    server. The key reached the server in a file: it is on no process's command line."""
    recipe = _recipe(tmp_path, *_SLOW, prompts=30, server={"api_key_env": "E3_TEST_KEY"}, stop_timeout=3)
    log = tmp_path / "build.log"
    with log.open("w") as out:
        build = subprocess.Popen(
            [sys.executable, "-m", "eagle3_raw.cli", "build", str(recipe), "--quiet", "--journal-dir",
             str(tmp_path / "journals"), "--cache-dir", str(tmp_path / "cache")],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "E3_TEST_KEY": "k-9f2a7c"},
        )  # fmt: skip
        wait_until(lambda: bool(ledgers_in(tmp_path / "ledgers")) and
                   len(generations(ledgers_in(tmp_path / "ledgers")[0])) >= 3, timeout=90)  # fmt: skip
        port = launched_port(log.read_text())
        assert len(processes_with("--port", str(port))) == 2  # the guard and the server
        assert not processes_with("k-9f2a7c") and "k-9f2a7c" not in log.read_text()
        build.send_signal(getattr(signal, how))
        code = build.wait(scaled(60))
    _gone(port)
    (ledger,) = ledgers_in(tmp_path / "ledgers")
    if how == "SIGKILL":
        assert code == -signal.SIGKILL
    else:
        aborts = [r for r in read_ledger(ledger) if (r.get("finish_reason") or {}).get("type") == "abort"]
        assert code == 130 and aborts, log.read_text()[-3000:]  # the server was alive for the aborts


@pytest.mark.slow
def test_a_shard_stopped_by_sigterm_resumes_without_asking_twice(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, *_SLOW, prompts=30)
    journals = tmp_path / "journals"
    args = ("build", str(recipe), "--shard", "0/2", "--quiet", "--journal-dir", str(journals))
    first = _cli(*args)
    wait_until(lambda: bool(ledgers_in(tmp_path / "ledgers")) and
               len(generations(ledgers_in(tmp_path / "ledgers")[0])) >= 4, timeout=90)  # fmt: skip
    first.send_signal(signal.SIGTERM)
    _, err = first.communicate(timeout=scaled(60))
    assert first.returncode == 130 and "Run the same command again to resume" in err, err[-2000:]
    directory = journal_dir_for(load_recipe(recipe), journals)
    from eagle3_raw.journal import Journal

    with Journal.read_dir(directory) as journal:
        kept = {row.id for row in journal.iter_rows()}
    before = set(ledgers_in(tmp_path / "ledgers"))
    again = _cli(*args)
    _, err = again.communicate(timeout=scaled(120))
    assert again.returncode == 0, err[-2000:]
    (second_ledger,) = set(ledgers_in(tmp_path / "ledgers")) - before
    asked_again = {rid_row_id(rid) for rid in requested_rids(second_ledger)}
    assert kept and not kept & asked_again  # journaled before the stop: never asked again
    with Journal.read_dir(directory) as journal:
        assert len({row.id for row in journal.iter_rows()}) == 15  # shard 0 of 30 prompts


def test_a_server_that_exits_at_start_is_an_error_with_its_log(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, "--slots", "0", "--ms-per-token", "1")
    started = time.monotonic()
    with pytest.raises(ServerUnreachable) as failed:
        eagle3_raw.load(str(recipe), cache_dir=str(tmp_path / "cache"), journal_dir=tmp_path / "j")
    message = str(failed.value)
    assert (
        "exited with code 2 before it answered /health" in message and "--slots must be at least 1" in message
    )
    assert "--model-path" in message  # the command it ran
    assert time.monotonic() - started < scaled(60)  # at once, not at the end of the startup wait


@pytest.mark.slow
def test_a_server_that_never_answers_is_stopped_at_the_startup_limit(tmp_path: Path) -> None:
    hang = "import sys, time; print('loading weights 1/9 (pretend)', flush=True); time.sleep(600)"
    recipe = _recipe(tmp_path, executable=[sys.executable, "-c", hang], startup_timeout=3)
    command = _cli("build", str(recipe), "--journal-dir", str(tmp_path / "j"))
    _, err = command.communicate(timeout=scaled(120))
    assert command.returncode == 1, err[-2000:]
    assert "did not answer /health within 3 s (server.sglang.startup_timeout)" in err
    assert "loading weights 1/9 (pretend)" in err  # the log's tail
    # the guard stops the server as the build ends; on a busy machine its exit can trail the build's
    wait_until(lambda: not processes_with("-c", hang), timeout=30)
