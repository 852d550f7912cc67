"""The vLLM engine's parts that need no server: the checks a completion passes, the sampling
parameters as vLLM takes them, the identity read off its routes, its chat path against
transformers on the real Qwen3 tokenizer, and what a recipe may ask of a vLLM server.

What the real vLLM answers is asserted in ``tests/real_vllm`` (``docs/vllm-protocol.md``); the
answers below are shaped like those, then broken one field at a time.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from eagle3_raw.errors import GenerationAborted, InvalidResponse, RecipeError, RequestRejected, ServerMismatch
from eagle3_raw.identity import Target, request_digest
from eagle3_raw.recipe import load_recipe
from eagle3_raw.vllm import chatpath
from eagle3_raw.vllm.client import identity_from
from eagle3_raw.vllm.responses import check_completion
from eagle3_raw.vllm.sampling import vllm_params
from tests.support import tokenizers

PROMPT = [5, 6, 7]
EOS = frozenset({99})
URL = "http://127.0.0.1:1"


def _answer(
    output_ids: list[Any], finish: str = "length", stop_reason: Any = None, **choice: Any
) -> dict[str, Any]:
    body = {"index": 0, "text": "x", "finish_reason": finish, "stop_reason": stop_reason,
            "token_ids": output_ids, "prompt_token_ids": list(PROMPT), **choice}  # fmt: skip
    usage = {"prompt_tokens": len(PROMPT), "completion_tokens": len(output_ids), "total_tokens": 0}
    return {"id": "cmpl-r", "object": "text_completion", "choices": [body], "usage": usage}


def _check(answer: dict[str, Any], max_tokens: int = 4, stops: frozenset[int] | None = EOS) -> Any:
    return check_completion(answer, PROMPT, 100, URL, max_tokens, eos_ids=EOS, stop_ids=stops)


def test_a_well_formed_completion_is_its_ids_and_counts() -> None:
    generation = _check(_answer([1, 2, 3, 4]))
    assert generation.output_ids == [1, 2, 3, 4] and generation.finish_reason == "length"
    assert generation.meta["prompt_tokens"] == 3 and generation.meta["completion_tokens"] == 4
    stopped = _check(_answer([1, 99], finish="stop"))  # vLLM's EOS stop: stop_reason null, the EOS last
    assert stopped.output_ids == [1, 99]
    on_id = _check(_answer([1, 42], finish="stop", stop_reason=42), stops=EOS | {42})
    assert on_id.finish_reason == "stop"


@pytest.mark.parametrize(
    ("change", "error", "words"),
    [
        (lambda a: a["choices"][0].update(finish_reason="abort"), GenerationAborted, "aborted"),
        (lambda a: a["choices"][0].update(finish_reason="tool_calls"), InvalidResponse, "finish_reason"),
        (lambda a: a["choices"][0].update(prompt_token_ids=None), InvalidResponse, "return_token_ids"),
        (lambda a: a["choices"][0].update(prompt_token_ids=[5, 6]), RequestRejected, "truncate"),
        (lambda a: a["choices"][0].update(token_ids=[1, 2, 3, 400]), InvalidResponse, "vocabulary"),
        (lambda a: a["choices"][0].update(token_ids=[1, True, 3, 4]), InvalidResponse, "boolean"),
        (lambda a: a["usage"].update(completion_tokens=3), InvalidResponse, "completion_tokens"),
        (lambda a: a["usage"].update(prompt_tokens=2), RequestRejected, "prompt tokens"),
        (lambda a: a.update(choices=[]), InvalidResponse, "exactly one choice"),
        (lambda a: a.pop("usage"), InvalidResponse, "no usage"),
        (lambda a: a["choices"][0].update(text=7), InvalidResponse, "text"),
    ],
    ids=["abort", "finish", "no-prompt-ids", "prompt-changed", "vocab", "bool", "count", "prompt-count",
         "choices", "usage", "text"],
)  # fmt: skip
def test_a_broken_completion_is_refused_naming_what_is_wrong(change: Any, error: type, words: str) -> None:
    answer = _answer([1, 2, 3, 4])
    change(answer)
    with pytest.raises(error, match=words):
        _check(answer)


def test_stops_must_end_the_output_where_vllm_says() -> None:
    with pytest.raises(InvalidResponse, match="last output id"):
        _check(_answer([1, 2], finish="stop", stop_reason=42), stops=EOS | {42})
    with pytest.raises(InvalidResponse, match="EOS ids"):
        _check(_answer([1, 2], finish="stop"))  # an EOS stop that does not end on an EOS id
    with pytest.raises(InvalidResponse, match="position 1"):
        _check(_answer([1, 99, 3, 4]))  # an EOS before the end: vLLM stops at the first
    assert _check(_answer([1, 99, 3, 4]), stops=None).output_ids == [1, 99, 3, 4]  # ignore_eos


def test_a_length_stop_short_of_max_tokens_is_a_context_vllm_cut_silently() -> None:
    with pytest.raises(InvalidResponse, match="clips max_tokens"):
        _check(_answer([1, 2]), max_tokens=4)
    with pytest.raises(InvalidResponse, match="for max_tokens=4"):
        _check(_answer([1, 2, 3, 4, 5]), max_tokens=4)


def test_the_recipes_sampling_reaches_vllm_in_its_own_names_with_every_default_written() -> None:
    params = {"max_new_tokens": 32, "temperature": 0.6, "top_k": 1 << 30, "min_new_tokens": 2,
              "sampling_seed": 7, "stop_token_ids": [3], "no_stop_trim": True, "regex": "a+",
              "logit_bias": {5: 1.5}}  # fmt: skip
    sent = vllm_params(params)
    assert sent == {
        "temperature": 0.6, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "frequency_penalty": 0.0,
        "presence_penalty": 0.0, "repetition_penalty": 1.0, "min_tokens": 2, "max_tokens": 32, "seed": 7,
        "stop_token_ids": [3], "include_stop_str_in_output": True, "structured_outputs": {"regex": "a+"},
        "logit_bias": {"5": 1.5},
    }  # fmt: skip
    with pytest.raises(ValueError, match="stop_regex"):
        vllm_params({"stop_regex": "x"})


def _models(**model: Any) -> dict[str, Any]:
    listed = {"id": "tiny", "object": "model", "owned_by": "vllm", "root": "/m/tiny", "max_model_len": 1024}
    return {"object": "list", "data": [{**listed, **model}]}


DEV_CONFIG = {
    "vllm_config": {
        "model_config": {"model": "/m/tiny", "tokenizer": "/m/tok", "revision": None, "seed": 0,
                         "tokenizer_mode": "auto", "trust_remote_code": False, "dtype": "torch.bfloat16",
                         "hf_token": "hf_secret", "generation_config": "vllm"},
        "scheduler_config": {"max_num_seqs": 32},
        "parallel_config": {"tensor_parallel_size": 1, "data_parallel_size": 2},
        "structured_outputs_config": {"reasoning_parser": "qwen3"},
        "speculative_config": {"method": "eagle3", "model": "/m/draft", "num_speculative_tokens": 3},
    }
}  # fmt: skip


def test_the_identity_is_what_vllm_reports_with_the_dev_mode_config_when_it_has_one() -> None:
    plain = identity_from(URL, {"version": "0.32.0"}, _models(), {}, {})
    assert (plain.engine, plain.version, plain.model_path, plain.served_model_name) == (
        "vllm",
        "0.32.0",
        "/m/tiny",
        "tiny",
    )
    assert (
        plain.token_budget == 1024 and plain.input_limit == 1023
    )  # a prompt of max_model_len ids is refused
    assert plain.max_running_requests is None and plain.reasoning_parser is None and not plain.drafter
    assert plain.comparable()["engine"] == "vllm" and plain.label == "vLLM 0.32.0"
    dev = identity_from(URL, {"version": "0.32.0"}, _models(), DEV_CONFIG, {"weight_version": "step-9"})
    assert (
        dev.max_running_requests == 64 and dev.reasoning_parser == "qwen3" and dev.weight_version == "step-9"
    )
    assert dev.tokenizer_path == "/m/tok" and dev.server_info["generation_config"] == "vllm"
    assert dev.drafter == {"speculative_algorithm": "eagle3", "speculative_draft_model_path": "/m/draft",
                           "speculative_num_draft_tokens": 3}  # fmt: skip
    assert "hf_secret" not in repr(dev)
    with pytest.raises(ServerMismatch, match="owned by vllm"):
        identity_from(URL, {"version": "0.5.23"}, _models(owned_by="sglang"), {}, {})
    with pytest.raises(ServerMismatch, match="names no version"):
        identity_from(URL, {}, _models(), {}, {})


def test_the_engine_is_part_of_every_generations_identity_and_of_the_sets() -> None:
    model = {"model_path": "/m", "served_model_name": "m", "weight_version": "default", "version": "1"}
    sglang, vllm = Target(model, 1024, 1023), Target(model, 1024, 1023, engine="vllm")
    assert sglang.model_digest != vllm.model_digest and sglang.id != vllm.id
    assert request_digest(sglang, PROMPT, {"max_new_tokens": 4}) != request_digest(
        vllm, PROMPT, {"max_new_tokens": 4}
    )
    assert Target.from_dict(vllm.to_dict()) == vllm and "engine" not in sglang.to_dict()
    assert Target.from_dict(sglang.to_dict()) == sglang and "vLLM 1" in vllm.describe()


PARTS = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
CALL = {"id": "c1", "type": "function", "function": {"name": "w", "arguments": '{"city": "P"}'}}
QWEN3_ROWS: list[dict[str, Any]] = [
    {"messages": [{"role": "user", "content": "Hi"}]},
    {"messages": [{"role": "system", "content": PARTS}, {"role": "user", "content": "Hi", "name": "al"},
                  {"role": "assistant", "content": "Yo", "reasoning": "think"},
                  {"role": "user", "content": "Again"}]},
    {"messages": [{"role": "user", "content": "Weather?"},
                  {"role": "assistant", "content": None, "tool_calls": [CALL]},
                  {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "18C"}]}],
     "tools": [{"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}, "x": 1}]},
]  # fmt: skip


@pytest.mark.parametrize("row", QWEN3_ROWS, ids=["plain", "parts-names-reasoning", "tools"])
def test_vllms_chat_path_here_is_transformers_on_what_vllm_makes_of_the_request(row: dict[str, Any]) -> None:
    """The request as vLLM normalizes it (by hand here: text parts joined, arguments as objects,
    the reasoning under both keys, a tool as its pydantic model keeps it) through transformers'
    ``apply_chat_template``; the real server is compared in ``tests/real_vllm/test_rows.py``."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizers.tokenizer_folder("qwen3"))
    messages = copy.deepcopy(row["messages"])
    for message in messages:
        if isinstance(message.get("content"), list):
            message["content"] = "\n".join(part["text"] for part in message["content"])
        if message.get("content") is None:
            message["content"] = ""
        if "reasoning" in message:
            message["reasoning_content"] = message["reasoning"]
        for call in message.get("tool_calls", []):
            call["function"]["arguments"] = {"city": "P"}
    tools = [
        {"type": "function", "function": {"name": "w", "description": None, "parameters": {"type": "object"}}}
    ]
    expected = tokenizer.apply_chat_template(
        messages, tools=tools if row.get("tools") else None, add_generation_prompt=True, tokenize=True,
        return_dict=False,
    )  # fmt: skip
    assert chatpath.render_prompt_ids(tokenizer, row["messages"], row.get("tools")) == list(expected)


