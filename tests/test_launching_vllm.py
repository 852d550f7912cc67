"""``server.launch: vllm`` (issue 25): the ``server.vllm`` section, vLLM's command line and
environment, the flags a recipe may not give, and the launched server's life through the same guard
and held-server path as SGLang's: with a stand-in that only answers ``/health``
(``tests/support/standin_vllm.py``), and with the reference server's vLLM mode (``python -m
eagle3_raw.reference --protocol vllm``) for whole builds, stopped every way a build can end. The
real vLLM's launch is ``tests/real_vllm/test_launch.py``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest

import eagle3_raw
from eagle3_raw.errors import FatalError, RecipeError, ServerMismatch, ServerUnreachable
from eagle3_raw.identity import set_config_id
from eagle3_raw.journal.manifest import new_manifest
from eagle3_raw.launching.held import held, hold, release
from eagle3_raw.launching.records import adding_launch
from eagle3_raw.launching.sections import launch_section, section_digest
from eagle3_raw.launching.target import launched_target
from eagle3_raw.recipe import Recipe, VLLMLaunch, load_recipe
from eagle3_raw.reference.ledger import read_ledger
from eagle3_raw.resources import reference_model_dir
from eagle3_raw.run.build import RunOptions, launched_endpoints, release_launched, resolve_target, run
from eagle3_raw.sglang.launch import launch_digest as sglang_digest
from eagle3_raw.vllm.launch import launch_digest, vllm_command, vllm_env
from tests.helpers import generations, ledgers_in, processes_with, write_prompts, write_recipe
from tests.reference.wire import wait_until
from tests.support.pace import scaled

STANDIN = Path(__file__).resolve().parent / "support" / "standin_vllm.py"
KEY = "k-vllm-3e8d1b"


def _section(tmp_path: Path, *extra: str, **fields: Any) -> dict[str, Any]:
    """``server`` launching the stand-in vLLM (``extra``: its extra_args; ``fields``: more of it)."""
    (tmp_path / "standin").mkdir(exist_ok=True)
    vllm = {
        "model": "org/tiny", "executable": [sys.executable, str(STANDIN)], "extra_args": list(extra),
        "env": {"E3_STANDIN_DIR": str(tmp_path / "standin"), "E3_EXTRA": "yes"},
        "startup_timeout": round(scaled(60)), "stop_timeout": 5, **fields,
    }  # fmt: skip
    return {"endpoints": None, "launch": "vllm", "vllm": vllm}


def _recipe(tmp_path: Path, *extra: str, server: dict[str, Any] | None = None, **fields: Any) -> Path:
    write_prompts(tmp_path, 2)
    section = {**_section(tmp_path, *extra, **fields), **(server or {})}
    return write_recipe(tmp_path, endpoints=[], server=section, sampling={"max_new_tokens": 8})


def _load(tmp_path: Path, vllm: dict[str, Any], **server: Any) -> Recipe:
    write_prompts(tmp_path, 1)
    path = write_recipe(
        tmp_path, endpoints=[], server={"endpoints": None, "launch": "vllm", "vllm": vllm, **server}
    )
    return load_recipe(path)


def _launch(recipe: Recipe) -> VLLMLaunch:
    assert recipe.server.vllm is not None
    return recipe.server.vllm


def _status(url: str, key: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def _standin_record(tmp_path: Path) -> dict[str, Any]:
    (path,) = (tmp_path / "standin").glob("standin-*.json")
    record: dict[str, Any] = json.loads(path.read_text())
    return record


def _gone(port: int, timeout: float = 15.0) -> None:
    """Every process of the server on ``port`` (its guard, the server) has exited."""
    wait_until(lambda: not processes_with("--port", str(port)), timeout=timeout)


# --- the section, the command line and the environment ------------------------------------------------


def test_the_command_line_holds_every_field_and_the_environment_the_key(tmp_path: Path) -> None:
    section = {
        "model": "Qwen/Qwen3-8B", "revision": "abc123", "served_model_name": "qwen",
        "tensor_parallel_size": 8, "data_parallel_size": 2, "max_model_len": 32768,
        "reasoning_parser": "qwen3", "tool_call_parser": "hermes", "trust_remote_code": True, "seed": 7,
        "extra_args": ["--max-num-seqs", "32"], "executable": ["/opt/vllm/bin/python", "-m", "vllm.x"],
        "env": {"CUDA_VISIBLE_DEVICES": "0,1"},
    }  # fmt: skip
    launch = _launch(_load(tmp_path, section))
    assert vllm_command(launch, 31234) == [
        "/opt/vllm/bin/python", "-m", "vllm.x", "--model", "Qwen/Qwen3-8B", "--revision", "abc123",
        "--host", "127.0.0.1", "--port", "31234", "--tensor-parallel-size", "8", "--data-parallel-size", "2",
        "--max-model-len", "32768", "--served-model-name", "qwen", "--reasoning-parser", "qwen3",
        "--tool-call-parser", "hermes", "--enable-auto-tool-choice", "--trust-remote-code", "--seed", "7",
        "--enable-scale-out", "--generation-config", "vllm", "--max-num-seqs", "32",
    ]  # fmt: skip
    assert vllm_env(launch, KEY) == {
        "CUDA_VISIBLE_DEVICES": "0,1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
        "VLLM_SERVER_DEV_MODE": "1", "VLLM_API_KEY": KEY,
    }  # fmt: skip


def test_the_defaults_are_this_pythons_api_server_module_and_no_key(tmp_path: Path) -> None:
    launch = _launch(_load(tmp_path, {"model": "m"}))
    assert vllm_command(launch, 8) == [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", "m", "--host", "127.0.0.1",
        "--port", "8", "--tensor-parallel-size", "1", "--data-parallel-size", "1", "--seed", "0",
        "--enable-scale-out", "--generation-config", "vllm",
    ]  # fmt: skip
    # an empty key: a VLLM_API_KEY the launcher's own shell exports does not reach the server
    assert vllm_env(launch, None)["VLLM_API_KEY"] == ""
    assert (launch.startup_timeout, launch.stop_timeout, launch.log_dir) == (1800.0, 30.0, None)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--port", "9"], "--port: eagle3_raw sets it (a free port is chosen for it)"),
        (["--host=0.0.0.0"], "--host: eagle3_raw sets it"),
        (["--uds", "/tmp/s"], "--uds: eagle3_raw sets it"),
        (["--po", "9"], "--po: vLLM would read it as --port"),
        (["--model", "x"], "set server.vllm.model"),
        (["--model.x", "1"], "set server.vllm.model"),  # vLLM reads --a.b as --a '{"b": ...}'
        (["--max_model_len", "64"], "set server.vllm.max_model_len"),  # vLLM reads _ as -
        (["--tensor-parallel-size", "2"], "set server.vllm.tensor_parallel_size"),
        (["-tp", "2"], "-tp: eagle3_raw sets it"),
        (["-t", "2"], "-t: vLLM would read it as -tp"),
        (["-dp=2"], "set server.vllm.data_parallel_size"),
        (["--seed", "1"], "set server.vllm.seed"),
        (["--trust-remote-code"], "set server.vllm.trust_remote_code"),
        (["--no-trust-remote-code"], "set server.vllm.trust_remote_code"),
        (["--enable-auto-tool-choice"], "with server.vllm.tool_call_parser"),
        (["--no-enable-scale-out"], "the token, render, derender and abort routes need it"),
        (["--generation-config", "auto"], "generation_config.json would change the default sampling"),
        (["--config", "c.yaml"], "a config file's flags would escape these checks"),
        (["--api-key", "k"], "server.api_key_env, through VLLM_API_KEY"),
        (["--hf-token", "hf_x"], "a secret on a command line"),
        (["--ssl-keyfile-password", "x"], "a secret on a command line"),
    ],
)
def test_extra_args_may_not_give_what_eagle3_raw_sets(tmp_path: Path, args: list[str], says: str) -> None:
    with pytest.raises(RecipeError) as refused:
        _load(tmp_path, {"model": "m", "extra_args": args})
    assert refused.value.field == "server.vllm.extra_args" and says in str(refused.value), str(refused.value)


def test_extra_args_take_every_other_flag_and_values_that_look_like_flags(tmp_path: Path) -> None:
    args = ["--max-num-seqs", "-1", "--load-format", "dummy", "--long-prefill-token-threshold", "8", "-O3",
            "--reasoning-parser-plugin", "p.py", "--data-parallel-size-local", "1", "--ssl-keyfile", "k.pem",
            "--ms-per-token", "2",
            "--max-num-batched-tokens", "64"]  # fmt: skip
    assert _launch(_load(tmp_path, {"model": "m", "extra_args": args})).extra_args == tuple(args)


@pytest.mark.parametrize(
    ("vllm", "field", "says"),
    [
        ({}, "server.vllm.model", "required"),
        ({"model": " "}, "server.vllm.model", "a Hub model id or a folder"),
        ({"model": "m", "tensor_parallel_sise": 2}, "server.vllm.tensor_parallel_sise",
         "did you mean 'tensor_parallel_size'"),
        ({"model": "m", "model_path": "m"}, "server.vllm.model_path", "unknown field"),
        ({"model": "m", "data_parallel_size": 0}, "server.vllm.data_parallel_size", ">= 1"),
        ({"model": "m", "max_model_len": 4}, "server.vllm.max_model_len", ">= 8"),
        ({"model": "m", "seed": -1}, "server.vllm.seed", ">= 0"),
        ({"model": "m", "env": {"A": 1}}, "server.vllm.env.A", "string value"),
        ({"model": "m", "env": {"VLLM_API_KEY": "s3cret"}}, "server.vllm.env.VLLM_API_KEY", "api_key_env"),
        ({"model": "m", "env": {"DO_NOT_TRACK": "0"}}, "server.vllm.env.DO_NOT_TRACK", "statistics off"),
        ({"model": "m", "startup_timeout": 0}, "server.vllm.startup_timeout", "positive"),
    ],
)  # fmt: skip
def test_the_section_is_checked_with_the_recipe(
    tmp_path: Path, vllm: dict[str, Any], field: str, says: str
) -> None:
    with pytest.raises(RecipeError) as refused:
        _load(tmp_path, vllm)
    assert refused.value.field == field and says in str(refused.value), str(refused.value)
    assert "s3cret" not in str(refused.value)


def test_the_section_goes_with_launch_vllm_only(tmp_path: Path) -> None:
    write_prompts(tmp_path, 1)
    for server, says in [
        ({"endpoints": ["http://h:1"], "vllm": {"model": "m"}}, r"only read with server\.launch: vllm"),
        ({"endpoints": None, "launch": "vllm"}, r"required with server\.launch: vllm: at least \{model:"),
        ({"endpoints": None, "launch": "sglang", "sglang": {"model_path": "m"}, "vllm": {"model": "m"}},
         r"only read with server\.launch: vllm"),
        ({"endpoints": None, "launch": "vllm", "vllm": {"model": "m"}, "sglang": {"model_path": "m"}},
         r"only read with server\.launch: sglang"),
        ({"endpoints": None, "launch": "vllm", "vllm": {"model": "m"}, "launch_args": ["--slots", "2"]},
         r"vLLM's go in server\.vllm\.extra_args"),
        ({"endpoints": None, "launch": "vllm", "vllm": {"model": "m"}, "startup_timeout": 5},
         r"vLLM's is server\.vllm\.startup_timeout"),
    ]:  # fmt: skip
        with pytest.raises(RecipeError, match=says):
            load_recipe(write_recipe(tmp_path, endpoints=[], server=server))
    launched = _recipe(tmp_path)
    override = load_recipe(launched, ["server.endpoints=[http://gpu-1:8000]"])  # your server instead
    assert override.server.launch is None and override.server.vllm is None
    recipe = load_recipe(launched)
    written = recipe.to_dict()
    assert "startup_timeout" not in written["server"] and written["server"]["vllm"]["model"] == "org/tiny"
    assert load_recipe(written).server.vllm == recipe.server.vllm  # the section round-trips
    assert "vllm" not in override.to_dict()["server"]  # absent unless set: other recipes are as before
    assert launch_section(recipe) is recipe.server.vllm and launch_section(override) is None


def test_the_launch_digest_is_what_decides_the_server_not_the_patience(tmp_path: Path) -> None:
    base = _launch(_load(tmp_path, {"model": "m"}))
    same = _launch(_load(tmp_path, {"model": "m", "startup_timeout": 5, "stop_timeout": 1, "log_dir": "l"}))
    other = [
        _launch(_load(tmp_path, {"model": "m", **change}))
        for change in (
            {"model": "n"},
            {"seed": 1},
            {"extra_args": ["--max-num-seqs", "8"]},
            {"env": {"A": "1"}},
        )
    ]
    assert launch_digest(base) == launch_digest(same) == section_digest(base)
    assert len({launch_digest(base), *map(launch_digest, other)}) == 5
    server = {"endpoints": None, "launch": "sglang", "sglang": {"model_path": "m"}}
    sglang = load_recipe(write_recipe(tmp_path, endpoints=[], server=server)).server.sglang
    assert sglang is not None and section_digest(sglang) == sglang_digest(sglang)


# --- the launched server's life ------------------------------------------------------------------------


def test_a_launched_server_gets_its_flags_and_key_and_is_stopped_on_release(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe = load_recipe(_recipe(tmp_path, "--max-num-seqs", "4"))
    monkeypatch.setenv("VLLM_API_KEY", "the-shells-own")  # not the server's: the recipe's key is
    server = hold(recipe, KEY)
    try:
        record = _standin_record(tmp_path)
        assert record["argv"] == vllm_command(_launch(recipe), server.port)[2:]  # after python, the script
        assert record["env"] == {
            "VLLM_API_KEY": KEY, "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "VLLM_SERVER_DEV_MODE": "1",
            "E3_EXTRA": "yes",
        }  # fmt: skip
        assert _status(f"{server.url}/v1/models") == 401 and _status(f"{server.url}/v1/models", KEY) == 200
        pids = processes_with("--port", str(server.port))
        assert len(pids) == 2  # the guard and the server
        assert all(KEY not in Path(f"/proc/{pid}/cmdline").read_text() for pid in pids)
        assert hold(recipe, KEY) is server and held(_launch(recipe)) is server  # one server per launch
        assert server.shown_command.endswith("--generation-config vllm --max-num-seqs 4")
    finally:
        release(_launch(recipe))
    assert held(_launch(recipe)) is None
    _gone(server.port)


def test_the_run_path_serves_the_launched_vllm_and_stops_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe = load_recipe(_recipe(tmp_path))
    monkeypatch.setenv("VLLM_API_KEY", "the-shells-own")  # the recipe has no key: the server asks none
    with launched_endpoints(recipe) as urls:
        (url,) = urls
        assert _status(f"{url}/health") == 200 and _status(f"{url}/v1/models") == 200
        server = held(_launch(recipe))
        assert server is not None and server.url == url
    _gone(server.port)
    hold(recipe, None)  # a server started to learn the target, then not used: released
    port = held(_launch(recipe)).port  # type: ignore[union-attr]
    release_launched(recipe)
    _gone(port)


def test_the_manifest_records_a_vllm_launch_by_its_digest(tmp_path: Path) -> None:
    recipe = load_recipe(_recipe(tmp_path))
    server = hold(recipe, None)
    try:
        manifest: dict[str, Any] = {}
        adding_launch(_launch(recipe), server)(manifest)
    finally:
        release(_launch(recipe))
    assert manifest["launches"] == {
        launch_digest(_launch(recipe)): {"kind": "vllm", "command": server.shown_command, "model": "org/tiny"}
    }
    assert "--generation-config vllm" in server.shown_command


def test_a_merge_reads_the_target_from_the_journals_record_and_starts_no_server(tmp_path: Path) -> None:
    recipe = load_recipe(_recipe(tmp_path))
    root = tmp_path / "journals"
    with pytest.raises(FatalError, match=r"built with this server\.vllm configuration"):
        launched_target(recipe, root, api_key=None, generate=False)
    # a set of this recipe whose manifest records this launch: its target, and nothing starts
    reference = load_recipe(
        write_recipe(tmp_path, endpoints=[], server={"endpoints": None, "launch": "reference"})
    )
    target = resolve_target(reference, root, api_key=None)  # computed: starts nothing either
    folder = root / "sets" / set_config_id(recipe, target)
    folder.mkdir(parents=True)
    manifest = new_manifest(config_id=folder.name, name=recipe.name, fingerprint=recipe.fingerprint, code="c",
                            recipe={}, target=target.to_dict())  # fmt: skip
    manifest["launches"] = {launch_digest(_launch(recipe)): {"kind": "vllm", "command": "...", "model": "m"}}
    (folder / "manifest.json").write_bytes(orjson.dumps(manifest))
    assert resolve_target(recipe, root, api_key=None, generate=False) == target
    assert not list((tmp_path / "standin").glob("standin-*.json"))


def test_a_build_whose_launched_server_is_no_vllm_stops_it(tmp_path: Path) -> None:
    """The stand-in answers /health but is no vLLM: asking it for the target fails, and the server
    started for that question is stopped (a build through a launched vLLM: ``tests/real_vllm``)."""
    recipe = load_recipe(_recipe(tmp_path))
    with pytest.raises(ServerMismatch, match=r"has no /version: is it a vLLM server\?"):
        run(recipe, RunOptions(journal_dir=tmp_path / "journals", progress="none"))
    argv = _standin_record(tmp_path)["argv"]
    port = int(argv[argv.index("--port") + 1])
    assert held(_launch(recipe)) is None
    _gone(port)


def test_a_server_that_exits_at_start_is_an_error_with_its_log(tmp_path: Path) -> None:
    recipe = load_recipe(_recipe(tmp_path, "--fail-at-start"))
    with pytest.raises(ServerUnreachable) as failed:
        hold(recipe, None)
    message = str(failed.value)
    assert "the vLLM server exited with code 2 before it answered /health" in message, message
    assert "--fail-at-start (pretend)" in message and "--enable-scale-out" in message  # its log, its command


def test_a_server_that_never_answers_is_stopped_at_the_startup_limit(tmp_path: Path) -> None:
    hang = "import sys, time; print('loading the engine (pretend)', flush=True); time.sleep(600)"
    recipe = load_recipe(_recipe(tmp_path, executable=[sys.executable, "-c", hang], startup_timeout=2))
    with pytest.raises(ServerUnreachable) as failed:
        hold(recipe, None)
    message = str(failed.value)
    assert "did not answer /health within 2 s (server.vllm.startup_timeout)" in message, message
    assert "loading the engine (pretend)" in message
    wait_until(lambda: not processes_with("-c", hang), timeout=30)


_CLIENT = """
import sys
from eagle3_raw.launching.held import hold
from eagle3_raw.recipe import load_recipe
server = hold(load_recipe(sys.argv[1]), None)
print(server.port, flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_the_server_never_outlives_its_client(tmp_path: Path, how: str) -> None:
    """kill -9 (or a plain SIGTERM) of the process holding the server: the guard's pipe closes and
    it stops the server. In the SIGKILL case the stand-in ignores SIGTERM too, so only the guard's
    SIGKILL after ``stop_timeout`` stops it."""
    extra = ("--ignore-sigterm",) if how == "SIGKILL" else ()
    recipe = _recipe(tmp_path, *extra, stop_timeout=1)
    client = subprocess.Popen(
        [sys.executable, "-c", _CLIENT, str(recipe)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )  # fmt: skip
    try:
        assert client.stdout is not None
        port = int(client.stdout.readline())
        assert len(processes_with("--port", str(port))) == 2  # the guard and the server
        client.send_signal(getattr(signal, how))
        assert client.wait(scaled(30)) in (-signal.SIGKILL, -signal.SIGTERM)
        _gone(port, timeout=30)
    finally:
        if client.poll() is None:
            client.kill()


# --- whole builds, with the reference server's vLLM mode as the launched vLLM ---------------------------


def _reference_recipe(tmp_path: Path, *extra: str, prompts: int = 12, **server: Any) -> Path:
    """A recipe launching the reference server in vLLM mode for ``server.vllm`` (its flags are vLLM's
    spellings); each server it starts keeps its own ledger in ``tmp_path/ledgers``."""
    write_prompts(tmp_path, prompts)
    (tmp_path / "ledgers").mkdir(exist_ok=True)
    script = 'exec "$0" -m eagle3_raw.reference --protocol vllm --ledger "$E3_LEDGERS/ledger-$$.jsonl" "$@"'
    vllm = {
        "model": str(reference_model_dir()), "executable": ["/bin/sh", "-c", script, sys.executable],
        "env": {"E3_LEDGERS": str(tmp_path / "ledgers")}, "extra_args": list(extra),
        "startup_timeout": round(scaled(60)), "stop_timeout": 5,
    }  # fmt: skip
    section = {"endpoints": None, "launch": "vllm", "vllm": vllm, "connect_timeout": 5, **server}
    return write_recipe(tmp_path, endpoints=[], server=section, sampling={"max_new_tokens": 48})


def _served(ledgers: Path) -> int:
    """How many generations the (first) launched reference server has delivered."""
    found = ledgers_in(ledgers)
    return len(generations(found[0])) if found else 0


def _port(text: str) -> int:
    match = re.search(r"starting the vLLM server: .* --port (\d+)", text)
    assert match, text[-3000:]
    return int(match.group(1))


@pytest.mark.slow
def test_a_launched_vllm_builds_the_set_is_recorded_and_a_cached_load_starts_none(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    recipe = _reference_recipe(tmp_path, "--max-num-seqs", "8")
    journals, ledgers = tmp_path / "journals", tmp_path / "ledgers"
    caplog.set_level("INFO", logger="eagle3_raw")
    built = eagle3_raw.load(
        str(recipe), cache_dir=str(tmp_path / "cache"), journal_dir=journals, progress="none"
    )
    (ledger,) = ledgers_in(ledgers)
    assert len(built) == 12 and len(generations(ledger)) == 12
    assert {line["endpoint"] for line in generations(ledger)} == {"/v1/completions"}
    manifest = orjson.loads(next(journals.glob("sets/*/manifest.json")).read_bytes())
    (launch,) = manifest["launches"].values()
    assert launch["kind"] == "vllm" and launch["model"] == str(reference_model_dir())
    assert "--seed 0 --enable-scale-out --generation-config vllm --max-num-seqs 8" in launch["command"]
    assert manifest["target"]["engine"] == "vllm"
    _gone(_port(caplog.text))
    (tmp_path / "cache").rename(tmp_path / "cache-0")  # the set from its journal: the launch record
    again = eagle3_raw.load(
        str(recipe), cache_dir=str(tmp_path / "cache"), journal_dir=journals, progress="none"
    )
    assert ledgers_in(ledgers) == [ledger] and again["input_ids"] == built["input_ids"]  # no second server


@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGINT", "SIGTERM", "SIGKILL"])
def test_the_vllm_server_never_outlives_its_build(tmp_path: Path, how: str) -> None:
    """Ctrl-C, SIGTERM (aborts reach the server first) and kill -9 of ``eagle3-raw build``: the guard
    stops the server. The key reached it in its environment: it is on no process's command line."""
    slow = ("--slots", "2", "--ms-per-token", "2")
    recipe = _reference_recipe(tmp_path, *slow, prompts=30, api_key_env="E3_TEST_KEY")
    log, ledgers = tmp_path / "build.log", tmp_path / "ledgers"
    with log.open("w") as out:
        build = subprocess.Popen(
            [sys.executable, "-m", "eagle3_raw.cli", "build", str(recipe), "--quiet", "--journal-dir",
             str(tmp_path / "journals"), "--cache-dir", str(tmp_path / "cache")],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "E3_TEST_KEY": "k-5d1e0b"},
        )  # fmt: skip
        try:
            wait_until(lambda: build.poll() is not None or _served(ledgers) >= 3, timeout=90)
            assert build.poll() is None, log.read_text()[-3000:]
            port = _port(log.read_text())
            assert len(processes_with("--port", str(port))) == 2  # the guard and the server
            assert not processes_with("k-5d1e0b") and "k-5d1e0b" not in log.read_text()
            build.send_signal(getattr(signal, how))
            code = build.wait(scaled(60))
        finally:
            if build.poll() is None:
                build.kill()
    _gone(port)
    (ledger,) = ledgers_in(ledgers)
    if how == "SIGKILL":
        assert code == -signal.SIGKILL
    else:
        aborts = [r for r in read_ledger(ledger) if r.get("finish_reason") == "abort"]
        assert code == 130 and aborts, log.read_text()[-3000:]  # the server was alive for the aborts
