"""The reference server's side endpoints (``shared/sglang-protocol.md`` §6, §7) and its own stats."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType
from typing import Any

import pytest

from eagle3_raw.launching.reference import ReferenceProcess, launch_reference
from eagle3_raw.reference.server import Model, ServerConfig, ServerState, build_app
from eagle3_raw.reference.server.model import packaged_model_name
from tests.reference.conformance import Conformance
from tests.reference.test_conformance import EOS, PROMPT, TOKENIZER
from tests.reference.wire import get, request

Launch = Callable[..., ReferenceProcess]


@pytest.mark.parametrize("path", ["/health", "/health_generate"])
def test_health_answers_200_with_an_empty_body(server: ReferenceProcess, path: str) -> None:
    reply = get(server.url, path)
    assert (reply.status, reply.body) == (200, b"")


@pytest.mark.parametrize("path", ["/model_info", "/get_model_info"])
def test_model_info_names_the_model_and_its_tokenizer(
    server: ReferenceProcess, contract: ModuleType, path: str
) -> None:
    info = get(server.url, path).json()
    contract.GetModelInfoResponse.from_json_value(info)
    # the packaged model has a name that is the same on every install and changes with its files
    assert info["model_path"] == info["tokenizer_path"] == packaged_model_name()
    assert info["model_path"].startswith("eagle3-raw-reference@")
    assert info["served_model_name"] == info["model_path"] and info["is_generation"] is True
    assert info["weight_version"] == "default" and info["architectures"] == ["Qwen3ForCausalLM"]


@pytest.mark.parametrize("path", ["/server_info", "/get_server_info"])
def test_server_info_reports_every_arg_version_and_scheduler_limits(
    server: ReferenceProcess, contract: ModuleType, path: str
) -> None:
    info = get(server.url, path).json()
    contract.GetServerInfoResponse.from_json_value(info)
    assert info["version"] == "0.5.23" and info["frontend"] == "python"
    assert info["context_length"] is None  # not passed on the command line
    assert isinstance(info["max_total_num_tokens"], int) and info["max_req_input_len"] == 4096 - 1 - 5
    assert isinstance(info["internal_states"], list) and info["enable_deterministic_inference"] is True
    for key in (
        "model_path",
        "served_model_name",
        "tokenizer_path",
        "max_running_requests",
        "skip_tokenizer_init",
    ):
        assert key in info


def test_server_info_survives_concurrent_calls(server: ReferenceProcess) -> None:
    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(lambda _: get(server.url, "/server_info"), range(32)))
    assert {reply.status for reply in replies} == {200}


def test_server_info_reports_a_context_length_passed_on_the_command_line(launch: Launch) -> None:
    server = launch("--context-length", "1000", "--max-running-requests", "7")
    info = get(server.url, "/server_info").json()
    assert (info["context_length"], info["max_req_input_len"], info["max_running_requests"]) == (1000, 994, 7)
    assert get(server.url, "/v1/models").json()["data"][0]["max_model_len"] == 1000


def test_preferred_sampling_params_fill_in_what_a_request_leaves_out(launch: Launch) -> None:
    server = launch("--preferred-sampling-params", '{"ignore_eos": true, "max_new_tokens": 40}')
    assert get(server.url, "/model_info").json()["preferred_sampling_params"] == {
        "ignore_eos": True,
        "max_new_tokens": 40,
    }
    left_out = request(
        server.url, "/generate", {"input_ids": PROMPT, "sampling_params": {"temperature": 0}}
    ).json()
    assert left_out["meta_info"]["finish_reason"] == {"type": "length", "length": 40}  # ignore_eos: no stop
    given = {"temperature": 0, "max_new_tokens": 5}
    assert (
        len(
            request(server.url, "/generate", {"input_ids": PROMPT, "sampling_params": given}).json()[
                "output_ids"
            ]
        )
        == 5
    )


def test_a_speculative_servers_reserved_slots_count_with_the_prompt(launch: Launch) -> None:
    server = launch(
        "--context-length", "100", "--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3",
        "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4",
    )  # fmt: skip
    state = get(server.url, "/server_info").json()["internal_states"][0]
    assert (state["speculative_algorithm"], state["speculative_num_draft_tokens"]) == ("EAGLE3", 4)
    fits = {"input_ids": [5] * 90, "sampling_params": {"max_new_tokens": 6}}
    assert request(server.url, "/generate", fits).status == 200
    over = {"input_ids": [5] * 90, "sampling_params": {"max_new_tokens": 7}}
    reply = request(server.url, "/generate", over)
    assert (
        reply.status == 400
        and "You requested a total of 101 tokens: 94 tokens from the input" in reply.body.decode()
    )


def test_v1_models_reports_the_effective_context_length(
    server: ReferenceProcess, contract: ModuleType
) -> None:
    models = get(server.url, "/v1/models").json()
    assert models["object"] == "list" and len(models["data"]) == 1
    contract.ModelCard.from_json_value(models["data"][0])
    assert models["data"][0]["max_model_len"] == 4096


@pytest.mark.parametrize("prefix", ["", "/v1"])
def test_tokenize_returns_tokens_and_count(server: ReferenceProcess, prefix: str) -> None:
    reply = request(server.url, f"{prefix}/tokenize", {"prompt": "Hello there"}).json()
    ids = TOKENIZER.encode("Hello there").ids
    assert reply == {"tokens": ids, "count": len(ids), "max_model_len": 4096}
    batch = request(
        server.url, f"{prefix}/tokenize", {"prompt": ["a b", "c"], "add_special_tokens": False}
    ).json()
    assert batch["count"] == [len(ids) for ids in batch["tokens"]]


@pytest.mark.parametrize("prefix", ["", "/v1"])
def test_detokenize_round_trips(server: ReferenceProcess, contract: ModuleType, prefix: str) -> None:
    ids = TOKENIZER.encode("A river flows to the sea.").ids
    reply = request(server.url, f"{prefix}/detokenize", {"tokens": ids}).json()
    assert contract.DetokenizeResponse.from_json_value(reply).text == "A river flows to the sea."
    assert request(server.url, "/detokenize", {"tokens": [ids, ids[:2]]}).json() == {
        "text": ["A river flows to the sea.", "A river"]
    }
    assert request(server.url, "/detokenize", {"tokens": [EOS], "skip_special_tokens": False}).json() == {
        "text": "<|im_end|>"
    }


@pytest.mark.parametrize(
    ("tokens", "kind"), [(["a"], "Bad Request"), ([-1], "DecodeError"), ("x", "Bad Request")]
)
def test_detokenize_refuses_bad_tokens_with_400(server: ReferenceProcess, tokens: Any, kind: str) -> None:
    reply = request(server.url, "/detokenize", {"tokens": tokens})
    assert reply.status == 400 and reply.json()["object"] == "error" and reply.json()["type"] == kind


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_flush_cache_answers_in_plain_text(server: ReferenceProcess, method: str) -> None:
    reply = request(server.url, "/flush_cache", method=method)
    assert (
        reply.status == 200
        and reply.content_type == "text/plain"
        and reply.body.startswith(b"Cache flushed.")
    )


def test_v1_loads_reports_running_and_waiting_requests(server: ReferenceProcess) -> None:
    loads = get(server.url, "/v1/loads").json()
    assert loads["version"] == "0.5.23" and loads["loads"][0]["num_running_reqs"] == 0


def test_unknown_paths_and_methods_get_fastapis_bodies(server: ReferenceProcess) -> None:
    assert (get(server.url, "/version").status, get(server.url, "/version").json()) == (
        404,
        {"detail": "Not Found"},
    )
    assert get(server.url, "/generate").status == 405


def served_routes() -> list[tuple[str, str]]:
    """Every ``(method, path)`` the server's application routes, read from the application itself."""
    state = ServerState(ServerConfig(), Model(None, tokenizer=False, context_length=None))
    try:
        routes = build_app(state).router.routes()
        return sorted({(route.method, route.resource.canonical) for route in routes if route.resource})
    finally:
        state.close()


