"""On-policy rollouts on the real SGLang: the reference model's answers (a reasoning block, a tool
call) come out of the real ``/generate``, the real ``/separate_reasoning`` and
``/parse_function_call`` split them, and the next turn's history is that split, rendered by the
real chat path. For the other parser families the bundled recipes name (which the reference
server answers with 501), the history a rollout builds is checked against the real parsers on
texts in each family's own format.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

import eagle3_raw
from eagle3_raw.reference.model_files import load_tokenizer
from eagle3_raw.run.rollout import History, Message, tool_call_id
from eagle3_raw.sglang import client as sglang
from eagle3_raw.source.prompts import Conversation
from tests.helpers import WEATHER, write_jsonl, write_recipe
from tests.real_sglang.server import RealSGLang, post, tokenize_chat

CITIES = ("Oslo", "Paris", "Rome", "Lima", "Cairo", "Tokyo", "Quito", "Bern", "Accra", "Hanoi")
GREEDY = {"max_new_tokens": 600, "temperature": 0.0}
CITY = {"city": "Paris"}


def _split(url: str, text: str) -> tuple[str, str, list[dict[str, Any]]]:
    """(reasoning, content, calls) of ``text`` as the real server's own parsers split it."""
    reasoning = post(url, "/separate_reasoning", {"text": text, "reasoning_parser": "qwen3"})
    parsed = post(url, "/parse_function_call", {
        "text": reasoning["text"], "tool_call_parser": "qwen25", "tools": [WEATHER]})  # fmt: skip
    return reasoning["reasoning_text"] or "", parsed["normal_text"], parsed["calls"]


def _first_turn_with_reasoning_and_a_call(url: str) -> tuple[str, dict[str, Any]]:
    """A user question whose first answer, on the real server, has a reasoning block and a tool call."""
    for city in CITIES:
        question = f"What is the weather in {city}?"
        prompt = tokenize_chat(url, [{"role": "user", "content": question}], tools=[WEATHER])
        answer = post(url, "/generate", {"input_ids": prompt, "sampling_params": GREEDY})
        reasoning, _, calls = _split(url, answer["text"])
        if reasoning.strip() and calls and answer["meta_info"]["finish_reason"]["type"] == "stop":
            return question, calls[0]
    raise AssertionError(f"none of {CITIES} gave a reasoning block and a tool call")


