"""The reference server's vLLM mode beyond the routes: capacity mode and
``/inference/v1/abort_requests``, the injected faults, the ledger, the API key (``--api-key`` and
vLLM's ``VLLM_API_KEY``), the scale-out and dev-mode switches, and vLLM's flag spellings on the
command line. Real servers on 127.0.0.1; tests wait for conditions, never for seconds.
"""

from __future__ import annotations

import http.client
import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

import pytest

from eagle3_raw.launching.reference import ReferenceProcess, free_port, healthy
from eagle3_raw.reference.identity import reported_vllm_identity
from eagle3_raw.reference.ledger import read_ledger
from tests.real_vllm.model import tiny_qwen3
from tests.real_vllm.server import CPU_FLAGS, MAX_MODEL_LEN
from tests.reference.wire import Reply, get, request, wait_until
from tests.support import tokenizers

Launch = Callable[..., ReferenceProcess]
VLLM = ("--protocol", "vllm")
PROMPT = [6138, 315, 198, 39, 72, 6139, 198, 6138, 354, 198]
LONG = {"max_tokens": 400, "temperature": 0, "ignore_eos": True}


def in_thread(call: Callable[[], Reply]) -> tuple[threading.Thread, list[Reply]]:
    out: list[Reply] = []
    worker = threading.Thread(target=lambda: out.append(call()), daemon=True)
    worker.start()
    return worker, out


def stats(server: ReferenceProcess) -> dict[str, Any]:
    result: dict[str, Any] = get(server.url, "/reference/stats").json()
    return result


@pytest.mark.parametrize("route", ["generate", "completions"])
def test_abort_requests_ends_a_generation_in_capacity_mode(launch: Launch, route: str) -> None:
    """The aborted request answers 200, ``finish_reason: abort``, ``stop_reason`` null, the ids so far."""
    server = launch(*VLLM, "--enable-scale-out", "--slots", "1", "--ms-per-token", "20")
    if route == "generate":
        body = {"token_ids": PROMPT, "sampling_params": LONG, "request_id": "a1"}
        path, engine_id = "/inference/v1/generate", "generate-tokens-a1"
    else:
        path, body, engine_id = "/v1/completions", {"prompt": PROMPT, **LONG, "request_id": "a1",
                                                    "return_token_ids": True}, "cmpl-a1-0"  # fmt: skip
    worker, out = in_thread(lambda: request(server.url, path, body))
    wait_until(lambda: stats(server)["running"] == 1)
    aborted = request(server.url, "/inference/v1/abort_requests", {"request_ids": [engine_id]})
    assert aborted.status == 200 and aborted.body == b""
    worker.join(timeout=30)
    choice = out[0].json()["choices"][0]
    assert out[0].status == 200 and choice["finish_reason"] == "abort" and choice["stop_reason"] is None
    assert len(choice["token_ids"]) < 400 and stats(server)["aborted_requests"] == 1


def test_a_hang_answers_abort_once_aborted(launch: Launch) -> None:
    server = launch(*VLLM, "--enable-scale-out", "--faults", "hang=1")
    body = {"token_ids": PROMPT, "sampling_params": {"max_tokens": 4}, "request_id": "h1"}
    worker, out = in_thread(lambda: request(server.url, "/inference/v1/generate", body))
    wait_until(lambda: stats(server)["faults"].get("hang") == 1)
    request(server.url, "/inference/v1/abort_requests", {"request_ids": ["generate-tokens-h1"]})
    worker.join(timeout=30)
    choice = out[0].json()["choices"][0]
    assert (out[0].status, choice["finish_reason"], choice["token_ids"]) == (200, "abort", [])


def test_faults_break_replies_as_named(launch: Launch, tmp_path: Any) -> None:
    ledger = tmp_path / "ledger.jsonl"
    body = {"prompt": PROMPT, "max_tokens": 8, "return_token_ids": True}
    for fault, check in (
        ("http500", lambda r: r.status == 500 and r.json()["error"]["code"] == 500),
        ("http503", lambda r: r.status == 503 and r.json()["error"]["type"] == "ServiceUnavailableError"),
        ("abort", lambda r: r.status == 200 and r.json()["choices"][0]["finish_reason"] == "abort"),
    ):
        server = launch(*VLLM, "--faults", f"{fault}=1", "--ledger", str(ledger))
        assert check(request(server.url, "/v1/completions", body)), fault
        server.stop()
    server = launch(*VLLM, "--faults", "reset=1")
    with pytest.raises((OSError, http.client.HTTPException)):  # a cut body, or a dropped connection
        request(server.url, "/v1/completions", body)
    faults = [line["fault"] for line in read_ledger(ledger)]
    assert faults == ["http500", "http503", "abort"]