OPEN_ROUTES = ("/health", "/health_generate")
"""Probes SGLang leaves open whatever ``--api-key`` says (``srt/utils/auth.py``, ``decide_request_auth``)."""
UNAUTHORIZED = (401, {"error": "Unauthorized"})
KEY = {"Authorization": "Bearer sekret"}


def test_an_api_key_guards_every_route_but_the_health_probes(launch: Launch, contract: ModuleType) -> None:
    server = launch("--api-key", "sekret")
    routes = served_routes()
    assert ("POST", "/generate") in routes and ("GET", "/health") in routes and len(routes) > 10
    for method, path in routes:
        without = request(server.url, path, method=method)
        wrong = request(server.url, path, method=method, headers={"Authorization": "Bearer nope"})
        if path in OPEN_ROUTES:
            assert (without.status, wrong.status) == (200, 200), (method, path)
        else:
            refusals = [(without.status, without.json()), (wrong.status, wrong.json())]
            assert refusals == [UNAUTHORIZED] * 2, (method, path)
        assert request(server.url, path, method=method, headers=KEY).status != 401, (method, path)
    sglang = Conformance(server.url, contract)
    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2}}
    assert sglang.generate(body).status == 401
    sglang.ok(body, headers=KEY)
    info = get(server.url, "/server_info", headers=KEY).json()
    assert info["api_key"] == "***" and "sekret" not in info["launch_command"]


