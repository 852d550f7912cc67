"""Pins (issue 23): the identity of every bundled recipe, and of recipes that set every section, as
the hand-written parser made it before recipe.py became a package. A parser rewrite that changes a
set's fingerprint, its written recipe (``to_dict`` / ``to_yaml``) or the shaping payload of its input
keys fails here. Every file the recipes read is written here with fixed content, and every path is
relative to the recipe's folder (a fingerprint names files by content, never by where they are)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import orjson
import pytest

from eagle3_raw.recipe import Recipe, load_recipe, recipe_to_dict, shaping_payload

COMMIT = "0123456789abcdef0123456789abcdef01234567"

PROMPTS = b'{"id": "a", "conversations": [{"from": "human", "value": "hi"}]}\n'
TEMPLATE = b"{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}<|assistant|>"
TOKENIZER_FILES = {
    "tokenizer_config.json": b'{"model_max_length": 4096}',
    "tokenizer.json": b'{"version": "1.0"}',
    "model.safetensors": b"weights are never digested",
    ".hidden": b"nor hidden files",
}

EVERY_SECTION = """
name: every-section
description: every field a recipe may set
license: apache-2.0
prompts:
  source: data/prompts.jsonl
  format: sharegpt
  subset: default
  split: validation
  revision: main
  id_column: id
  limit: 40
  shuffle_seed: 3
turns: rollout
model:
  tokenizer: reference
  chat_template: template.jinja
  chat_template_kwargs: {enable_thinking: false, depth: 2}
  reasoning_effort: high
  render: local
  render_date: 2026-12-01