def test_a_rollout_with_a_tool_loop_runs_through_the_real_parsers(
    tmp_path: Path, real_server: RealSGLang, real_model: Path
) -> None:
    url = real_server.url
    question, call = _first_turn_with_reasoning_and_a_call(url)
    arguments = json.loads(call["parameters"])
    source = {"id": "loop", "tools": [WEATHER], "messages": [
        {"role": "user", "content": question},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "src-1", "type": "function", "function": {
            "name": call["name"], "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "src-1", "content": '{"temp_c": 7, "sky": "clear"}'},
        {"role": "user", "content": "Thanks! Should I take a coat?"},
    ]}  # fmt: skip
    write_jsonl(tmp_path / "prompts.jsonl", [source])
    recipe = write_recipe(
        tmp_path, endpoints=[url], turns="rollout", model={"tokenizer": str(real_model)}, sampling=GREEDY
    )
    options = {"cache_dir": str(tmp_path / "c"), "journal_dir": tmp_path / "j", "progress": "none"}
    rows = eagle3_raw.load(str(recipe), **options)

    assert rows["kind"] == ["rollout", "rollout"] and rows["turn"] == [1, 4]  # the template drops reasoning
    first, second = rows[0], rows[1]
    generated = load_tokenizer().decode(first["input_ids"][first["prompt_len"] :], skip_special_tokens=False)
    assert "<think>" in generated and "</think>" in generated and "<tool_call>" in generated
    # the history of turn 4: turn 1 as the real parsers split the real server's text of it
    prompt, output = first["input_ids"][: first["prompt_len"]], first["input_ids"][first["prompt_len"] :]
    answer = post(url, "/generate", {"input_ids": prompt, "sampling_params": GREEDY})
    assert answer["output_ids"] == output
    reasoning, content, calls = _split(url, answer["text"])
    [made] = calls
    call_id = tool_call_id("qwen", made["name"], 0, "loop:1:0", 0)
    function = {"name": made["name"], "arguments": made["parameters"]}
    history = [
        source["messages"][0],
        {"role": "assistant", "content": content, "reasoning_content": reasoning,
         "tool_calls": [{"id": call_id, "type": "function", "function": function}]},
        {**source["messages"][2], "tool_call_id": call_id},
        source["messages"][3],
    ]  # fmt: skip
    prompt = tokenize_chat(url, history, tools=[WEATHER])
    assert second["input_ids"][: second["prompt_len"]] == prompt
    again = post(url, "/generate", {"input_ids": prompt, "sampling_params": GREEDY})
    assert second["input_ids"][second["prompt_len"] :] == again["output_ids"]


def _ds(name: str) -> str:
    """A DeepSeek special token (full-width bars, words joined by U+2581) named by its words."""
    return "<\uff5c" + name.replace(" ", "\u2581") + "\uff5c>"


# (family, reasoning parser, tool-call parser, text in the family's format, the assistant message a
# chat client gets back from SGLang's parsers: reasoning_content, content, calls (name, arguments))
FAMILIES = [
    ("kimi_k2", "kimi_k2", "kimi_k2",
     "<think>They ask about Paris.</think>Let me check."
     "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
     '{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>',
     "They ask about Paris.", "Let me check.", [("get_weather", {"city": "Paris"})]),
    ("gpt-oss", "gpt-oss", "gpt-oss",
     "<|channel|>analysis<|message|>They ask about Paris.<|end|><|start|>assistant<|channel|>commentary "
     'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>',
     "They ask about Paris.", "", [("get_weather", {"city": "Paris"})]),
    ("deepseekv3", None, "deepseekv3",
     f"Let me check.{_ds('tool calls begin')}{_ds('tool call begin')}function{_ds('tool sep')}get_weather"
     f'\n```json\n{{"city": "Paris"}}\n```{_ds("tool call end")}{_ds("tool calls end")}',
     "", "Let me check.", [("get_weather", {"city": "Paris"})]),
    ("llama3", None, "llama3",
     '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}',
     "", "", [("get_weather", {"city": "Paris"})]),
]  # fmt: skip


async def _message(url: str, text: str, reasoning_parser: str | None, tool_parser: str) -> Message:
    """A turn's message as a rollout makes it (``RolloutRunner._parsed``), from the real server."""
    async with sglang.new_session(connect_timeout=10, api_key=None) as session:
        reasoning = ""
        if reasoning_parser:
            reasoning, text = await sglang.separate_reasoning(session, url, text, reasoning_parser, 60)
        content, calls = await sglang.parse_function_call(session, url, text, [WEATHER], tool_parser, 60)
    return Message(content, reasoning, tuple(calls))


@pytest.mark.parametrize(
    ("family", "reasoning_parser", "tool_parser", "text", "reasoning", "content", "calls"),
    FAMILIES, ids=[f[0] for f in FAMILIES],
)  # fmt: skip
def test_a_rollout_history_in_each_parser_family_is_what_the_real_parsers_make_of_its_text(
    real_server: RealSGLang, family: str, reasoning_parser: str | None, tool_parser: str, text: str,
    reasoning: str, content: str, calls: list[tuple[str, dict[str, Any]]],
) -> None:  # fmt: skip
    message = asyncio.run(_message(real_server.url, text, reasoning_parser, tool_parser))
    messages = (
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "s1", "type": "function", "function": {"name": "get_weather", "arguments": CITY}}]},
        {"role": "tool", "tool_call_id": "s1", "content": "18C"},
        {"role": "user", "content": "Thanks"},
    )  # fmt: skip
    history = History(Conversation(0, "row", messages, (WEATHER,)), [1, 4], tool_parser, 0)
    history.before(1)
    assert history.add(0, message) == ""  # the same call as the source's: the loop goes on
    sent = history.before(4)
    assistant, tool = sent[1], sent[2]
    assert assistant.get("reasoning_content", "") == reasoning and assistant["content"].strip() == content
    got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in assistant["tool_calls"]]
    assert got == calls
    expected_id = tool_call_id(tool_parser, "get_weather", 0, "row:1:0", 0)
    assert assistant["tool_calls"][0]["id"] == expected_id == tool["tool_call_id"]
    if family == "kimi_k2":
        assert expected_id == "functions.get_weather:0"  # the form Kimi's template prints
