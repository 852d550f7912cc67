"""The reference server's vLLM mode against vLLM 0.33.0's own pydantic models: every request a
vLLM client sends it and every answer it gives are taken by the matching model of the stock
``vllm==0.33.0`` wheel (:mod:`tests.real_vllm.contract`), and an answer carries no key vLLM's model
lacks. What the CPU build of 0.32 shows by running is asserted in ``test_routes.py``; this checks
the shapes 0.33 declares. In the real-vLLM tier because importing the models needs its venv's torch.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eagle3_raw.launching.reference import ReferenceProcess, launch_reference
from tests.real_vllm.contract import validate
from tests.reference.test_vllm_routes import CONVERSATIONS, FLAGS, WEATHER
from tests.reference.wire import get, request

Check = tuple[str, Any]


@pytest.fixture(scope="module")
def reference() -> Iterator[ReferenceProcess]:
    with launch_reference(args=FLAGS) as server:
        yield server


def _exchange(server: ReferenceProcess, path: str, request_model: str, body: Any, response_model: str,
              checks: list[Check]) -> Any:  # fmt: skip
    """Send ``body`` and record both sides for validation; returns the answer."""
    reply = request(server.url, path, body)
    checks += [(request_model, body), (response_model, reply.json())]
    return reply.json()


def _exchanges(server: ReferenceProcess) -> list[Check]:
    checks: list[Check] = [("ModelList", get(server.url, "/v1/models").json())]
    chat = CONVERSATIONS["tools"]
    ids = _exchange(server, "/tokenize", "TokenizeChatRequest", chat, "TokenizeResponse", checks)["tokens"]
    _exchange(server, "/tokenize", "TokenizeCompletionRequest", {"prompt": "Hi", "add_special_tokens": False},
              "TokenizeResponse", checks)  # fmt: skip
    _exchange(server, "/detokenize", "DetokenizeRequest", {"tokens": ids}, "DetokenizeResponse", checks)
    completion = {"prompt": ids, "max_tokens": 32, "temperature": 0, "return_token_ids": True,
                  "request_id": "c1", "stop_token_ids": [6139], "seed": 1, "top_k": 0, "min_p": 0.0,
                  "ignore_eos": False, "skip_special_tokens": True}  # fmt: skip
    _exchange(server, "/v1/completions", "CompletionRequest", completion, "CompletionResponse", checks)
    _exchange(server, "/v1/completions", "CompletionRequest", {"prompt": ids}, "CompletionResponse", checks)
    generate = {"token_ids": ids, "request_id": "g1", "sampling_params": {"max_tokens": 32, "temperature": 0}}
    response = _exchange(server, "/inference/v1/generate", "GenerateRequest", generate,
                         "GenerateTokensResponse", checks)  # fmt: skip
    chat_request = {**chat, "messages": chat["messages"][:1], "tools": [WEATHER]}
    derender = {"generate_response": response, "chat_request": chat_request}
    _exchange(server, "/v1/chat/completions/derender", "DerenderChatRequest", derender,
              "ChatCompletionResponse", checks)  # fmt: skip
    render = request(server.url, "/v1/chat/completions/render", CONVERSATIONS["plain"]).json()
    checks += [("ChatCompletionRequest", CONVERSATIONS["plain"]), ("GenerateRequest", render)]
    refused = (
        ("/v1/completions", {"prompt": ids, "model": "nope"}), ("/v1/completions", {"prompt": [9] * 600}),
        ("/inference/v1/generate", {"token_ids": [9] * 600, "sampling_params": {}}),
    )  # fmt: skip
    for path, body in refused:
        checks.append(("ErrorResponse", request(server.url, path, body).json()))
    return checks


def test_requests_and_answers_fit_vllms_own_models(real_vllm_venv: Path, reference: ReferenceProcess) -> None:
    checks = _exchanges(reference)
    verdicts = validate(real_vllm_venv, checks)
    failures = [(name, verdict) for (name, _), verdict in zip(checks, verdicts, strict=True) if verdict]
    assert not failures, failures
