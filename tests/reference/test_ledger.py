"""The ledger (``--ledger FILE``): every delivered generation exactly once, with its ids."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from eagle3_raw.launching.reference import ReferenceProcess
from eagle3_raw.reference.ledger import Ledger, read_ledger
from tests.reference.conformance import Conformance, check_object, check_outcomes
from tests.reference.contract import load_contract
from tests.reference.test_conformance import PROMPT, chat
from tests.reference.wire import Outcome, post_many, wait_until

Launch = Callable[..., ReferenceProcess]


def received(outcomes: list[Outcome]) -> list[dict[str, Any]]:
    """Every generation a client received intact (HTTP 200, body complete), checked by the contract."""
    objects: list[dict[str, Any]] = []
    for outcome in outcomes:
        if outcome.status == 200 and outcome.error is None:
            value = outcome.json()
            objects.extend(value if isinstance(value, list) else [value])
    for obj in objects:
        check_object(load_contract(), obj)
    return objects


BODIES: list[dict[str, Any]] = [
    {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 8}},
    {"input_ids": [chat("a"), chat("b")], "rid": "x", "sampling_params": {"max_new_tokens": 5}},
    {"input_ids": chat("c"), "sampling_params": {"n": 3, "max_new_tokens": 4, "temperature": 0.7}},
    {"text": "Hello", "sampling_params": {"max_new_tokens": 3, "stop": "zzz"}},
    {"input_ids": PROMPT, "sampling_params": {"top_k": 0}},
    {"input_ids": PROMPT, "sampling_params": {"seed": 1}},
]


def test_every_delivered_generation_appears_exactly_once_with_its_ids(launch: Launch, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    server = launch("--ledger", str(ledger))
    bodies = [
        {**body, "rid": f"{body['rid']}{i}"} if "rid" in body else body for i in range(20) for body in BODIES
    ]
    outcomes = post_many(server.url, bodies, concurrency=8)
    check_outcomes(load_contract(), bodies, outcomes)
    got = received(outcomes)
    lines = [r for r in read_ledger(ledger) if r["status"] == 200 and r["delivered"]]
    assert len(lines) == len(got) == 20 * (1 + 2 + 3 + 1)
    by_rid = {line["rid"]: line for line in lines}
    assert len(by_rid) == len(lines)
    for obj in got:
        line = by_rid[obj["meta_info"]["id"]]
        assert line["output_ids"] == obj["output_ids"]
        assert line["finish_reason"] == obj["meta_info"]["finish_reason"]
        assert len(line["input_ids"]) == obj["meta_info"]["prompt_tokens"]
    refused = Counter(r["status"] for r in read_ledger(ledger) if "rid" not in r)
    assert refused == {400: 40}


def test_a_ledger_line_keeps_the_request_as_received(
    launch: Launch, contract: ModuleType, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger.jsonl"
    server = launch("--ledger", str(ledger))
    sampling = {"max_new_tokens": 6, "temperature": 0.5, "sampling_seed": 42}
    result = Conformance(server.url, contract).ok(
        {"rid": "r-1", "input_ids": PROMPT, "sampling_params": sampling}
    )
    [line] = read_ledger(ledger)
    assert (line["rid"], line["input_ids"], line["sampling_params"]) == ("r-1", PROMPT, sampling)
    assert (line["output_ids"], line["status"], line["fault"], line["delivered"]) == (
        result["output_ids"],
        200,
        None,
        True,
    )
    assert line["port"] == server.port and line["endpoint"] == "/generate" and line["time"] > 0


@pytest.mark.slow
def test_the_ledger_marks_what_never_reached_the_client(launch: Launch, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    server = launch("--ledger", str(ledger), "--faults", "reset=0.3,hang=0.1,abort=0.2", "--fault-seed", "5")
    outcomes = post_many(server.url, [BODIES[0]] * 60, concurrency=16, timeout=2.0)
    check_outcomes(load_contract(), [BODIES[0]] * 60, outcomes)
    hangs = sum(o.error == "timeout" for o in outcomes)  # logged once the server sees the client leave
    wait_until(lambda: sum(line["fault"] == "hang" for line in read_ledger(ledger)) == hangs)
    lines = read_ledger(ledger)
    delivered = [line for line in lines if line["status"] == 200 and line["delivered"]]
    assert sorted(line["rid"] for line in delivered) == sorted(
        obj["meta_info"]["id"] for obj in received(outcomes)
    )
    faults = Counter(line["fault"] for line in lines if not line["delivered"])
    assert faults["reset"] == sum(o.error not in (None, "timeout") for o in outcomes)
    assert faults["hang"] == hangs
    assert all(line["delivered"] for line in lines if line["fault"] == "abort")


@pytest.mark.slow
def test_a_restarted_server_appends_to_the_same_ledger(
    launch: Launch, contract: ModuleType, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger.jsonl"
    server = launch("--ledger", str(ledger))
    sglang = Conformance(server.url, contract)
    sglang.ok(BODIES[0])
    server.restart(kill=True)
    sglang.ok(BODIES[0])
    assert [line["request"] for line in read_ledger(ledger)] == [0, 0]


def test_a_torn_last_line_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    ledger = Ledger(path, port=1)
    ledger.write([{"rid": "a"}, {"rid": "b"}])
    ledger.close()
    with path.open("ab") as f:
        f.write(b'{"rid": "c", "outp')
    assert [line["rid"] for line in read_ledger(path)] == ["a", "b"]
