"""render.py with the real reference tokenizer and chat template (and edited copies of it), no mocks."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from eagle3_raw.errors import PromptFormatError, RecipeError
from eagle3_raw.recipe import Recipe, parse_recipe
from eagle3_raw.resources import reference_model_dir
from eagle3_raw.run.render import PromptTurn, Renderer, generation_points
from eagle3_raw.sglang.chatpath import render_prompt_ids
from eagle3_raw.source.prompts import Conversation

BOS = "<|endoftext|>"
BOS_ID = 6137

TOOLS = (
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    },
)
TOOL_CHAT = (
    {"role": "system", "content": "You help."},
    {"role": "user", "content": "Weather in Oslo?"},
    {
        "role": "assistant",
        "content": "",
        "reasoning_content": "I should call the weather tool.",
        "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
        ],
    },
    {"role": "tool", "content": '{"temp": 3}'},
    {"role": "assistant", "content": "It is 3 degrees."},
    {"role": "user", "content": "Thanks!"},
)


def make_recipe(base_dir: Path = Path("."), turns: str = "last", **model: Any) -> Recipe:
    raw = {
        "name": "t",
        "prompts": {"source": "unused.jsonl"},
        "model": model,
        "turns": turns,
        "server": {"launch": "reference"},
        "sampling": {"max_new_tokens": 8},
    }
    return parse_recipe(raw, base_dir=base_dir)


def conv(*messages: dict[str, Any], tools: Any = None, source_id: str = "c1") -> Conversation:
    return Conversation(index=4, source_id=source_id, messages=tuple(messages), tools=tools)


@pytest.fixture(scope="module")
def renderer() -> Renderer:
    return Renderer(make_recipe())


@pytest.fixture(scope="module")
def renderer_all() -> Renderer:
    return Renderer(make_recipe(turns="all"))


def text_of(renderer: Renderer, turn: PromptTurn) -> str:
    return str(renderer.tokenizer.decode(turn.prompt_ids))


# --- exact ids -------------------------------------------------------------------------------


def prompt_text(renderer: Renderer, messages: Any, tools: Any) -> str:
    """The chat path's prompt for ``messages`` (as SGLang's /tokenize would render it), decoded."""
    ids = render_prompt_ids(
        renderer.tokenizer, [dict(m) for m in messages], [dict(t) for t in tools or ()] or None
    )
    return str(renderer.tokenizer.decode(ids))


def test_prompt_ids_are_the_chat_paths_not_a_bare_apply_chat_template(renderer: Renderer) -> None:
    c = conv(*TOOL_CHAT, tools=TOOLS)
    [turn] = renderer.render(c)
    tokenizer = renderer.tokenizer
    messages, tools = [dict(m) for m in c.messages], [dict(t) for t in TOOLS]
    assert turn == PromptTurn(4, "c1", 6, render_prompt_ids(tokenizer, messages, tools))
    bare = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, return_dict=False)
    assert turn.prompt_ids != bare  # SGLang renders its normalized tools ("defer_loading": null, ...)
    assert '"defer_loading": null' in tokenizer.decode(turn.prompt_ids)
    [plain] = renderer.render(conv({"role": "user", "content": "Hi"}))  # no tools: the same as transformers
    hi = [{"role": "user", "content": "Hi"}]
    assert plain.prompt_ids == tokenizer.apply_chat_template(
        hi, add_generation_prompt=True, return_dict=False
    )


def test_tools_tool_calls_and_reasoning_reach_the_prompt(renderer: Renderer) -> None:
    text = prompt_text(renderer, TOOL_CHAT, TOOLS)
    assert '"name": "get_weather"' in text and '"description": "Current weather"' in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>' in text
    assert "<think>\nI should call the weather tool.\n</think>" in text
    assert "<|im_start|>tool\n" in text
    assert text.endswith("<|im_start|>user\nThanks!<|im_end|>\n<|im_start|>assistant\n")


def test_chat_template_kwargs_reach_the_template() -> None:
    thinking_off = Renderer(make_recipe(chat_template_kwargs={"enable_thinking": False}))
    [turn] = thinking_off.render(conv({"role": "user", "content": "Hi"}))
    assert thinking_off.tokenizer.decode(turn.prompt_ids).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    assert thinking_off.identity()["chat_template_kwargs"] == '{"enable_thinking":false}'


def test_default_generation_prompt_has_no_think_block(renderer: Renderer) -> None:
    [turn] = renderer.render(conv({"role": "user", "content": "Hi"}))
    assert text_of(renderer, turn) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


# --- generation points -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("roles", "last", "every"),
    [
        (["user"], [1], [1]),
        (["user", "assistant"], [1], [1]),
        (["system", "user", "assistant", "user", "assistant"], [4], [2, 4]),
        (["system", "user", "assistant", "user"], [4], [2, 4]),
        (["user", "assistant", "tool"], [3], [1, 3]),
        (["assistant", "user", "assistant"], [2], [2]),
        (["assistant"], [], []),
    ],
)
def test_generation_points(roles: list[str], last: list[int], every: list[int]) -> None:
    messages = [{"role": r, "content": "x"} for r in roles]
    assert generation_points(messages, "last") == last
    assert generation_points(messages, "all") == every


def test_turns_last_prompts_with_the_history_before_the_final_assistant(renderer: Renderer) -> None:
    [turn] = renderer.render(conv(*TOOL_CHAT[:5]))
    assert turn.turn == 4
    assert text_of(renderer, turn) == prompt_text(renderer, TOOL_CHAT[:4], None)


def test_turns_all_gives_one_prompt_per_assistant_turn_plus_the_end(renderer_all: Renderer) -> None:
    turns = renderer_all.render(conv(*TOOL_CHAT, tools=TOOLS))
    assert [t.turn for t in turns] == [2, 4, 6]
    for t in turns:
        assert text_of(renderer_all, t) == prompt_text(renderer_all, TOOL_CHAT[: t.turn], TOOLS)
        assert (t.index, t.source_id) == (4, "c1")
    assert turns[0].prompt_ids == turns[1].prompt_ids[: len(turns[0].prompt_ids)]  # same history, same prefix


def test_a_lone_assistant_message_has_nothing_to_generate(renderer_all: Renderer) -> None:
    with pytest.raises(PromptFormatError, match="row 'c1': nothing to generate") as info:
        renderer_all.render(conv({"role": "assistant", "content": "hello"}))
    assert (info.value.row_id, info.value.index) == ("c1", 4)
    first_skipped = renderer_all.render(
        conv({"role": "assistant", "content": "hi"}, {"role": "user", "content": "q"})
    )
    assert [t.turn for t in first_skipped] == [2]


# --- template override and refusals ----------------------------------------------------------


STRICT_TEMPLATE = """\
{%- if messages[-1].role == 'tool' -%}
{{- raise_exception('history must not end with a tool result') -}}
{%- endif -%}
{%- for m in messages -%}[{{ m.role }}]{{ m.content }}{%- endfor -%}
{%- if add_generation_prompt -%}[assistant]{%- endif -%}"""


def test_template_override_file_is_used_and_its_refusals_are_format_errors(tmp_path: Path) -> None:
    (tmp_path / "strict.jinja").write_text(STRICT_TEMPLATE)
    strict = Renderer(make_recipe(tmp_path, turns="all", chat_template="strict.jinja"))
    [turn] = strict.render(conv({"role": "user", "content": "a"}))
    assert strict.tokenizer.decode(turn.prompt_ids) == "[user]a[assistant]"
    two_assistants = conv(
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "assistant", "content": "c"},
        source_id="dbl",
    )  # SGLang's chat path makes a final assistant message a user message (add_generation_prompt null)
    assert [strict.tokenizer.decode(t.prompt_ids) for t in strict.render(two_assistants)] == [
        "[user]a[assistant]", "[user]a[user]b[assistant]"
    ]  # fmt: skip
    tool_last = conv({"role": "user", "content": "a"}, {"role": "tool", "content": "r"}, source_id="tl")
    with pytest.raises(PromptFormatError, match="row 'tl' turn 2: the chat path refused it") as info:
        strict.render(tool_last)
    assert "history must not end with a tool result" in str(info.value)
    assert (info.value.row_id, info.value.index) == ("tl", 4)
    default_digest = Renderer(make_recipe()).identity()["chat_template_sha256"]
    assert strict.identity()["chat_template_sha256"] == hashlib.sha256(STRICT_TEMPLATE.encode()).hexdigest()
    assert strict.identity()["chat_template_sha256"] != default_digest


def test_history_without_a_user_message_is_left_to_the_template(renderer: Renderer) -> None:
    [turn] = renderer.render(conv({"role": "system", "content": "Only a system prompt."}))
    assert text_of(renderer, turn).startswith("<|im_start|>system\nOnly a system prompt.<|im_end|>")


# --- BOS -------------------------------------------------------------------------------------


def bos_tokenizer(folder: Path, *, template_writes_bos: bool) -> Path:
    """A copy of the reference tokenizer whose post-processor adds a BOS (and maybe its template too)."""
    target = folder / "bos-model"
    shutil.copytree(reference_model_dir(), target)
    tokenizer = json.loads((target / "tokenizer.json").read_text())
    tokenizer["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": BOS, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {BOS: {"id": BOS, "ids": [BOS_ID], "tokens": [BOS]}},
    }
    (target / "tokenizer.json").write_text(json.dumps(tokenizer))
    config = json.loads((target / "tokenizer_config.json").read_text())
    config.pop("add_bos_token", None)
    config["bos_token"] = BOS
    if template_writes_bos:
        config["chat_template"] = "{{ bos_token }}" + config["chat_template"]
    (target / "tokenizer_config.json").write_text(json.dumps(config))
    return target


@pytest.mark.parametrize("template_writes_bos", [True, False])
def test_the_template_alone_decides_the_bos(tmp_path: Path, template_writes_bos: bool) -> None:
    folder = bos_tokenizer(tmp_path, template_writes_bos=template_writes_bos)
    r = Renderer(make_recipe(tmp_path, tokenizer=str(folder)))
    assert r.tokenizer("hi")["input_ids"][0] == BOS_ID  # the post-processor does add one
    [turn] = r.render(conv({"role": "user", "content": "hi"}))
    assert turn.prompt_ids.count(BOS_ID) == (1 if template_writes_bos else 0)
    assert (turn.prompt_ids[0] == BOS_ID) is template_writes_bos
    assert turn.prompt_ids == r.tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, return_dict=False
    )


# --- loading and identity --------------------------------------------------------------------


def test_properties_and_identity(renderer: Renderer) -> None:
    assert renderer.vocab_size == len(renderer.tokenizer) == 6144
    assert 6139 in renderer.eos_token_ids
    identity = renderer.identity()
    tokenizer_json = (reference_model_dir() / "tokenizer.json").read_bytes()
    assert identity["tokenizer_sha256"] == hashlib.sha256(tokenizer_json).hexdigest()
    template = renderer.tokenizer.chat_template
    assert identity["chat_template_sha256"] == hashlib.sha256(template.encode()).hexdigest()
    assert identity["tokenizer"] == "reference" and identity["vocab_size"] == "6144"
    assert all(isinstance(v, str) for v in identity.values())


def test_eos_ids_come_from_the_generation_config_too(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    shutil.copytree(reference_model_dir(), folder)
    (folder / "generation_config.json").write_text('{"eos_token_id": [6139, 6137]}')
    assert Renderer(make_recipe(tmp_path, tokenizer="model")).eos_token_ids == frozenset({6137, 6139})


@pytest.mark.parametrize(
    ("model", "field", "fragment"),
    [
        ({"tokenizer": "empty-dir"}, "model.tokenizer", "could not load a tokenizer from"),
        ({"chat_template": "missing.jinja"}, "model.chat_template", "expected a readable Jinja file"),
        (
            {"chat_template_kwargs": {"tools": []}},
            "model.chat_template_kwargs",
            "tools: set by the chat path",
        ),
        ({"chat_template_kwargs": {"messages": []}}, "model.chat_template_kwargs", "messages: set"),
    ],
)
def test_loading_problems_are_recipe_errors(
    tmp_path: Path, model: dict[str, Any], field: str, fragment: str
) -> None:
    (tmp_path / "empty-dir").mkdir()
    with pytest.raises(RecipeError, match=fragment) as info:
        Renderer(make_recipe(tmp_path, **model))
    assert info.value.field == field


def test_a_tokenizer_without_a_chat_template_needs_a_template_file(tmp_path: Path) -> None:
    folder = tmp_path / "plain"
    shutil.copytree(reference_model_dir(), folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(RecipeError, match="no chat template") as info:
        Renderer(make_recipe(tmp_path, tokenizer="plain"))
    assert info.value.field == "model.chat_template"
    (tmp_path / "t.jinja").write_text(STRICT_TEMPLATE)
    r = Renderer(make_recipe(tmp_path, tokenizer="plain", chat_template="t.jinja"))
    assert (
        r.tokenizer.decode(r.render(conv({"role": "user", "content": "z"}))[0].prompt_ids)
        == "[user]z[assistant]"
    )


# --- whole-run problems found at load (issue 14) -----------------------------------------------


def test_a_chat_template_kwarg_the_template_never_reads_is_refused_with_a_suggestion(tmp_path: Path) -> None:
    assert Renderer(make_recipe(tmp_path, chat_template_kwargs={"enable_thinking": False}))  # read: fine
    with pytest.raises(RecipeError) as refused:
        Renderer(make_recipe(tmp_path, chat_template_kwargs={"enable_thinkin": False}))
    assert refused.value.field == "model.chat_template_kwargs"
    message = str(refused.value)
    assert "the chat template never reads 'enable_thinkin' (did you mean 'enable_thinking'?)" in message
    assert "enable_thinking" in message.split("the keywords it reads: ")[1]
    # a template that reads none: every keyword is refused, nothing to suggest
    (tmp_path / "strict.jinja").write_text(STRICT_TEMPLATE)
    with pytest.raises(RecipeError, match="never reads 'x'; the keywords it reads: none"):
        Renderer(make_recipe(tmp_path, chat_template="strict.jinja", chat_template_kwargs={"x": 0}))


def test_special_tokens_and_defined_checks_count_as_read(tmp_path: Path) -> None:
    (tmp_path / "t.jinja").write_text(
        "{{ bos_token }}{% if reasoning is defined and reasoning %}R{% endif %}"
        "{% for m in messages %}{{ m.content }}{% endfor %}"
    )
    r = Renderer(make_recipe(tmp_path, chat_template="t.jinja", chat_template_kwargs={"reasoning": True}))
    [turn] = r.render(conv({"role": "user", "content": "x"}))
    assert r.tokenizer.decode(turn.prompt_ids).endswith("Rx")


@pytest.mark.parametrize(
    ("text", "line"),
    [("{% for m in messages %}{{ m.content }}", 1), ("{{ messages[0].content }}\n{% if %}x{% endif %}", 2)],
)
def test_a_template_syntax_error_fails_at_load_naming_the_line(tmp_path: Path, text: str, line: int) -> None:
    (tmp_path / "broken.jinja").write_text(text)
    with pytest.raises(RecipeError) as refused:
        Renderer(make_recipe(tmp_path, chat_template="broken.jinja"))
    assert refused.value.field == "model.chat_template" and refused.value.value == "broken.jinja"
    assert f"Jinja syntax error at line {line}:" in str(refused.value)


def test_a_broken_template_in_the_tokenizer_itself_is_named(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    shutil.copytree(reference_model_dir(), folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = {"default": STRICT_TEMPLATE, "tool_use": "{% if tools %}"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(RecipeError) as refused:
        Renderer(make_recipe(tmp_path, tokenizer="model"))
    assert refused.value.value == "the chat template of model (template 'tool_use')"
    assert "Jinja syntax error at line 1" in str(refused.value)
