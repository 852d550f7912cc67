"""``curl`` against a running ``eagle3-raw serve-reference``: what SGLang would answer, documented cases."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import orjson
import pytest

from eagle3_raw.launching.reference import free_port
from tests.reference.conformance import check_object
from tests.reference.contract import contract_error
from tests.reference.wire import get, sse_events, wait_until
from tests.support.pace import scaled

pytestmark = pytest.mark.skipif(shutil.which("curl") is None, reason="needs the curl binary")


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    """``eagle3-raw serve-reference`` started by its console script, as a user would."""
    script = Path(sys.executable).with_name("eagle3-raw")
    port = free_port()
    process = subprocess.Popen(
        [str(script), "serve-reference", "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    address = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return get(address, "/health", timeout=1).status == 200
        except OSError:
            return process.poll() is not None

    wait_until(up, timeout=30)
    assert process.poll() is None, "eagle3-raw serve-reference exited"
    yield address
    process.terminate()
    process.wait(scaled(10))


def curl(url: str, body: Any, *extra: str) -> tuple[int, str, bytes]:
    """``curl -s -X POST {url}/generate -H 'Content-Type: application/json' -d BODY``: status, type, body."""
    command = ["curl", "-s", "-X", "POST", f"{url}/generate", "-H", "Content-Type: application/json"]
    command += ["-d", orjson.dumps(body).decode(), "-w", "\n%{http_code} %{content_type}", *extra]
    out = subprocess.run(command, capture_output=True, check=True, timeout=scaled(30)).stdout
    payload, _, trailer = out.rpartition(b"\n")
    status, _, content_type = trailer.decode().partition(" ")
    return int(status), content_type, payload


def test_curl_single_prompt(url: str, contract: ModuleType) -> None:
    body = {"text": "The capital of France is", "sampling_params": {"temperature": 0, "max_new_tokens": 16}}
    status, content_type, payload = curl(url, body)
    assert (status, content_type) == (200, "application/json")
    result = orjson.loads(payload)
    check_object(contract, result)
    assert (
        list(result) == ["text", "output_ids", "meta_info"] and result["meta_info"]["completion_tokens"] <= 16
    )


def test_curl_batch(url: str, contract: ModuleType) -> None:
    status, _, payload = curl(
        url, {"input_ids": [[6138, 315], [6138, 315, 198]], "sampling_params": {"max_new_tokens": 4}}
    )
    results = orjson.loads(payload)
    assert status == 200 and [r["meta_info"]["prompt_tokens"] for r in results] == [2, 3]
    for result in results:
        check_object(contract, result)


def test_curl_n_2(url: str) -> None:
    status, _, payload = curl(
        url, {"text": "Hi", "rid": "mine", "sampling_params": {"n": 2, "max_new_tokens": 4}}
    )
    results = orjson.loads(payload)
    assert status == 200 and len(results) == 2
    assert len({r["meta_info"]["id"] for r in results} - {"mine"}) == 2


def test_curl_unknown_sampling_key(url: str, contract: ModuleType) -> None:
    body = {"text": "Hi", "sampling_params": {"seed": 42, "max_new_tokens": 4}}
    status, content_type, payload = curl(url, body)
    assert (status, content_type) == (400, "application/json")
    assert orjson.loads(payload) == {"error": contract_error(contract, body)}


def test_curl_stream(url: str, contract: ModuleType) -> None:
    status, content_type, payload = curl(
        url, {"text": "Hi", "stream": True, "sampling_params": {"max_new_tokens": 5}}, "-N"
    )
    events = sse_events(payload)
    assert (status, content_type) == (200, "text/event-stream") and events[-1] == "[DONE]"
    for event in events[:-1]:
        check_object(contract, event)
    assert events[-2]["meta_info"]["finish_reason"] is not None
