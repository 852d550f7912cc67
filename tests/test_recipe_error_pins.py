"""Pins (issue 23): what the recipe parser says of each field given each kind of value, as the
hand-written parser said it before recipe.py became a package: the exact error (field, value,
allowed values, did-you-mean) or, for a value it takes, the recipe's fingerprint. The outcomes are
in ``tests/data/recipe_error_pins.json``; ``python -m tests.test_recipe_error_pins`` rewrites them
(only when a change of message is meant)."""

from __future__ import annotations

import contextlib
import copy
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from eagle3_raw.recipe import load_recipe

PINS = Path(__file__).parent / "data" / "recipe_error_pins.json"
DELETE = "<delete>"

ENDPOINTS: dict[str, Any] = {
    "name": "pins",
    "prompts": {"source": "org/data"},
    "model": {"tokenizer": "org/tok"},
    "server": {"endpoints": ["http://h:1"]},
    "sampling": {"max_new_tokens": 8},
}
SGLANG = {**ENDPOINTS, "server": {"launch": "sglang", "sglang": {"model_path": "org/m"}}}
VLLM = {**ENDPOINTS, "server": {"launch": "vllm", "vllm": {"model": "org/m"}}}
REFERENCE = {**ENDPOINTS, "server": {"launch": "reference"}}
ROLLOUT = {**ENDPOINTS, "turns": "rollout", "rollout": {"merge": "auto"}}
MIXTURE = {
    **ENDPOINTS,
    "sampling": {"max_new_tokens": 8, "temperature": 0.5, "mixture": [{"weight": 1, "temperature": 0.2}]},
}
BASES = {
    "endpoints": ENDPOINTS,
    "sglang": SGLANG,
    "vllm": VLLM,
    "reference": REFERENCE,
    "rollout": ROLLOUT,
    "mixture": MIXTURE,
}

VALUES: list[Any] = [DELETE, None, "x", "", 5, -1, 0, 1.5, True, [], {}, [1], ["a"], {"a": 1}]

FIELDS: dict[str, list[str]] = {
    "endpoints": [
        "name", "turns", "on_truncation", "license", "description", "bogus", "prompts", "model", "server",
        "sampling", "export", "rollout",
        *(f"prompts.{k}" for k in
          ("source", "format", "subset", "split", "revision", "id_column", "limit", "shuffle_seed", "sourc")),
        *(f"model.{k}" for k in
          ("tokenizer", "revision", "trust_remote_code", "chat_template", "chat_template_kwargs",
           "reasoning_effort", "render", "render_date", "tokeniser")),
        *(f"server.{k}" for k in
          ("endpoints", "launch", "launch_args", "sglang", "vllm", "api_key_env", "max_in_flight",
           "request_timeout", "connect_timeout", "max_retries", "wait_for_server", "startup_timeout",
           "endpoint")),
        *(f"sampling.{k}" for k in
          ("max_new_tokens", "min_new_tokens", "temperature", "top_p", "top_k", "min_p", "frequency_penalty",
           "presence_penalty", "repetition_penalty", "stop", "stop_token_ids", "stop_regex", "json_schema",
           "regex", "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens",
           "spaces_between_special_tokens", "no_stop_trim", "logit_bias", "custom_params", "beam_width",
           "watermark", "samples_per_prompt", "seed", "mixture", "n", "sampling_seed", "max_tokens",
           "temprature", "params", "weight")),
        "export.draft_vocab_sizes", "export.draft_vocab_size",
    ],
    "sglang": [
        "server.endpoints", "server.launch", "server.launch_args", "server.sglang", "server.startup_timeout",
        *(f"server.sglang.{k}" for k in
          ("model_path", "revision", "served_model_name", "tp_size", "dp_size", "context_length",
           "reasoning_parser", "tool_call_parser", "trust_remote_code", "deterministic", "extra_args",
           "executable", "env", "startup_timeout", "stop_timeout", "log_dir", "model")),
    ],
    "vllm": [
        "server.endpoints", "server.launch", "server.launch_args", "server.sglang", "server.vllm",
        "server.startup_timeout",
        *(f"server.vllm.{k}" for k in
          ("model", "revision", "served_model_name", "tensor_parallel_size", "data_parallel_size",
           "max_model_len", "reasoning_parser", "tool_call_parser", "trust_remote_code", "seed", "extra_args",
           "executable", "env", "startup_timeout", "stop_timeout", "log_dir", "model_path")),
    ],
    "reference": ["server.endpoints", "server.launch", "server.launch_args", "server.sglang",
                  "server.startup_timeout"],
    "rollout": ["turns", "rollout", "rollout.reasoning_parser", "rollout.tool_call_parser", "rollout.merge",
                "rollout.merg"],
    "mixture": [
        "sampling.mixture", "sampling.mixture.0",
        *(f"sampling.mixture.0.{k}" for k in
          ("weight", "chat_template_kwargs", "reasoning_effort", "temperature", "max_new_tokens",
           "min_new_tokens", "top_k", "stop", "n", "seed", "samples_per_prompt", "params", "wieght")),
    ],
}  # fmt: skip

