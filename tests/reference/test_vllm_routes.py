"""The reference server's vLLM mode (``--protocol vllm``), route by route: the shapes a vLLM
client relies on, as ``docs/vllm-protocol.md`` records them from the real vLLM (real aiohttp
server on 127.0.0.1, no mocks). vLLM's pydantic models check the same bodies in
``tests/real_vllm/test_reference_contract.py``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from eagle3_raw.launching.reference import ReferenceProcess, launch_reference
from eagle3_raw.reference.model_files import load_tokenizer
from tests.reference.wire import Reply, get, request

FLAGS = ("--protocol", "vllm", "--enable-scale-out", "--reasoning-parser", "qwen3",
         "--tool-call-parser", "hermes", "--enable-auto-tool-choice", "--max-model-len", "512")  # fmt: skip
MAX_MODEL_LEN = 512
EOS, TOOL_CALL = 6139, 6142  # <|im_end|> and <tool_call> of the packaged tokenizer
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}  # fmt: skip
CONVERSATIONS: dict[str, dict[str, Any]] = {
    "plain": {"messages": [{"role": "user", "content": "What is the weather in Paris?"}]},
    "system_turns": {"messages": [
        {"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}]},
    "tools": {"tools": [WEATHER], "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "Sunny"}]},
    "no_thinking": {"messages": [{"role": "user", "content": "Hi"}],
                    "chat_template_kwargs": {"enable_thinking": False}},
}  # fmt: skip


@pytest.fixture(scope="module")
def vllm() -> Iterator[ReferenceProcess]:
    """One vLLM-mode server for the module: scale-out routes, Qwen3's parsers, dev mode."""
    with launch_reference(args=FLAGS, env={"VLLM_SERVER_DEV_MODE": "1"}) as server:
        yield server


def post(server: ReferenceProcess, path: str, body: Any) -> Reply:
    return request(server.url, path, body)


def prompt_ids(server: ReferenceProcess, case: str = "plain") -> list[int]:
    ids: list[int] = post(server, "/tokenize", CONVERSATIONS[case]).json()["tokens"]
    return ids


def complete(server: ReferenceProcess, ids: list[int], **sampling: Any) -> Reply:
    body = {"prompt": ids, "max_tokens": 64, "temperature": 0, "return_token_ids": True, **sampling}
    return post(server, "/v1/completions", body)


def generate(server: ReferenceProcess, ids: list[int], **sampling: Any) -> Reply:
    body = {"token_ids": ids, "sampling_params": {"max_tokens": 64, "temperature": 0, **sampling}}
    return post(server, "/inference/v1/generate", body)


def test_health_version_and_models(vllm: ReferenceProcess) -> None:
    health = get(vllm.url, "/health")
    assert health.status == 200 and health.body == b""
    assert get(vllm.url, "/version").json() == {"version": "0.32.0"}
    models = get(vllm.url, "/v1/models").json()
    card = models["data"][0]
    assert models["object"] == "list" and card["object"] == "model" and card["owned_by"] == "vllm"
    assert card["max_model_len"] == MAX_MODEL_LEN and card["parent"] is None
    assert card["id"] == card["root"] and isinstance(card["created"], int) and card["permission"]


def test_sglang_routes_are_not_found(vllm: ReferenceProcess) -> None:
    for method, path in (("POST", "/generate"), ("GET", "/model_info"), ("POST", "/separate_reasoning"),
                         ("POST", "/parse_function_call"), ("POST", "/abort_request")):  # fmt: skip
        reply = request(vllm.url, path, {} if method == "POST" else None, method=method)
        assert (reply.status, reply.json()) == (404, {"detail": "Not Found"}), path


def test_completions_return_the_prompt_and_output_ids(vllm: ReferenceProcess) -> None:
    ids = prompt_ids(vllm)
    reply = complete(vllm, ids, request_id="r1", bogus_key=1)  # an unknown key is ignored
    assert reply.status == 200, reply.body
    body = reply.json()
    choice = body["choices"][0]
    assert body["id"] == "cmpl-r1" and body["object"] == "text_completion"
    assert body["system_fingerprint"].startswith("vllm-0.32.0")
    assert choice["prompt_token_ids"] == ids and choice["token_ids"]
    assert choice["finish_reason"] in ("stop", "length") and choice["logprobs"] is None
    usage = body["usage"]
    assert usage["prompt_tokens"] == len(ids) and usage["completion_tokens"] == len(choice["token_ids"])
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    text = post(vllm, "/detokenize", {"tokens": choice["token_ids"]}).json()["prompt"]
    assert choice["text"] == text.replace("<|im_end|>", "")  # the text skips the special ids
    nested = complete(vllm, [ids], request_id="r2").json()["choices"][0]  # a list of one list
    assert nested["token_ids"] == choice["token_ids"]


def test_without_return_token_ids_no_ids_come_back(vllm: ReferenceProcess) -> None:
    choice = complete(vllm, prompt_ids(vllm), return_token_ids=False).json()["choices"][0]
    assert choice["token_ids"] is None and choice["prompt_token_ids"] is None and choice["text"]


