"""The packaged reference tokenizer: offline loading, special tokens, chat template, reproducible build."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from eagle3_raw.reference.model_files import load_raw_tokenizer, load_tokenizer
from eagle3_raw.resources import reference_model_dir
from tests.helpers import WEATHER

ROOT = Path(__file__).resolve().parents[2]
SPECIAL_IDS = {
    "<|endoftext|>": 6137,
    "<|im_start|>": 6138,
    "<|im_end|>": 6139,
    "<think>": 6140,
    "</think>": 6141,
    "<tool_call>": 6142,
    "</tool_call>": 6143,
}


@pytest.fixture(scope="module")
def tok() -> Any:
    return load_tokenizer()


def render(tok: Any, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    text: str = tok.apply_chat_template(messages, tokenize=False, **kwargs)
    return text


def test_loads_offline_with_auto_tokenizer(tok: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import AutoTokenizer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    again = AutoTokenizer.from_pretrained(str(reference_model_dir()))
    assert len(again) == len(tok) == 6144
    assert again.chat_template == tok.chat_template


def test_special_tokens_and_eos(tok: Any) -> None:
    assert tok.eos_token == "<|im_end|>"
    assert tok.eos_token_id == SPECIAL_IDS["<|im_end|>"]
    assert tok.pad_token_id == SPECIAL_IDS["<|endoftext|>"]
    assert tok.bos_token is None
    for content, token_id in SPECIAL_IDS.items():
        assert tok.encode(content, add_special_tokens=True) == [token_id]
        assert tok.convert_ids_to_tokens(token_id) == content


def test_no_bos_and_think_tags_survive_skip_special_tokens(tok: Any) -> None:
    ids = tok.encode("<think>\nhi\n</think>\n\nHello world.<|im_end|>")
    assert ids[0] == SPECIAL_IDS["<think>"]
    assert tok.decode(ids, skip_special_tokens=True) == "<think>\nhi\n</think>\n\nHello world."


def test_config_files_agree_with_the_tokenizer(tok: Any) -> None:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(reference_model_dir()))
    generation = json.loads((reference_model_dir() / "generation_config.json").read_text())
    assert config.vocab_size == len(tok)
    assert config.eos_token_id == generation["eos_token_id"] == tok.eos_token_id
    assert config.max_position_embeddings == tok.model_max_length == 4096


def test_raw_tokenizer_matches_transformers(tok: Any) -> None:
    text = render(tok, [{"role": "user", "content": "What is 17 * 23?"}], add_generation_prompt=True)
    assert load_raw_tokenizer().encode(text).ids == tok.encode(text)


def test_template_system_user_generation_prompt(tok: Any) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    assert render(tok, messages, add_generation_prompt=True) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"
    )
    assert render(tok, messages).endswith("<|im_start|>user\nHi!<|im_end|>\n")


def test_template_enable_thinking_false_adds_empty_think_block(tok: Any) -> None:
    messages = [{"role": "user", "content": "Hi!"}]
    text = render(tok, messages, add_generation_prompt=True, enable_thinking=False)
    assert text == "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert render(tok, messages, add_generation_prompt=True, enable_thinking=True).endswith("assistant\n")


def test_template_tools_go_into_the_system_turn(tok: Any) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"}]
    text = render(tok, messages, tools=[WEATHER])
    system, user = text.split("<|im_end|>\n")[:2]
    assert system.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert "<tools>\n" + json.dumps(WEATHER) + "\n</tools>" in system
    format_hint = '{"name": <function-name>, "arguments": <args-json-object>}'
    assert system.endswith(f"<tool_call>\n{format_hint}\n</tool_call>")
    assert user == "<|im_start|>user\nWeather?"
    no_system = render(tok, messages[1:], tools=[WEATHER])
    assert no_system.startswith("<|im_start|>system\n# Tools\n")


def test_template_assistant_reasoning_tool_calls_and_tool_role(tok: Any) -> None:
    calls = [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
        {"name": "get_time", "arguments": '{"timezone": "UTC"}'},
    ]
    messages = [
        {"role": "user", "content": "Weather and time in Paris?"},
        {"role": "assistant", "content": "Checking.", "reasoning_content": "Two tools.", "tool_calls": calls},
        {"role": "tool", "content": '{"temp": 20}'},
        {"role": "assistant", "content": [{"type": "text", "text": "It is 20 C."}]},
    ]
    assert render(tok, messages) == (
        "<|im_start|>user\nWeather and time in Paris?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nTwo tools.\n</think>\n\nChecking.\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {"timezone": "UTC"}}\n</tool_call><|im_end|>\n'
        '<|im_start|>tool\n{"temp": 20}<|im_end|>\n'
        "<|im_start|>assistant\nIt is 20 C.<|im_end|>\n"
    )


def test_template_tool_call_without_content_has_no_leading_newline(tok: Any) -> None:
    call = {"function": {"name": "get_time", "arguments": {}}}
    text = render(tok, [{"role": "assistant", "content": None, "tool_calls": [call]}])
    call_json = '{"name": "get_time", "arguments": {}}'
    assert text == f"<|im_start|>assistant\n<tool_call>\n{call_json}\n</tool_call><|im_end|>\n"


def test_template_rejects_unknown_roles(tok: Any) -> None:
    with pytest.raises(Exception, match="Unknown message role: robot"):
        render(tok, [{"role": "robot", "content": "beep"}])


def test_tokenized_chat_template_in_transformers_5(tok: Any) -> None:
    """transformers 5 returns a BatchEncoding for tokenize=True; return_dict=False gives the ids."""
    messages = [{"role": "user", "content": "Weather in Oslo?"}]
    kwargs: dict[str, Any] = {"tools": [WEATHER], "add_generation_prompt": True}
    kwargs["enable_thinking"] = False
    encoding = tok.apply_chat_template(messages, tokenize=True, **kwargs)
    ids = tok.apply_chat_template(messages, tokenize=True, return_dict=False, **kwargs)
    assert list(encoding["input_ids"]) == ids == tok.encode(render(tok, messages, **kwargs))
    tail = tok.encode("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert ids[-len(tail) :] == tail


def _load_build_script() -> Any:
    path = ROOT / "scripts" / "build_reference_model.py"
    spec = importlib.util.spec_from_file_location("build_reference_model", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_build_script_reproduces_the_committed_files(tmp_path: Path) -> None:
    _load_build_script().build(tmp_path)
    committed = sorted(p.name for p in reference_model_dir().iterdir() if p.is_file())
    assert sorted(p.name for p in tmp_path.iterdir()) == committed
    for name in committed:
        assert (tmp_path / name).read_bytes() == (reference_model_dir() / name).read_bytes(), name