#: Values that are not one of VALUES' kinds but reach a field's own rules.
SPECIAL: list[tuple[str, str, Any]] = [
    ("endpoints", "name", "a b"),
    ("endpoints", "name", "x" * 97),
    ("endpoints", "prompts.format", "sharegpt"),
    ("endpoints", "prompts.limit", 2**70),
    ("endpoints", "model.render_date", "2026-02-30"),
    ("endpoints", "model.render_date", "2026-12-01"),
    ("endpoints", "model.revision", None),
    ("endpoints", "model.trust_remote_code", True),
    ("endpoints", "server.endpoints", "ftp://h"),
    ("endpoints", "server.endpoints", "http://h:0"),
    ("endpoints", "server.endpoints", "http://h:99999"),
    ("endpoints", "server.endpoints", ["http://h:1", "http://h:1/"]),
    ("endpoints", "server.endpoints", "http://"),
    ("endpoints", "server.launch", "reference"),
    ("endpoints", "server.max_retries", 2**40),
    ("endpoints", "server.request_timeout", float("inf")),
    ("endpoints", "sampling.temperature", 0),
    ("endpoints", "sampling.top_p", 0.0),
    ("endpoints", "sampling.top_k", 1),
    ("endpoints", "sampling.stop", ["a"] * 33),
    ("endpoints", "sampling.min_new_tokens", 9),
    ("endpoints", "sampling.samples_per_prompt", 2),
    ("endpoints", "sampling.repetition_penalty", 2.5),
    ("endpoints", "sampling.mixture", [{"weight": 1}] * 65),
    ("endpoints", "export.draft_vocab_sizes", [4, 4]),
    ("endpoints", "export.draft_vocab_sizes", [8, 4]),
    ("sglang", "server.sglang.tp_size", 4097),
    ("sglang", "server.sglang.context_length", 7),
    ("sglang", "server.sglang.extra_args", ["--port", "1"]),
    ("sglang", "server.sglang.extra_args", ["--tp", "2"]),
    ("sglang", "server.sglang.extra_args", ["--api-key=x"]),
    ("sglang", "server.sglang.model_path", " "),
    ("sglang", "server.sglang.env", {"1A": "x"}),
    ("sglang", "server.sglang.env", {"A": 1}),
    ("sglang", "server.sglang.executable", [8]),
    ("vllm", "server.vllm.tensor_parallel_size", 4097),
    ("vllm", "server.vllm.max_model_len", 7),
    ("vllm", "server.vllm.extra_args", ["--port", "1"]),
    ("vllm", "server.vllm.extra_args", ["--tp", "2"]),
    ("vllm", "server.vllm.extra_args", ["-tp", "2"]),
    ("vllm", "server.vllm.extra_args", ["--tensor_parallel_size=2"]),
    ("vllm", "server.vllm.extra_args", ["--no-enable-scale-out"]),
    ("vllm", "server.vllm.extra_args", ["--generation-config", "auto"]),
    ("vllm", "server.vllm.extra_args", ["--config", "c.yaml"]),
    ("vllm", "server.vllm.extra_args", ["--api-key=x"]),
    ("vllm", "server.vllm.extra_args", ["--hf-token", "x"]),
    ("vllm", "server.vllm.extra_args", ["--max-num-seqs", "-1", "--long-prefill-token-threshold", "8"]),
    ("vllm", "server.vllm.model", " "),
    ("vllm", "server.vllm.env", {"VLLM_API_KEY": "x"}),
    ("vllm", "server.vllm.env", {"VLLM_NO_USAGE_STATS": "0"}),
    ("vllm", "server.vllm.env", {"VLLM_TARGET_DEVICE": "cpu"}),
    ("vllm", "server.vllm.executable", [8]),
    ("reference", "server.launch_args", ["--slots", "2"]),
    ("reference", "server.launch_args", ["--port", "2"]),
    ("reference", "server.launch_args", ["--slots"]),
    ("reference", "server.launch_args", [3]),
    ("rollout", "rollout.reasoning_parser", "qwen3"),
    ("rollout", "rollout.reasoning_parser", "qwen4"),
    ("rollout", "rollout.tool_call_parser", "qwen25"),
    ("rollout", "rollout.merge", "never"),
    ("rollout", "turns", "last"),
    ("mixture", "sampling.mixture.0.weight", 0),
    ("mixture", "sampling.mixture.0.weight", float("nan")),
    ("mixture", "sampling.mixture.0.temperature", 0),
    ("mixture", "sampling.mixture.0.min_new_tokens", 9),
    ("mixture", "sampling.samples_per_prompt", 2),
]


