"""A ``/generate`` client that holds every exchange to SGLang's own contract (``api_types.py``).

Each request body is judged by ``GenerateRequest.from_json_value`` before it is sent, and the reply
must agree: a body the contract refuses gets HTTP 400 ``{"error": <the contract's text>}`` (or
FastAPI's validation error when that gate refuses first); a body it accepts never gets the
contract's refusal shape. Every 200 reply (object, array, or each SSE chunk) must decode with
``GenerateResponse.from_json_value`` and have ``len(output_ids) == completion_tokens``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from tests.reference.contract import contract_error
from tests.reference.wire import Outcome, Reply, request


def is_validation_error(body: Any) -> bool:
    """FastAPI's 400 shape (``{"object": "error", "type": "Bad Request", ...}``)."""
    return isinstance(body, dict) and body.get("object") == "error" and body.get("type") == "Bad Request"


@dataclass(frozen=True)
class Conformance:
    """Send ``/generate`` requests to ``url``, checking each exchange against ``contract``."""

    url: str
    contract: ModuleType

    def generate(self, body: Any = None, *, raw: bytes | None = None, **kwargs: Any) -> Reply:
        reply = request(self.url, "/generate", body, raw=raw, **kwargs)
        if raw is None:
            check_exchange(self.contract, body, reply)
        elif reply.status == 200:
            check_generate_reply(self.contract, reply)
        return reply

    def ok(self, body: Any, **kwargs: Any) -> Any:
        """A request that must succeed: the parsed JSON (or the list of SSE events)."""
        reply = self.generate(body, **kwargs)
        assert reply.status == 200, (reply.status, reply.body[:500])
        return reply.events() if reply.content_type == "text/event-stream" else reply.json()


def check_outcomes(contract: ModuleType, bodies: Sequence[Any], outcomes: Sequence[Outcome]) -> None:
    """:func:`check_exchange` for concurrent ``/generate`` posts (:func:`~tests.reference.wire.post_many`),
    ``outcomes`` in the order of ``bodies``; a request that got no complete reply is skipped."""
    for body, outcome in zip(bodies, outcomes, strict=True):
        if outcome.status is not None and outcome.error is None:
            check_exchange(contract, body, outcome.reply())


def check_exchange(contract: ModuleType, body: Any, reply: Reply) -> None:
    refusal = contract_error(contract, body)
    if reply.status == 400 and reply.content_type == "application/json":
        error = reply.json()
        if refusal is not None:
            assert error == {"error": refusal} or is_validation_error(error), (refusal, error)
        else:
            assert not isinstance(error.get("error"), str), (
                f"contract-shaped refusal of a valid body: {error}"
            )
    else:
        assert refusal is None, f"the contract refuses ({refusal}) but the server answered {reply.status}"
    if reply.status == 200:
        check_generate_reply(contract, reply)


def check_generate_reply(contract: ModuleType, reply: Reply) -> None:
    if reply.content_type == "text/event-stream":
        events = reply.events()
        assert events and events[-1] == "[DONE]" and "[DONE]" not in events[:-1], events[-3:]
        for event in events[:-1]:
            if "error" in event:
                contract.GenerateStreamError.from_json_value(event)
            else:
                check_object(contract, event)
        return
    assert reply.content_type == "application/json", reply.headers
    value = reply.json()
    for obj in value if isinstance(value, list) else [value]:
        check_object(contract, obj)


def check_object(contract: ModuleType, obj: Any) -> None:
    decoded = contract.GenerateResponse.from_json_value(obj)
    assert decoded.meta_info is not None and decoded.output_ids is not None
    assert obj["meta_info"]["completion_tokens"] == len(obj["output_ids"])
