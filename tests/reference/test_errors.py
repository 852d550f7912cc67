"""Errors, limits and aborts of ``/generate`` (``shared/sglang-protocol.md`` §5, §9), one test each."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from types import ModuleType
from typing import Any

import pytest

from eagle3_raw.launching.reference import ReferenceProcess, launch_reference
from tests.reference.conformance import Conformance, is_validation_error
from tests.reference.test_conformance import PROMPT
from tests.reference.wire import Reply, get, post_many, request, wait_until

Launch = Callable[..., ReferenceProcess]


@pytest.fixture(scope="module")
def small(contract: ModuleType) -> Iterator[Conformance]:
    """A server with ``--context-length 1000`` (so ``max_req_input_len`` is 994)."""
    with launch_reference(args=["--context-length", "1000"]) as process:
        yield Conformance(process.url, contract)


def slow(launch: Launch, contract: ModuleType, *args: str) -> Conformance:
    """A capacity-mode server where a generation of N tokens takes N x 10 ms."""
    return Conformance(launch("--slots", "1", "--ms-per-token", "10", *args).url, contract)


def long_run(rid: str | None = None, tokens: int = 300) -> dict[str, Any]:
    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True}}
    return body if rid is None else {**body, "rid": rid}


def stats(url: str) -> dict[str, Any]:
    value: dict[str, Any] = get(url, "/reference/stats").json()
    return value


@pytest.fixture
def background() -> Iterator[Callable[..., Future[Reply]]]:
    with ThreadPoolExecutor(max_workers=4) as pool:
        yield lambda fn, *args, **kwargs: pool.submit(fn, *args, **kwargs)


def value_error(reply: Reply) -> str:
    assert reply.status == 400, reply.body
    body = reply.json()
    assert list(body) == ["error"] and list(body["error"]) == ["message"], body
    message: str = body["error"]["message"]
    return message


# --- the three 400 shapes, and the 500 ---------------------------------------------------------


def test_a_json_type_error_gets_fastapis_validation_body(sglang: Conformance) -> None:
    reply = sglang.generate({"input_ids": "abc"})
    assert reply.status == 400 and is_validation_error(reply.json()) and reply.json()["code"] == 400


@pytest.mark.parametrize("raw", [b"{not json", b""])
def test_a_body_that_is_not_json_gets_a_validation_body(sglang: Conformance, raw: bytes) -> None:
    reply = sglang.generate(raw=raw)
    assert reply.status == 400 and is_validation_error(reply.json())


@pytest.mark.parametrize("key", ["seed", "max_tokens"])
def test_an_unknown_sampling_key_gets_the_contracts_string_error(sglang: Conformance, key: str) -> None:
    reply = sglang.generate({"input_ids": PROMPT, "sampling_params": {key: 1}})
    assert reply.status == 400 and reply.json()["error"].startswith(f"unknown field `{key}`, expected one of")


def test_a_wrong_json_type_gets_the_contracts_string_error(sglang: Conformance) -> None:
    reply = sglang.generate({"input_ids": PROMPT, "sampling_params": {"max_new_tokens": "8"}})
    assert reply.status == 400 and reply.json() == {"error": 'invalid type: string "8", expected i64'}


@pytest.mark.parametrize(
    ("sampling", "message"),
    [
        ({"top_k": 0}, "top_k must be -1 (disable) or at least 1, got 0."),
        ({"top_p": 0.0}, "top_p must be in (0, 1], got 0.0."),
        ({"max_new_tokens": -1}, "max_new_tokens must be at least 0, got -1."),
        ({"repetition_penalty": 3}, "repetition_penalty must be in (0, 2] (1.0 = no penalty), got 3."),
    ],
)
def test_a_bad_sampling_value_gets_a_value_error_body(
    sglang: Conformance, sampling: dict[str, Any], message: str
) -> None:
    assert value_error(sglang.generate({"input_ids": PROMPT, "sampling_params": sampling})) == message


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"input_ids": []}, "input_ids cannot be empty."),
        ({"sampling_params": {}}, "Either text, input_ids or input_embeds should be provided."),
        (
            {"input_ids": [[1], [2]], "rid": ["a", "a"]},
            "Duplicate request IDs detected within the request: ['a']",
        ),
        (
            {"input_ids": [[1], [2]], "rid": ["a"]},
            "The specified rids length mismatch with the batch_size for batch processing.",
        ),
    ],
)
def test_normalization_errors_get_a_value_error_body(
    sglang: Conformance, body: dict[str, Any], message: str
) -> None:
    assert value_error(sglang.generate(body)) == message


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"routed_dp_rank": 1}, "routed_dp_rank=1 out of range [0, 1)"),
        ({"data_parallel_rank": 2}, "routed_dp_rank=2 out of range [0, 1)"),
        ({"max_thinking_tokens": 5}, "max_thinking_tokens requires the server to be launched with"),
        ({"lora_path": "my-adapter"}, "LoRA adapter 'my-adapter' was requested, but LoRA is not enabled."),
        (
            {"session_id": "s", "session_params": {"id": "s"}},
            "session_id and session_params cannot both be set.",
        ),
    ],
)
def test_request_options_the_server_is_not_set_up_for_are_refused(
    sglang: Conformance, extra: dict[str, Any], message: str
) -> None:
    assert value_error(sglang.generate({"input_ids": PROMPT, **extra})).startswith(message)
    assert (
        sglang.generate(
            {"input_ids": PROMPT, "routed_dp_rank": 0, "sampling_params": {"max_new_tokens": 1}}
        ).status
        == 200
    )


def test_uncaught_errors_are_a_plain_500(sglang: Conformance) -> None:
    reply = sglang.generate({"input_ids": PROMPT, "sampling_params": {"choice": ["a", "b"]}})
    assert (reply.status, reply.content_type, reply.body) == (500, "text/plain", b"Internal Server Error")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"return_hidden_states": True}, "The server is not configured to return hidden states."),
        ({"custom_logit_processor": "x"}, "The server is not configured to enable custom logit processor."),
        ({"token_ids_logprob": [-1]}, "token_ids_logprob contains out-of-vocabulary token id -1"),
        (
            {"token_ids_logprob": [2_000_000_000]},
            "token_ids_logprob contains out-of-vocabulary token id 2000000000",
        ),
        ({"token_ids_logprob": [[1], [2]]}, "token_ids_logprob must be a flat list of integers."),
        ({"return_logprob": True}, "return_logprob is not supported by the reference server"),
    ],
)
def test_features_the_server_is_not_configured_for_are_refused(
    sglang: Conformance, extra: dict[str, Any], message: str
) -> None:
    assert value_error(sglang.generate({"input_ids": PROMPT, **extra})).startswith(message)


def test_input_embeds_need_the_radix_cache_disabled(sglang: Conformance) -> None:
    message = value_error(request(sglang.url, "/generate", {"input_embeds": [[0.5, 0.25]]}))
    assert message.startswith("input_embeds is provided while disable_radix_cache is False.")


def test_a_batch_with_one_bad_token_ids_logprob_row_is_refused(sglang: Conformance) -> None:
    reply = sglang.generate({"input_ids": [PROMPT, PROMPT], "token_ids_logprob": [[0], [-5]]})
    assert "out-of-vocabulary token id -5" in value_error(reply)
    assert sglang.generate({"input_ids": [PROMPT, PROMPT], "token_ids_logprob": [[0], [1]]}).status == 200


# --- length limits (--context-length 1000) ---------------------------------------------------


def test_a_prompt_longer_than_the_context_is_refused(small: Conformance) -> None:
    message = value_error(small.generate({"input_ids": [5] * 1000}))
    assert message == "The input (1000 tokens) is longer than the model's context length (1000 tokens)."


def test_prompt_plus_max_new_tokens_over_the_context_is_refused(small: Conformance) -> None:
    message = value_error(
        small.generate({"input_ids": [5] * 900, "sampling_params": {"max_new_tokens": 101}})
    )
    assert message.startswith(
        "Requested token count exceeds the model's maximum context length of 1000 tokens."
    )
    assert (
        "You requested a total of 1001 tokens: 900 tokens from the input messages and 101 tokens" in message
    )


def test_a_prompt_at_max_req_input_len_is_refused_by_the_scheduler(small: Conformance) -> None:
    assert value_error(
        small.generate({"input_ids": [5] * 994, "sampling_params": {"max_new_tokens": 1}})
    ) == (
        "Input length (994 tokens) exceeds the maximum allowed length (994 tokens). "
        "Use a shorter input or enable --allow-auto-truncate."
    )
    assert small.generate({"input_ids": [5] * 993, "sampling_params": {"max_new_tokens": 1}}).status == 200


def test_a_scheduler_refusal_arrives_as_an_abort_chunk_in_a_stream(small: Conformance) -> None:
    events = small.ok({"input_ids": [5] * 994, "stream": True})
    assert len(events) == 2 and events[1] == "[DONE]"
    finish = events[0]["meta_info"]["finish_reason"]
    assert (
        finish["type"] == "abort" and finish["status_code"] == 400 and finish["err_type"] == "BadRequestError"
    )
    assert events[0]["output_ids"] == []


def test_max_new_tokens_is_clipped_silently_near_the_context(small: Conformance) -> None:
    for sampling in ({"ignore_eos": True}, {"ignore_eos": True, "max_new_tokens": None}):
        result = small.ok({"input_ids": [5] * 900, "sampling_params": sampling})
        assert result["meta_info"]["finish_reason"] == {"type": "length", "length": 98}  # 1000 - 2 - 900
        assert len(result["output_ids"]) == 98


def test_a_batch_with_one_refused_prompt_is_refused_whole(small: Conformance) -> None:
    reply = small.generate({"input_ids": [[5] * 10, [5] * 994], "sampling_params": {"max_new_tokens": 1}})
    assert value_error(reply).startswith("Input length (994 tokens) exceeds the maximum allowed length")


# --- rids, aborts, queueing, disconnects (capacity mode) -------------------------------------


def test_the_same_rid_twice_in_a_row_is_fine(sglang: Conformance) -> None:
    body = {"rid": "again", "input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2}}
    assert sglang.generate(body).status == sglang.generate(body).status == 200


@pytest.mark.slow
def test_a_rid_in_flight_is_refused(launch: Launch, contract: ModuleType, background: Any) -> None:
    server = slow(launch, contract)
    first = background(server.generate, long_run("same", tokens=100))
    wait_until(lambda: stats(server.url)["running"] == 1)
    assert value_error(server.generate(long_run("same", tokens=1))) == "Duplicate request ID detected: same"
    assert first.result().status == 200
    assert get(server.url, "/health").status == 200


def test_abort_all_ends_running_and_queued_generations(
    launch: Launch, contract: ModuleType, background: Any
) -> None:
    server = slow(launch, contract)
    running = background(server.ok, long_run())
    wait_until(lambda: stats(server.url)["running"] == 1)
    queued = background(server.ok, long_run())
    wait_until(lambda: stats(server.url)["queue_depth"] == 1)
    assert request(server.url, "/abort_request", {"abort_all": True}).status == 200
    partial, waiting = running.result(), queued.result()
    meta = partial["meta_info"]
    assert meta["finish_reason"] == {
        "type": "abort",
        "message": "Aborted",
        "status_code": None,
        "err_type": None,
    }
    assert meta["completion_tokens"] == len(partial["output_ids"]) < 300 and meta["e2e_latency"] > 0
    assert meta["weight_version"] == "default" and isinstance(partial["text"], str)
    assert waiting["output_ids"] == [] and waiting["meta_info"]["finish_reason"] == {
        "type": "abort",
        "message": "Abort in waiting queue",
    }


@pytest.mark.slow
def test_abort_request_matches_the_exact_rid(launch: Launch, contract: ModuleType, background: Any) -> None:
    server = slow(launch, contract)
    running = background(server.ok, long_run("job-1"))  # 3 s of decoding
    wait_until(lambda: stats(server.url)["running"] == 1)
    assert request(server.url, "/abort_request", {"rid": "job"}).status == 200  # a prefix: ignored
    time.sleep(0.3)
    assert not running.done() and stats(server.url)["running"] == 1
    assert request(server.url, "/abort_request", {"rid": "job-1"}).status == 200
    meta = running.result()["meta_info"]
    assert meta["finish_reason"]["type"] == "abort" and 30 <= meta["completion_tokens"] < 300


@pytest.mark.slow
def test_a_full_queue_gets_503(launch: Launch, contract: ModuleType, background: Any) -> None:
    server = slow(launch, contract, "--max-queued-requests", "0")
    running = background(server.ok, long_run(tokens=50))
    wait_until(lambda: stats(server.url)["running"] == 1)
    reply = server.generate(long_run(tokens=1))
    assert reply.status == 503 and reply.json() == {
        "object": "error",
        "message": "The request queue is full.",
        "type": "503",
        "param": None,
        "code": 503,
    }
    running.result()


@pytest.mark.slow
def test_a_client_disconnect_aborts_the_generation(launch: Launch, contract: ModuleType) -> None:
    server = slow(launch, contract)
    [outcome] = post_many(server.url, [long_run(tokens=1000)], timeout=0.5)
    assert outcome.error == "timeout"
    wait_until(lambda: stats(server.url)["running"] == 0)
    assert stats(server.url)["aborted_requests"] == 1 and stats(server.url)["completed_requests"] == 0
