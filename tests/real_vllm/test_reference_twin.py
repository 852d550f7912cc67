"""The reference server's vLLM mode beside the real vLLM, on the same model folder and flags: the
same requests get the same statuses, every key the real server sends is in the reference's answer
too (what a client may rely on), and where both answer from the tokenizer, template or parsers (not
the engine) the same values: ``/tokenize`` (chat and text), ``/detokenize``, render's ids, derender's
split of a fixed text, and the refusals' messages.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eagle3_raw.launching.reference import ReferenceProcess, launch_reference
from tests.real_vllm.conftest import SERVER_FLAGS
from tests.real_vllm.server import CPU_FLAGS, MAX_MODEL_LEN, RealVLLM
from tests.real_vllm.test_routes import CONVERSATIONS, PROMPT, WEATHER, get, send

THINK_TEXT = ('<think>\nLet me look.\n</think>\n\nChecking.\n<tool_call>\n'
              '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>')  # fmt: skip


@pytest.fixture(scope="module")
def twin(vllm_model: Path) -> Iterator[ReferenceProcess]:
    """The vLLM-mode reference on the real tier's model folder, with the real server's flags."""
    with launch_reference(
        args=("--protocol", "vllm", "--model", str(vllm_model), *CPU_FLAGS, *SERVER_FLAGS)
    ) as s:
        yield s


def keys(value: Any, where: str = "") -> set[str]:
    """Every key path of a JSON value (a list by its first item)."""
    if isinstance(value, dict):
        return {f"{where}{k}" for k in value} | {p for k, v in value.items() for p in keys(v, f"{where}{k}.")}
    if isinstance(value, list) and value:
        return keys(value[0], f"{where}[].")
    return set()


def both(real: RealVLLM, twin: ReferenceProcess, path: str, body: Any) -> tuple[Any, Any]:
    """Send ``body`` to both; assert the same status and that the reference has the real's keys."""
    a, b = send(real, path, body), send(twin, path, body)
    assert a.status == b.status, (path, a.body, b.body)
    missing = keys(a.body) - keys(b.body)
    assert not missing, (path, sorted(missing))
    return a.body, b.body


def test_the_reference_answers_what_the_real_vllm_answers(
    real_vllm: RealVLLM, twin: ReferenceProcess
) -> None:
    real_models, twin_models = get(real_vllm, "/v1/models"), get(twin, "/v1/models")
    assert not keys(real_models) - keys(twin_models)
    assert twin_models["data"][0]["max_model_len"] == real_models["data"][0]["max_model_len"] == MAX_MODEL_LEN
    assert get(twin, "/version") == get(real_vllm, "/version")
    for chat in CONVERSATIONS.values():
        real, ref = both(real_vllm, twin, "/tokenize", chat)
        assert ref["tokens"] == real["tokens"]
        real, ref = both(real_vllm, twin, "/v1/chat/completions/render", chat)
        assert ref["token_ids"] == real["token_ids"]
        assert ref["sampling_params"]["max_tokens"] == real["sampling_params"]["max_tokens"]
    real, ref = both(real_vllm, twin, "/tokenize", {"prompt": THINK_TEXT, "add_special_tokens": False})
    assert ref["tokens"] == real["tokens"]
    ids = real["tokens"]
    real, ref = both(real_vllm, twin, "/detokenize", {"tokens": ids})
    assert ref == real
    plain = {"prompt": PROMPT, "max_tokens": 4, "temperature": 0}
    for body in ({**plain, "return_token_ids": True, "request_id": "t1"}, plain):
        real, ref = both(real_vllm, twin, "/v1/completions", body)
        assert ref["choices"][0]["prompt_token_ids"] == real["choices"][0]["prompt_token_ids"]
        assert ref["id"] == real["id"] if "request_id" in body else len(ref["id"]) == len(real["id"])
    body = {"token_ids": PROMPT, "request_id": "t2", "sampling_params": {"max_tokens": 4, "temperature": 0}}
    real, ref = both(real_vllm, twin, "/inference/v1/generate", body)
    assert ref["request_id"] == real["request_id"] and ref["prompt_token_ids"] == real["prompt_token_ids"]
    real["choices"][0].update(token_ids=ids, finish_reason="stop", stop_reason=None)
    derender = {"generate_response": real, "chat_request": {**CONVERSATIONS["plain"], "tools": [WEATHER]}}
    real_chat, ref_chat = both(real_vllm, twin, "/v1/chat/completions/derender", derender)
    real_message, ref_message = real_chat["choices"][0]["message"], ref_chat["choices"][0]["message"]
    assert (ref_message["reasoning"], ref_message["content"]) == (
        real_message["reasoning"],
        real_message["content"],
    )
    assert [c["function"] for c in ref_message["tool_calls"]] == [
        c["function"] for c in real_message["tool_calls"]
    ]


def test_the_refusals_are_the_real_vllms(real_vllm: RealVLLM, twin: ReferenceProcess) -> None:
    refusals = [
        ("/v1/completions", {"prompt": [9707] * MAX_MODEL_LEN, "max_tokens": 1}),
        ("/v1/completions", {"prompt": [9707] * (MAX_MODEL_LEN + 1), "max_tokens": 1}),
        (
            "/inference/v1/generate",
            {"token_ids": [9707] * (MAX_MODEL_LEN + 1), "sampling_params": {"max_tokens": 1}},
        ),
        (
            "/inference/v1/generate",
            {"token_ids": [9707] * MAX_MODEL_LEN, "sampling_params": {"max_tokens": 1}},
        ),
        ("/v1/completions", {"prompt": PROMPT, "temperature": -1}),
        ("/v1/completions", {"prompt": [10**6]}),
        ("/inference/v1/generate", {"token_ids": PROMPT}),
        ("/inference/v1/abort_requests", {}),
        ("/v1/chat/completions/derender", {"generate_response": {"request_id": "x", "choices": []}}),
    ]
    for path, body in refusals:
        real, ref = both(real_vllm, twin, path, body)
        assert ref["error"] == real["error"], path
    real, ref = both(real_vllm, twin, "/v1/completions", {"prompt": PROMPT, "model": "nope"})
    # 0.32 adds " Valid aliases: ..." to the message; the reference says it as 0.33 does
    assert real["error"]["message"].startswith(ref["error"]["message"].removesuffix("."))