def test_the_ledger_records_vllm_generations(launch: Launch, tmp_path: Any) -> None:
    ledger = tmp_path / "ledger.jsonl"
    server = launch(*VLLM, "--enable-scale-out", "--ledger", str(ledger))
    done = request(server.url, "/v1/completions", {"prompt": PROMPT, "max_tokens": 8, "request_id": "l1",
                                                   "return_token_ids": True}).json()  # fmt: skip
    request(server.url, "/inference/v1/generate", {"token_ids": PROMPT, "sampling_params": {"max_tokens": 4}})
    refused = request(server.url, "/v1/completions", {"prompt": PROMPT, "temperature": -1})
    assert refused.status == 400
    first, second, third = read_ledger(ledger)
    assert first["endpoint"] == "/v1/completions" and first["rid"] == "cmpl-l1-0" and first["delivered"]
    assert first["input_ids"] == PROMPT and first["output_ids"] == done["choices"][0]["token_ids"]
    assert first["finish_reason"] == done["choices"][0]["finish_reason"] and first["status"] == 200
    assert second["endpoint"] == "/inference/v1/generate" and second["rid"].startswith("generate-tokens-")
    assert third["status"] == 400 and third["error"]["error"]["param"] == "temperature"


def test_the_api_key_guards_v1_and_inference_only(launch: Launch) -> None:
    for server in (launch(*VLLM, "--api-key", "k1"), launch(*VLLM, env={"VLLM_API_KEY": "k1"})):
        denied = request(server.url, "/v1/completions", {"prompt": PROMPT})
        assert (denied.status, denied.json()) == (401, {"error": "Unauthorized"})
        ok = request(
            server.url, "/v1/completions", {"prompt": PROMPT}, headers={"Authorization": "Bearer k1"}
        )
        assert ok.status == 200
        assert get(server.url, "/health").status == 200  # vLLM guards /v1, /v2, /inference, /cohere
        assert request(server.url, "/tokenize", {"prompt": "x"}).status == 200


def test_scale_out_and_dev_mode_routes_are_switched_off_by_default(launch: Launch) -> None:
    server = launch(*VLLM)
    for path in ("/inference/v1/generate", "/inference/v1/abort_requests", "/v1/chat/completions/render",
                 "/v1/chat/completions/derender"):  # fmt: skip
        reply = request(server.url, path, {})
        assert reply.status == 403 and reply.json()["error"]["type"] == "PermissionDeniedError", path
    for path in ("/server_info", "/weight_info"):
        assert get(server.url, path).json() == {"detail": "Not Found"}