def test_generate_gives_the_same_ids_as_completions(vllm: ReferenceProcess) -> None:
    ids = prompt_ids(vllm, "tools")
    reply = post(vllm, "/inference/v1/generate", {"token_ids": ids, "request_id": "g1", "sampling_params": {
        "max_tokens": 64, "temperature": 0, "bogus_key": True}})  # fmt: skip
    assert reply.status == 200, reply.body
    body = reply.json()
    choice = body["choices"][0]
    assert body["request_id"] == "generate-tokens-g1" and body["output_mode"] == "tokens"
    assert body["prompt_token_ids"] is None  # never echoed without return_token_ids
    assert choice["token_ids"] == complete(vllm, ids).json()["choices"][0]["token_ids"]
    assert choice["weight_versions"] == [{"version": "default", "start": 0, "end": len(choice["token_ids"])}]
    assert body["usage"]["completion_tokens"] == len(choice["token_ids"])


def test_a_stop_token_is_kept_as_the_last_id(vllm: ReferenceProcess) -> None:
    ids = prompt_ids(vllm)
    free = complete(vllm, ids, max_tokens=40, ignore_eos=True).json()["choices"][0]["token_ids"]
    stop = free[5]
    for reply in (complete(vllm, ids, stop_token_ids=[stop]), generate(vllm, ids, stop_token_ids=[stop])):
        choice = reply.json()["choices"][0]
        assert choice["finish_reason"] == "stop" and choice["stop_reason"] == stop
        assert choice["token_ids"] == free[: free.index(stop) + 1]


def test_the_eos_id_stops_with_a_null_stop_reason_unless_ignore_eos(vllm: ReferenceProcess) -> None:
    ids = prompt_ids(vllm)
    forced = complete(vllm, ids, logit_bias={str(EOS): 100}).json()["choices"][0]
    assert (forced["finish_reason"], forced["stop_reason"], forced["token_ids"]) == ("stop", None, [EOS])
    ignored = complete(vllm, ids, logit_bias={str(EOS): 100}, ignore_eos=True, max_tokens=3).json()
    assert ignored["choices"][0]["finish_reason"] == "length"
    assert ignored["choices"][0]["token_ids"] == [EOS] * 3


def test_max_tokens_past_the_context_is_cut_to_fit(vllm: ReferenceProcess) -> None:
    ids = [9] * (MAX_MODEL_LEN - 4)
    for reply in (
        complete(vllm, ids, max_tokens=8, ignore_eos=True),
        generate(vllm, ids, max_tokens=8, ignore_eos=True),
    ):
        choice = reply.json()["choices"][0]
        assert (len(choice["token_ids"]), choice["finish_reason"]) == (4, "length")


def test_a_prompt_that_fills_or_passes_the_context_is_a_400(vllm: ReferenceProcess) -> None:
    full = complete(vllm, [9] * MAX_MODEL_LEN, max_tokens=1).json()["error"]
    assert full["param"] == "max_tokens" and full["code"] == 400 and full["type"] == "BadRequestError"
    assert full["message"] == "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)"
    over = complete(vllm, [9] * (MAX_MODEL_LEN + 1), max_tokens=1).json()["error"]
    assert over["param"] == "input_tokens"
    assert over["message"].startswith(
        f"This model's maximum context length is {MAX_MODEL_LEN} tokens. However, your prompt contains "
        f"at least {MAX_MODEL_LEN + 1} input tokens"
    )
    tokens = generate(vllm, [9] * (MAX_MODEL_LEN + 1), max_tokens=1)
    assert tokens.status == 400 and tokens.json()["error"]["param"] is None
    assert tokens.json()["error"]["message"].startswith(
        f"The decoder prompt (length {MAX_MODEL_LEN + 1}) is longer than the maximum model length "
        f"of {MAX_MODEL_LEN}."
    )


def test_refusals_name_what_vllm_names(vllm: ReferenceProcess) -> None:
    ids = prompt_ids(vllm)
    wrong = complete(vllm, ids, model="other")
    assert wrong.status == 404 and wrong.json()["error"]["message"] == "The model `other` does not exist."
    served = get(vllm.url, "/v1/models").json()["data"][0]["id"]
    assert complete(vllm, ids, model=served).status == 200
    hot = complete(vllm, ids, temperature=-1).json()["error"]
    assert hot["param"] == "temperature" and hot["message"].startswith("temperature must be non-negative")
    assert complete(vllm, [10**6]).json()["error"]["message"] == "Token id 1000000 is out of vocabulary"
    assert post(vllm, "/inference/v1/generate", {"token_ids": ids}).status == 400  # sampling_params required


