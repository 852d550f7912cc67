"""Faults on demand (``--faults``, ``--fault-seed``): rates, reproducibility, and what each one does."""

from __future__ import annotations

import socket
from collections import Counter
from collections.abc import Callable

import orjson
import pytest

from eagle3_raw.launching.reference import ReferenceProcess
from eagle3_raw.reference.faults import FaultSpec
from tests.reference.conformance import check_object
from tests.reference.contract import load_contract
from tests.reference.test_conformance import PROMPT
from tests.reference.wire import Outcome, get, post_many, request

Launch = Callable[..., ReferenceProcess]
SMALL = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}}
RATES = {"http500": 0.05, "http503": 0.02, "reset": 0.02, "abort": 0.02, "hang": 0.01}


def kind(outcome: Outcome) -> str:
    """The fault a client observes in one outcome (``none`` for a normal answer)."""
    if outcome.error == "timeout":
        return "hang"
    if outcome.error is not None:
        return "reset"
    if outcome.status == 500:
        assert outcome.body == b"Internal Server Error"
        return "http500"
    if outcome.status == 503:
        assert load_contract().ErrorBody.from_json_value(outcome.json()).code == 503
        return "http503"
    assert outcome.status == 200, outcome
    results = outcome.json()
    results = results if isinstance(results, list) else [results]
    for result in results:
        check_object(load_contract(), result)
    return "abort" if any(r["meta_info"]["finish_reason"]["type"] == "abort" for r in results) else "none"


def spec(rates: dict[str, float]) -> str:
    return ",".join(f"{name}={rate}" for name, rate in rates.items())


@pytest.mark.slow
def test_fault_rates_are_near_their_settings(launch: Launch) -> None:
    server = launch("--faults", spec(RATES), "--fault-seed", "7")
    outcomes = post_many(server.url, [SMALL] * 2000, concurrency=64, timeout=5.0)
    seen = Counter(kind(outcome) for outcome in outcomes)
    injected = get(server.url, "/reference/stats").json()["faults"]
    assert {name: seen[name] for name in RATES} == {name: injected.get(name, 0) for name in RATES}
    for name, rate in RATES.items():
        expected, sigma = 2000 * rate, (2000 * rate * (1 - rate)) ** 0.5
        assert abs(seen[name] - expected) <= 4 * sigma + 1, (name, seen[name], expected)
    assert get(server.url, "/health").status == 200


@pytest.mark.slow
def test_the_fault_sequence_is_reproducible_with_a_seed(launch: Launch) -> None:
    rates = spec({"http500": 0.2, "http503": 0.2, "reset": 0.2, "abort": 0.2})

    def sequence(seed: str) -> list[str]:
        server = launch("--faults", rates, "--fault-seed", seed)
        return [kind(outcome) for outcome in post_many(server.url, [SMALL] * 60, concurrency=1)]

    first = sequence("11")
    assert sequence("11") == first
    assert sequence("12") != first
    assert set(first) == {"http500", "http503", "reset", "abort", "none"}


def test_http500_is_sglangs_plain_internal_server_error(launch: Launch) -> None:
    reply = request(launch("--faults", "http500=1").url, "/generate", SMALL)
    assert (reply.status, reply.content_type, reply.body) == (500, "text/plain", b"Internal Server Error")


def test_http503_has_sglangs_error_object(launch: Launch) -> None:
    reply = request(launch("--faults", "http503=1").url, "/generate", SMALL)
    assert reply.status == 503 and reply.json() == {
        "object": "error",
        "message": "The request queue is full.",
        "type": "503",
        "param": None,
        "code": 503,
    }


def _raw_exchange(server: ReferenceProcess, body: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        head = f"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
        sock.sendall(head.encode() + body)
        received = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            received += chunk
        return received


def test_reset_sends_the_headers_and_part_of_the_body_then_drops_the_connection(launch: Launch) -> None:
    server = launch("--faults", "reset=1")
    big = {"input_ids": [PROMPT] * 4, "sampling_params": {"max_new_tokens": 200, "ignore_eos": True}}
    received = _raw_exchange(server, orjson.dumps(big))
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    length = int(
        next(
            line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
        )
    )
    assert len(body) < length
    assert [kind(o) for o in post_many(server.url, [SMALL] * 5)] == ["reset"] * 5


def test_abort_ends_one_generation_early_with_http_200(launch: Launch) -> None:
    server = launch("--faults", "abort=1", "--fault-seed", "3")
    body = {"input_ids": [PROMPT] * 3, "sampling_params": {"max_new_tokens": 50, "ignore_eos": True}}
    results = request(server.url, "/generate", body).json()
    aborted = [r for r in results if r["meta_info"]["finish_reason"]["type"] == "abort"]
    assert len(aborted) == 1
    assert aborted[0]["meta_info"]["finish_reason"]["message"] == "Aborted"
    assert len(aborted[0]["output_ids"]) == aborted[0]["meta_info"]["completion_tokens"] < 50


@pytest.mark.slow
def test_hang_never_answers_and_the_server_stays_healthy(launch: Launch) -> None:
    server = launch("--faults", "hang=1")
    assert [o.error for o in post_many(server.url, [SMALL] * 3, timeout=0.5)] == ["timeout"] * 3
    assert get(server.url, "/health").status == 200


def test_faults_apply_to_generate_only(launch: Launch) -> None:
    server = launch("--faults", "http500=1")
    assert get(server.url, "/health").status == 200 and get(server.url, "/server_info").status == 200
    assert request(server.url, "/tokenize", {"prompt": "hi"}).status == 200


@pytest.mark.parametrize("text", ["http500=2", "nope=0.1", "http500", "http500=0.6,http503=0.6", "reset=x"])
def test_bad_fault_specs_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"fault|rates"):
        FaultSpec.parse(text)