server:
  endpoints: [http://127.0.0.1:30000/, "http://[::1]:30001"]
  api_key_env: MY_KEY
  max_in_flight: 12
  request_timeout: 90
  connect_timeout: 2.5
  max_retries: 0
  wait_for_server: 30
sampling:
  max_new_tokens: 256
  min_new_tokens: 4
  temperature: 1
  top_p: 0.9
  top_k: -1
  min_p: 0
  frequency_penalty: 0.5
  presence_penalty: -1
  repetition_penalty: 1.1
  stop: ["</s>", "###"]
  stop_token_ids: [2, 7]
  ignore_eos: false
  skip_special_tokens: true
  no_stop_trim: true
  logit_bias: {}
  regex: null
  samples_per_prompt: 3
  seed: 11
  mixture:
    - {weight: 3, temperature: 0.7, top_k: 20}
    - weight: 1.5
      temperature: 0
      stop: ""
      chat_template_kwargs: {enable_thinking: true}
      reasoning_effort: low
    - {weight: 1, max_new_tokens: 64}
on_truncation: drop
export:
  draft_vocab_sizes: [64, 32]
rollout:
  reasoning_parser: qwen3
  tool_call_parser: qwen25
  merge: never
"""

SGLANG_LAUNCH = """
name: sglang-launch
prompts: {source: data, format: openai}
model:
  tokenizer: tok
  revision: v1
  trust_remote_code: true
server:
  launch: sglang
  api_key_env: SGLANG_KEY
  max_in_flight: 64
  sglang:
    model_path: org/model
    revision: abc
    served_model_name: served
    tp_size: 2
    dp_size: 4
    context_length: 8192
    reasoning_parser: qwen3
    tool_call_parser: qwen25
    trust_remote_code: true
    deterministic: false
    extra_args: [--mem-fraction-static, "0.8"]
    executable: [python3, -m, sglang.launch_server]
    env: {CUDA_VISIBLE_DEVICES: "0,1"}
    startup_timeout: 600
    stop_timeout: 5
    log_dir: logs
sampling:
  max_new_tokens: 32
  temperature: 0.6
  json_schema: '{"type": "object"}'
turns: all
"""

REFERENCE_LAUNCH = """
name: reference-launch
prompts: {source: data/prompts.jsonl, format: prompt, limit: 5}
server:
  launch: reference
  launch_args: [--slots, "4", --ms-per-token=2]
  startup_timeout: 45
  max_retries: 2
sampling: {max_new_tokens: 8, temperature: 0, samples_per_prompt: 1}
"""

HUB = """
name: hub.sources
prompts: {source: org/chats, subset: en, split: "train[:100]", revision: v2}
model: {tokenizer: org/tokenizer, revision: 0123456789abcdef0123456789abcdef01234567, trust_remote_code: true}
server: {endpoints: http://gpu:30000}
sampling: {max_new_tokens: 1024, top_k: 1, seed: 5}
export: {draft_vocab_sizes: []}
rollout: {}
"""


def _write_files(folder: Path) -> None:
    (folder / "data").mkdir()
    (folder / "data" / "prompts.jsonl").write_bytes(PROMPTS)
    (folder / "data" / "more.json").write_bytes(b'[{"id": "b", "prompt": "hello"}]')
    (folder / "data" / "notes.txt").write_bytes(b"not a prompt file")
    (folder / "template.jinja").write_bytes(TEMPLATE)
    (folder / "tok").mkdir()
    for name, content in TOKENIZER_FILES.items():
        (folder / "tok" / name).write_bytes(content)


CASES: dict[str, tuple[str, Any]] = {
    "every-section": (EVERY_SECTION, None),
    "sglang-launch": (SGLANG_LAUNCH, None),
    "reference-launch": (REFERENCE_LAUNCH, None),
    "hub-sources": (HUB, None),
    # an override of server.endpoints replaces the recipe's launched server
    "reference-launch-overridden": (
        REFERENCE_LAUNCH,
        ["server.endpoints=[http://127.0.0.1:30000]", "sampling.temperature=0.25", "prompts.limit=null"],
    ),
    "every-section-overridden": (
        EVERY_SECTION,
        {
            "sampling": {"seed": 12, "mixture": None},
            "turns": "all",
            "rollout": None,
            "export.draft_vocab_sizes": [8],
        },
    ),
}

BUNDLED = ["demo", "qwen3", "kimi-k2.5", "gpt-oss", "llama-3.1", "deepseek-v3"]


def _bundled(name: str) -> Recipe:
    return load_recipe(name, {"model.revision": COMMIT} if name == "kimi-k2.5" else None)


def _case(tmp_path: Path, name: str) -> Recipe:
    text, overrides = CASES[name]
    _write_files(tmp_path)
    path = tmp_path / f"{name}.yaml"
    path.write_text(text, encoding="utf-8")
    return load_recipe(path, overrides)


def _sha(data: Any, *, sort: bool) -> str:
    option = orjson.OPT_SORT_KEYS if sort else 0
    return hashlib.sha256(orjson.dumps(data, option=option)).hexdigest()[:16]


def identity(recipe: Recipe) -> dict[str, str]:
    """What is pinned of a recipe: its fingerprint, its data as written (key order and int/float
    types included, as ``to_dict`` and as YAML) and the shaping payload its input keys hold."""
    assert recipe.to_dict() == recipe_to_dict(recipe)
    return {
        "fingerprint": recipe.fingerprint,
        "to_dict": _sha(recipe.to_dict(), sort=False),
        "to_yaml": hashlib.sha256(recipe.to_yaml().encode()).hexdigest()[:16],
        "shaping": _sha(shaping_payload(recipe), sort=True),
    }


PINS: dict[str, dict[str, str]] = {
    "demo": {
        "fingerprint": "0dbc81e617a7de4f",
        "to_dict": "d011306cdf95895f",
        "to_yaml": "3f7836829c3cd76b",
        "shaping": "3de85bbb7cb31314",
    },
    "qwen3": {
        "fingerprint": "060c27a0826e7d86",
        "to_dict": "d026ad3c909630ee",
        "to_yaml": "e259ffd5fbb59d4a",
        "shaping": "e9b7806af94cb89f",
    },
    "kimi-k2.5": {
        "fingerprint": "525010d5025ebf1b",
        "to_dict": "50b2ca154c7f09d4",
        "to_yaml": "2c236d406e981c0f",
        "shaping": "f305e3cd213a85a3",
    },
    "gpt-oss": {
        "fingerprint": "7694332d55330060",
        "to_dict": "07cb850294913dc8",
        "to_yaml": "a7bd366e9c8384c0",
        "shaping": "04706001e548496b",
    },
    "llama-3.1": {
        "fingerprint": "337293311d6d7883",
        "to_dict": "240e46b973501e80",
        "to_yaml": "0f45bb1c6bf2d277",
        "shaping": "90d8dd096c0f5803",
    },
    "deepseek-v3": {
        "fingerprint": "4956bf8f65c5cc5d",
        "to_dict": "5e56b1651a4f0a25",
        "to_yaml": "acea14204dd8f971",
        "shaping": "34ba65bde498f8ad",
    },
    "every-section": {
        "fingerprint": "596bd2d0bc8714ff",
        "to_dict": "474bcc2e696bb504",
        "to_yaml": "bd9bdc69c4e7c92e",
        "shaping": "dba5a40b9a9d07e4",
    },
    "sglang-launch": {
        "fingerprint": "fa55021f24970f2b",
        "to_dict": "e06a0d5d9ed7c473",
        "to_yaml": "54536b6e71f0526a",
        "shaping": "67ba4c11df251dbd",
    },
    "reference-launch": {
        "fingerprint": "202ac2c5ab2899d3",
        "to_dict": "8778138c60f2cfc7",
        "to_yaml": "8fb30e65238cf0d0",
        "shaping": "45c7fcec7723f825",
    },
    "hub-sources": {
        "fingerprint": "0b945c8af690bfc0",
        "to_dict": "3d36cf7dfcc2866b",
        "to_yaml": "ad772392cb1c182e",
        "shaping": "c112d8d2927b7286",
    },
    "reference-launch-overridden": {
        "fingerprint": "cbee9422b39fa2d3",
        "to_dict": "52e76d89f9d7538b",
        "to_yaml": "60cfcfbb7311f92d",
        "shaping": "f84f1cb88be55486",
    },
    "every-section-overridden": {
        "fingerprint": "d03022b593a37f41",
        "to_dict": "f1139725e3f38e96",
        "to_yaml": "ca079c22c85c052d",
        "shaping": "90fe4a5c09adc651",
    },
}

#: ``every-section``'s written recipe in full (key order and int/float types included)
EVERY_SECTION_DICT: dict[str, Any] = {
    "name": "every-section",
    "description": "every field a recipe may set",
    "license": "apache-2.0",
    "prompts": {
        "source": "data/prompts.jsonl",
        "format": "sharegpt",
        "subset": "default",
        "split": "validation",
        "revision": "main",
        "id_column": "id",
        "category_column": None,
        "limit": 40,
        "shuffle_seed": 3,
    },
    "turns": "rollout",
    "model": {
        "tokenizer": "reference",
        "revision": None,
        "trust_remote_code": False,
        "chat_template": "template.jinja",
        "chat_template_kwargs": {"enable_thinking": False, "depth": 2},
        "reasoning_effort": "high",
        "render": "local",
        "render_date": "2026-12-01",
    },
    "server": {
        "endpoints": ["http://127.0.0.1:30000", "http://[::1]:30001"],
        "engine": None,
        "launch": None,
        "launch_args": [],
        "sglang": None,
        "api_key_env": "MY_KEY",
        "max_in_flight": 12,
        "request_timeout": 90.0,
        "connect_timeout": 2.5,
        "max_retries": 0,
        "wait_for_server": 30.0,
        "startup_timeout": 300.0,
    },
    "sampling": {
        "max_new_tokens": 256,
        "min_new_tokens": 4,
        "temperature": 1,
        "top_p": 0.9,
        "top_k": -1,
        "min_p": 0,
        "frequency_penalty": 0.5,
        "presence_penalty": -1,
        "repetition_penalty": 1.1,
        "stop": ["</s>", "###"],
        "stop_token_ids": [2, 7],
        "ignore_eos": False,
        "skip_special_tokens": True,
        "no_stop_trim": True,
        "logit_bias": {},
        "samples_per_prompt": 3,
        "seed": 11,
        "mixture": [
            {"weight": 3.0, "temperature": 0.7, "top_k": 20},
            {
                "weight": 1.5,
                "temperature": 0,
                "stop": "",
                "chat_template_kwargs": {"enable_thinking": True},
                "reasoning_effort": "low",
            },
            {"weight": 1.0, "max_new_tokens": 64},
        ],
    },
    "on_truncation": "drop",
    "export": {"draft_vocab_sizes": [32, 64]},
    "rollout": {"reasoning_parser": "qwen3", "tool_call_parser": "qwen25", "merge": "never"},
}


@pytest.mark.parametrize("name", BUNDLED)
def test_bundled_recipe_identity_is_pinned(name: str) -> None:
    assert identity(_bundled(name)) == PINS[name]


@pytest.mark.parametrize("name", list(CASES))
def test_recipe_identity_is_pinned(tmp_path: Path, name: str) -> None:
    assert identity(_case(tmp_path, name)) == PINS[name]


def test_every_section_recipe_is_written_in_full(tmp_path: Path) -> None:
    written = _case(tmp_path, "every-section").to_dict()
    assert written == EVERY_SECTION_DICT
    assert orjson.dumps(written) == orjson.dumps(EVERY_SECTION_DICT)  # 1 and 1.0 differ here