def test_a_tool_call_vllm_refuses_is_refused_here_too() -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizers.tokenizer_folder("qwen3"))
    call = {"id": "c1", "type": "function", "function": {"name": "w", "arguments": ["P"]}}
    messages = [{"role": "user", "content": "?"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
    with pytest.raises(chatpath.ChatRequestError, match="arguments as a string"):
        chatpath.render_prompt_ids(tokenizer, messages)
    call["function"]["arguments"] = {"city": "P"}  # eagle3_raw's own form: sent as its JSON string
    assert chatpath.wire_messages(messages)[1]["tool_calls"][0]["function"]["arguments"] == '{"city": "P"}'
    assert chatpath.render_prompt_ids(tokenizer, messages) == chatpath.render_prompt_ids(
        tokenizer, chatpath.wire_messages(messages)
    )
    del call["id"]
    with pytest.raises(chatpath.ChatRequestError, match="needs an id"):
        chatpath.render_prompt_ids(tokenizer, messages)


def _recipe(tmp_path: Path, **overrides: Any) -> Any:
    (tmp_path / "p.jsonl").write_text('{"id": "a", "prompt": "hi"}\n')
    raw: dict[str, Any] = {"name": "v", "prompts": {"source": "p.jsonl"}, "server": {"endpoints": ["http://h:1"]},
                           "sampling": {"max_new_tokens": 8}}  # fmt: skip
    for key, value in overrides.items():
        section, _, name = key.partition("__")
        raw.setdefault(section, {})[name] = value
    return _load(tmp_path, raw)


def _load(tmp_path: Path, raw: dict[str, Any]) -> Any:
    import yaml

    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_recipe(path)


def test_a_recipe_for_vllm_asks_nothing_vllm_cannot_do_and_names_the_field(tmp_path: Path) -> None:
    assert _recipe(tmp_path, server__engine="vllm").server.engine_name == "vllm"
    with pytest.raises(RecipeError, match=r"sampling\.stop_regex.*no stop on a regular expression"):
        _recipe(tmp_path, server__engine="vllm", sampling__stop_regex="x+")
    with pytest.raises(RecipeError, match=r"model\.reasoning_effort.*chat_template_kwargs"):
        _recipe(tmp_path, server__engine="vllm", model__reasoning_effort="high")
    with pytest.raises(RecipeError, match=r"server\.engine.*server\.launch: reference starts sglang"):
        _recipe(tmp_path, server__engine="vllm", server__launch="reference", server__endpoints=[])
    assert _recipe(tmp_path, sampling__stop_regex="x+").server.engine_name is None  # SGLang or asked later