@pytest.mark.parametrize("case", list(CONVERSATIONS))
def test_tokenize_with_messages_equals_apply_chat_template(vllm: ReferenceProcess, case: str) -> None:
    chat = CONVERSATIONS[case]
    body = post(vllm, "/tokenize", chat).json()
    assert body["count"] == len(body["tokens"]) and body["max_model_len"] == MAX_MODEL_LEN
    assert body["token_strs"] is None
    expected = load_tokenizer().apply_chat_template(
        chat["messages"], tools=chat.get("tools"), add_generation_prompt=True, tokenize=True,
        return_dict=False, **chat.get("chat_template_kwargs", {}),
    )  # fmt: skip
    assert body["tokens"] == list(expected)
    render = post(vllm, "/v1/chat/completions/render", chat).json()
    assert render["token_ids"] == body["tokens"] and render["request_id"].startswith("chatcmpl-")
    assert render["sampling_params"]["max_tokens"] == MAX_MODEL_LEN - len(body["tokens"])


def test_tokenize_a_prompt_and_detokenize(vllm: ReferenceProcess) -> None:
    plain = post(vllm, "/tokenize", {"prompt": "Hello world", "add_special_tokens": False}).json()
    assert plain["count"] == len(plain["tokens"]) > 0
    assert post(vllm, "/detokenize", {"tokens": plain["tokens"]}).json() == {"prompt": "Hello world"}


def test_derender_splits_reasoning_content_and_tool_calls(vllm: ReferenceProcess) -> None:
    text = ('<think>\nLet me look.\n</think>\n\nChecking.\n<tool_call>\n'
            '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>')  # fmt: skip
    response = generate(vllm, prompt_ids(vllm), max_tokens=1).json()
    ids = post(vllm, "/tokenize", {"prompt": text, "add_special_tokens": False}).json()["tokens"]
    response["choices"][0].update(token_ids=ids, finish_reason="stop", stop_reason=None)
    chat = {"messages": CONVERSATIONS["plain"]["messages"], "tools": [WEATHER]}
    reply = post(vllm, "/v1/chat/completions/derender", {"generate_response": response, "chat_request": chat})
    assert reply.status == 200, reply.body
    body = reply.json()
    message = body["choices"][0]["message"]
    assert body["object"] == "chat.completion" and body["id"] == response["request_id"]
    assert message["reasoning"] == "\nLet me look.\n" and message["content"] == "\n\nChecking.\n"
    call = message["tool_calls"][0]
    assert call["type"] == "function" and call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert body["choices"][0]["finish_reason"] == "stop"  # the response's own, not tool_calls
    bare = post(vllm, "/v1/chat/completions/derender", {"generate_response": response})
    assert bare.status == 400 and bare.json()["error"]["message"].startswith("chat_request is required when")


def test_abort_requests_needs_request_ids(vllm: ReferenceProcess) -> None:
    assert post(vllm, "/inference/v1/abort_requests", {}).status == 400
    done = post(vllm, "/inference/v1/abort_requests", {"request_ids": ["generate-tokens-none"]})
    assert done.status == 200 and done.body == b""


def test_dev_mode_server_info_and_weight_info(vllm: ReferenceProcess) -> None:
    info = get(vllm.url, "/server_info?config_format=json").json()
    config = info["vllm_config"]
    assert config["model_config"]["max_model_len"] == MAX_MODEL_LEN
    assert config["model_config"]["served_model_name"] == get(vllm.url, "/v1/models").json()["data"][0]["id"]
    assert config["structured_outputs_config"]["reasoning_parser"] == "qwen3"
    assert config["parallel_config"] == {"tensor_parallel_size": 1, "data_parallel_size": 1}
    assert config["speculative_config"] is None and config["scheduler_config"]["max_num_seqs"] >= 1
    assert get(vllm.url, "/weight_info").json() == {"weight_version": "default"}
    reset = post(vllm, "/reset_prefix_cache", None)
    assert reset.status == 200 and reset.body == b""


def test_tokenize_continues_a_final_assistant_message(vllm: ReferenceProcess) -> None:
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello, I"}]
    body = {"messages": messages, "add_generation_prompt": False, "continue_final_message": True}
    expected = load_tokenizer().apply_chat_template(
        messages, add_generation_prompt=False, continue_final_message=True, tokenize=True, return_dict=False
    )
    assert post(vllm, "/tokenize", body).json()["tokens"] == list(expected)
    both = post(vllm, "/tokenize", {**body, "add_generation_prompt": True})
    assert both.status == 400 and "continue_final_message" in both.json()["error"]["message"]


def test_derender_splits_the_reference_models_own_tool_calls(vllm: ReferenceProcess) -> None:
    """A sampled output with a ``<tool_call>`` block derenders to a call of the offered tool."""
    chat = {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER]}
    ids = post(vllm, "/tokenize", chat).json()["tokens"]
    for seed in range(40):
        response = generate(vllm, ids, max_tokens=400, temperature=1.0, seed=seed).json()
        if TOOL_CALL in response["choices"][0]["token_ids"]:
            break
    else:
        pytest.fail("no sampled output called a tool")
    body = {"generate_response": response, "chat_request": chat}
    message = post(vllm, "/v1/chat/completions/derender", body).json()["choices"][0]["message"]
    assert message["tool_calls"] and {c["function"]["name"] for c in message["tool_calls"]} == {"get_weather"}
    assert all("city" in json.loads(c["function"]["arguments"]) for c in message["tool_calls"])
    assert "<tool_call>" not in (message["content"] or "") and "<think>" not in (message["content"] or "")