def test_reference_stats_count_generations_and_reset(launch: Launch, contract: ModuleType) -> None:
    server = launch()
    body = {"input_ids": [PROMPT, PROMPT], "sampling_params": {"max_new_tokens": 5, "ignore_eos": True}}
    Conformance(server.url, contract).ok(body)
    stats = get(server.url, "/reference/stats").json()
    assert (stats["generate_requests"], stats["completed_requests"], stats["completed_tokens"]) == (1, 2, 10)
    assert stats["slots"] is None and stats["utilization"] is None
    reset = request(server.url, "/reference/stats/reset").json()
    assert reset["completed_requests"] == 0 and reset["wall_seconds"] < stats["wall_seconds"] + 1


# --- --skip-tokenizer-init (§7) ----------------------------------------------------------------


@pytest.fixture(scope="module")
def ids_only(contract: ModuleType) -> Iterator[Conformance]:
    with launch_reference(args=["--skip-tokenizer-init"]) as process:
        yield Conformance(process.url, contract)


def test_without_a_tokenizer_responses_have_no_text(ids_only: Conformance) -> None:
    result = ids_only.ok({"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 4}})
    assert list(result) == ["output_ids", "meta_info"]
    events = ids_only.ok({"input_ids": PROMPT, "stream": True, "sampling_params": {"max_new_tokens": 4}})
    assert all("text" not in event for event in events[:-1])


def test_without_a_tokenizer_stop_token_ids_and_length_behave_as_in_sglangs_tests(
    ids_only: Conformance,
) -> None:
    sampling = {"temperature": 0, "stop_token_ids": [EOS], "max_new_tokens": 1024}
    stopped = ids_only.ok({"input_ids": PROMPT, "sampling_params": sampling})
    assert stopped["meta_info"]["finish_reason"]["matched"] == EOS == stopped["output_ids"][-1]
    capped = ids_only.ok({"input_ids": PROMPT, "sampling_params": {**sampling, "max_new_tokens": 8}})
    assert len(capped["output_ids"]) == capped["meta_info"]["completion_tokens"] == 8
    assert capped["meta_info"]["prompt_tokens"] == len(PROMPT)


def test_without_a_tokenizer_n3_returns_three(ids_only: Conformance) -> None:
    assert len(ids_only.ok({"input_ids": PROMPT, "sampling_params": {"n": 3, "max_new_tokens": 3}})) == 3


def test_without_a_tokenizer_the_stream_ends_with_the_non_stream_ids(ids_only: Conformance) -> None:
    body = {"input_ids": PROMPT, "sampling_params": {"temperature": 0, "max_new_tokens": 64}}
    events = ids_only.ok({**body, "stream": True})
    assert events[-2]["output_ids"] == ids_only.ok(body)["output_ids"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"text": "hi"}, "The engine initialized with skip_tokenizer_init=True cannot accept text prompts."),
        (
            {"input_ids": PROMPT, "sampling_params": {"stop": "x"}},
            "stop=['x'] is unavailable when skip_tokenizer_init=True",
        ),
        ({"input_ids": PROMPT, "sampling_params": {"min_new_tokens": 3}}, "min_new_tokens=3 is unavailable"),
    ],
)
def test_without_a_tokenizer_text_features_are_refused(
    ids_only: Conformance, body: dict[str, Any], message: str
) -> None:
    reply = ids_only.generate(body)
    assert reply.status == 400 and reply.json()["error"]["message"].startswith(message)


def test_without_a_tokenizer_tokenize_fails_with_500(ids_only: Conformance) -> None:
    assert request(ids_only.url, "/tokenize", {"prompt": "hi"}).status == 500