def _set(raw: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    target: Any = raw
    for part in parents:
        target = target[int(part)] if isinstance(target, list) else target.setdefault(part, {})
    key: Any = int(last) if isinstance(target, list) else last
    if value == DELETE and not isinstance(value, bool):
        if isinstance(target, dict):
            target.pop(key, None)
        else:
            del target[key]
    else:
        target[key] = value


def outcome(base: str, dotted: str, value: Any) -> str:
    """What loading ``base`` with ``dotted`` set to ``value`` gives: the error, or the fingerprint (in
    an empty folder, which relative paths name as ``<cwd>``)."""
    raw = copy.deepcopy(BASES[base])
    try:
        _set(raw, dotted, value)
    except (TypeError, KeyError, IndexError, AttributeError) as exc:
        return f"cannot set: {type(exc).__name__}"
    with tempfile.TemporaryDirectory() as folder, contextlib.chdir(folder):  # relative paths: an empty one
        try:
            return f"ok {load_recipe(raw).fingerprint}"
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}".replace(str(Path.cwd()), "<cwd>")


def cases() -> list[tuple[str, str, Any]]:
    every = [
        (base, dotted, value) for base, fields in FIELDS.items() for dotted in fields for value in VALUES
    ]
    return list({case_id(*case): case for case in every + SPECIAL}.values())


def case_id(base: str, dotted: str, value: Any) -> str:
    return f"{base}:{dotted}={json.dumps(value)[:40]}"


def computed() -> dict[str, str]:
    return {case_id(*case): outcome(*case) for case in cases()}


@pytest.fixture(scope="module")
def pinned() -> dict[str, str]:
    data: dict[str, str] = json.loads(PINS.read_text(encoding="utf-8"))
    return data


def test_every_case_is_pinned(pinned: dict[str, str]) -> None:
    assert sorted(pinned) == sorted(case_id(*case) for case in cases())


@pytest.mark.parametrize("case", cases(), ids=[case_id(*case) for case in cases()])
def test_the_parser_says_what_it_said(pinned: dict[str, str], case: tuple[str, str, Any]) -> None:
    assert outcome(*case) == pinned[case_id(*case)]


if __name__ == "__main__":
    PINS.write_text(json.dumps(computed(), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    sys.stdout.write(f"{PINS}: {len(computed())} outcomes\n")
