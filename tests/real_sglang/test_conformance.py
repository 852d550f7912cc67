"""The reference server held to the real SGLang: one battery of requests (``battery.py``), valid
and invalid, sent to both with the same model folder and parser flags; the same statuses, the
same fields with the same types, the error message where eagle3_raw reads it, and the same
values where both must agree (the reference model's greedy answers, the chat path's ids, the
parsers' splits). What differs on purpose is listed in ``battery.DIVERGENCES`` and the README.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from eagle3_raw.launching.reference import ReferenceProcess, launch_reference
from eagle3_raw.reference.model_files import load_tokenizer
from tests.real_sglang import battery
from tests.real_sglang.conftest import SERVER_FLAGS
from tests.real_sglang.server import RealSGLang, get

STARTUP = 120.0  # a bound on the reference server's start (seconds here; more on a busy machine)


@pytest.fixture(scope="module")
def reference(real_model: Path) -> Iterator[ReferenceProcess]:
    """The reference server on the real server's model folder, with the real server's flags."""
    args = ["--model-path", str(real_model), *SERVER_FLAGS]
    with launch_reference(args=args, startup_timeout=STARTUP) as process:
        yield process


@pytest.fixture(scope="module")
def prompt() -> list[int]:
    return list(load_tokenizer().encode(battery.PROMPT_TEXT, add_special_tokens=False))


@pytest.mark.parametrize("case", battery.CASES, ids=[c.name for c in battery.CASES])
def test_the_reference_server_answers_like_the_real_sglang(
    case: battery.Case, real_server: RealSGLang, reference: ReferenceProcess, prompt: list[int]
) -> None:
    context = get(real_server.url, "/v1/models")["data"][0]["max_model_len"]
    real = battery.without_divergences(battery.send(real_server.url, case, prompt, context), case)
    ours = battery.send(reference.url, case, prompt, context)
    assert battery.shape(ours, case) == battery.shape(real, case), (real.body, ours.body)
    if real.status >= 400:
        assert battery.error_shape(ours) == battery.error_shape(real)  # where error_message finds it
    for path in case.same:
        assert battery.value(ours.body, path) == battery.value(real.body, path), path
    if case.reads_message:
        assert battery.error_message(ours) == battery.error_message(real)


def _stream_first_chunk(
    url: str, rid: str, prompt: list[int], started: threading.Event, out: list[str]
) -> None:
    body = {"rid": rid, "input_ids": prompt, "stream": True,
            "sampling_params": {"max_new_tokens": 3000, "temperature": 0.0, "ignore_eos": True}}  # fmt: skip
    request = urllib.request.Request(url + "/generate", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=600) as reply:
        for line in reply:
            if line.startswith(b"data: "):
                started.set()
                out.append(line.decode().strip())


def _duplicate_then_abort(url: str, prompt: list[int]) -> tuple[int, str, dict[str, object]]:
    """A second request with the rid of one still streaming, then ``/abort_request`` of the first:
    the second's status and message, and the first stream's last event."""
    rid, started, events = "battery-duplicate", threading.Event(), []
    first = threading.Thread(target=_stream_first_chunk, args=(url, rid, prompt, started, events))
    first.start()
    assert started.wait(300), "the first request never streamed"
    body = {"rid": rid, "input_ids": prompt, "sampling_params": {"max_new_tokens": 4}}
    request = urllib.request.Request(url + "/generate", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    try:
        urllib.request.urlopen(request, timeout=300)
        status, message = 200, ""
    except urllib.error.HTTPError as error:
        status, message = (
            error.code,
            battery.error_message(battery.Answer(error.code, "json", json.loads(error.read()))),
        )
    abort = urllib.request.Request(url + "/abort_request", data=json.dumps({"rid": rid}).encode(),
                                   headers={"Content-Type": "application/json"})  # fmt: skip
    urllib.request.urlopen(abort, timeout=60).read()
    first.join(300)
    last = json.loads(next(e for e in reversed(events) if e != "data: [DONE]")[len("data: ") :])
    return status, message, last


def test_a_duplicate_rid_and_an_abort_answer_like_the_real_sglang(
    real_server: RealSGLang, real_model: Path, prompt: list[int]
) -> None:
    real = _duplicate_then_abort(real_server.url, prompt)
    # the reference server at a pace (5 ms a token): the first request is still running when aborted
    pace = ("--slots", "8", "--ms-per-token", "5")
    args = ["--model-path", str(real_model), *SERVER_FLAGS, *pace]
    with launch_reference(args=args, startup_timeout=STARTUP) as reference:
        ours = _duplicate_then_abort(reference.url, prompt)
    assert (
        real[0] == ours[0] == 400 and "Duplicate request ID" in real[1] and "Duplicate request ID" in ours[1]
    )
    real_finish, our_finish = real[2]["meta_info"], ours[2]["meta_info"]  # type: ignore[index]
    assert our_finish["finish_reason"]["type"] == real_finish["finish_reason"]["type"] == "abort"  # type: ignore[index]
    assert battery.skeleton(ours[2]) == battery.skeleton(real[2])