def test_vllms_flag_spellings_are_accepted_and_reported(launch: Launch) -> None:
    server = launch(
        *VLLM, "--served-model-name", "tiny", "--max-model-len", "1024", "--max-num-seqs", "7",
        "--tensor-parallel-size", "2", "--data-parallel-size", "1", "--seed", "3", "--load-format", "dummy",
        "--dtype", "bfloat16", "--generation-config", "vllm", "--trust-remote-code", "--revision", "main",
        "--vllm-version", "0.33.0", env={"VLLM_SERVER_DEV_MODE": "1"},
    )  # fmt: skip
    assert get(server.url, "/version").json() == {"version": "0.33.0"}
    assert get(server.url, "/v1/models").json()["data"][0]["id"] == "tiny"
    config = get(server.url, "/server_info").json()["vllm_config"]
    model = config["model_config"]
    assert (model["served_model_name"], model["max_model_len"], model["dtype"]) == ("tiny", 1024, "bfloat16")
    assert (model["seed"], model["generation_config"], model["revision"]) == (3, "vllm", "main")
    assert config["scheduler_config"] == {"max_num_seqs": 7}
    assert config["parallel_config"]["tensor_parallel_size"] == 2
    fingerprint = request(server.url, "/v1/completions", {"prompt": PROMPT}).json()["system_fingerprint"]
    assert re.fullmatch("vllm-0.33.0-tp2-[0-9a-f]{8}", fingerprint)  # version, sizes above 1, a hash
    computed = reported_vllm_identity(server.args)  # what it answers, known without starting it
    assert computed["/server_info"]["vllm_config"] == config
    assert computed["/version"] == get(server.url, "/version").json()
    assert computed["/v1/models"]["data"][0]["id"] == "tiny"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--tool-call-parser", "qwen25"), "--tool-call-parser 'qwen25'"),
        (("--enable-auto-tool-choice",), "--enable-auto-tool-choice requires --tool-call-parser"),
        (("--model-path", "x"), "unrecognized arguments: --model-path"),
        (("--max-num-seqs", "0"), "--max-num-seqs must be at least 1"),
    ],
)
def test_bad_vllm_flags_are_refused(args: tuple[str, ...], message: str) -> None:
    command = [sys.executable, "-m", "eagle3_raw.reference", *VLLM, "--port", str(_free_port()), *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and message in done.stderr


def test_serve_reference_sends_protocol_vllm_to_the_module() -> None:
    command = [sys.executable, "-m", "eagle3_raw.cli", "serve-reference", "--protocol", "vllm"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--protocol vllm takes vLLM's own flags" in done.stderr


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_the_vllm_mode_generates_what_the_sglang_mode_does(launch: Launch) -> None:
    """Same engine: the same ids and sampling (vLLM's names) give the same output on both protocols."""
    sglang, vllm = launch(), launch(*VLLM, "--enable-scale-out")
    for sampling in ({"temperature": 0}, {"temperature": 0.8, "top_p": 0.9, "seed": 7}):
        sglang_params = {
            "max_new_tokens": 64,
            **{("sampling_seed" if k == "seed" else k): v for k, v in sampling.items()},
        }
        expected = request(
            sglang.url, "/generate", {"input_ids": PROMPT, "sampling_params": sglang_params}
        ).json()
        body = {"token_ids": PROMPT, "sampling_params": {"max_tokens": 64, **sampling}}
        got = request(vllm.url, "/inference/v1/generate", body).json()
        assert got["choices"][0]["token_ids"] == expected["output_ids"]


def test_it_stands_in_for_the_real_vllm_on_the_tiers_own_command_line(tmp_path: Any) -> None:
    """``[python, -m, eagle3_raw.reference, --protocol, vllm]`` in place of vLLM's API server, the
    rest of the real-vLLM tier's command unchanged: the tiny Qwen3 folder, dummy weights, its parsers."""
    model, port = tiny_qwen3(tmp_path), free_port()
    flags = ("--reasoning-parser", "qwen3", "--tool-call-parser", "hermes", "--enable-auto-tool-choice")
    command = [sys.executable, "-m", "eagle3_raw.reference", *VLLM, "--model", str(model),
               "--host", "127.0.0.1", "--port", str(port), *CPU_FLAGS, *flags]  # fmt: skip
    env = {"VLLM_TARGET_DEVICE": "cpu", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    process = subprocess.Popen(
        command, env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: healthy(url) or process.poll() is not None, timeout=60)
        assert process.poll() is None, process.stderr.read() if process.stderr else ""
        card = get(url, "/v1/models").json()["data"][0]
        assert (card["id"], card["max_model_len"]) == (str(model), MAX_MODEL_LEN)
        chat = [{"role": "user", "content": "Hi"}]
        ids = request(url, "/tokenize", {"messages": chat}).json()["tokens"]
        expected = tokenizers.load("qwen3").apply_chat_template(
            chat, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        assert ids == list(expected)
        sampling = {"max_tokens": 8, "temperature": 0, "ignore_eos": True}
        reply = request(url, "/inference/v1/generate", {"token_ids": ids, "sampling_params": sampling})
        assert len(reply.json()["choices"][0]["token_ids"]) == 8
    finally:
        process.terminate()
        process.wait(timeout=30)
