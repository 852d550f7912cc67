"""Rows built on the real vLLM are its tokens: every prompt is the real ``/tokenize`` of the
conversation (its chat path: tools, content parts, names, reasoning; thinking on and off), every
output is what the real ``/v1/completions`` returns for that prompt again (greedy), ``render:
local`` (vLLM's chat path run here) builds the same rows, and the same recipe against SGLang (the
reference server, on the same tokenizer) is another set that reuses none of these generations.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import eagle3_raw
from eagle3_raw.journal.manifest import read_manifest
from eagle3_raw.recipe import load_recipe
from eagle3_raw.run.build import RunOptions, run
from tests.helpers import reference_server, write_jsonl, write_recipe
from tests.real_vllm.server import RealVLLM
from tests.real_vllm.test_routes import complete, send
from tests.test_rendering import ROWS

SAMPLING = {"max_new_tokens": 24, "temperature": 0.0}


def _chat(row: dict[str, Any], turn: int, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The chat request a client sends for the history before ``turn`` (straight from the source row)."""
    body: dict[str, Any] = {"messages": row["messages"][:turn], "chat_template_kwargs": kwargs}
    return {**body, "tools": row["tools"]} if row.get("tools") else body


def _tokenize(server: RealVLLM, chat: dict[str, Any]) -> list[int] | None:
    """The real ``/tokenize`` of a chat request (None when the real chat path refuses it)."""
    reply = send(server, "/tokenize", {**chat, "add_generation_prompt": True})
    return reply.body["tokens"] if reply.status == 200 else None


@pytest.mark.parametrize("thinking", [True, False], ids=["thinking", "no-thinking"])
def test_rows_are_the_real_servers_render_and_generation_in_both_render_modes(
    tmp_path: Path, real_vllm: RealVLLM, vllm_model: Path, thinking: bool
) -> None:
    write_jsonl(tmp_path / "prompts.jsonl", ROWS)
    kwargs = {"enable_thinking": thinking}
    built = {}
    for render in ("server", "local"):
        model = {"tokenizer": str(vllm_model), "render": render, "chat_template_kwargs": kwargs}
        recipe = write_recipe(
            tmp_path, endpoints=[real_vllm.url], turns="all", model=model, sampling=SAMPLING
        )
        built[render] = eagle3_raw.load(
            str(recipe), cache_dir=str(tmp_path / f"cache-{render}"), journal_dir=tmp_path / f"j-{render}",
            progress="none",
        )  # fmt: skip
    rows, by_id = built["server"], {row["id"]: row for row in ROWS}
    expected = {
        (row["id"], turn)
        for row in ROWS for turn, m in enumerate(row["messages"])
        if m["role"] == "assistant" and _tokenize(real_vllm, _chat(row, turn, kwargs)) is not None
    }  # fmt: skip
    missing = expected - {(r["source_id"], r["turn"]) for r in rows}
    assert not missing, missing  # every turn the real chat path takes is a row
    for row in rows:
        prompt = _tokenize(real_vllm, _chat(by_id[row["source_id"]], row["turn"], kwargs))
        assert row["input_ids"][: row["prompt_len"]] == prompt, row["id"]
        again = complete(real_vllm, prompt, max_tokens=SAMPLING["max_new_tokens"])
        assert row["input_ids"][row["prompt_len"] :] == again["token_ids"], row["id"]
        assert row["finish_reason"] == again["finish_reason"]
        assert row["meta"]["prompt_tokens"] == len(prompt) and row["meta"]["spec_accept_length"] is None
    assert built["local"]["id"] == rows["id"] and built["local"]["input_ids"] == rows["input_ids"]


def test_the_same_recipe_on_sglang_and_on_vllm_makes_two_sets_neither_reusing_the_other(
    tmp_path: Path, real_vllm: RealVLLM, vllm_model: Path
) -> None:
    write_jsonl(tmp_path / "prompts.jsonl", ROWS[:3])
    results = {}
    with reference_server(tmp_path, "--model-path", str(vllm_model)) as (sglang, _ledger):
        for engine, url in (("sglang", sglang.url), ("vllm", real_vllm.url)):
            recipe = load_recipe(write_recipe(
                tmp_path, endpoints=[url], model={"tokenizer": str(vllm_model)}, sampling=SAMPLING
            ))  # fmt: skip
            results[engine] = result = run(
                recipe, RunOptions(journal_dir=tmp_path / "journals", progress="none")
            )
            manifest = read_manifest(result.journal_dir)
            assert manifest is not None and manifest["target"].get("engine", "sglang") == engine
    sglang_set, vllm_set = results["sglang"], results["vllm"]
    assert sglang_set.config_id != vllm_set.config_id
    assert sglang_set.target.model_digest != vllm_set.target.model_digest
    for result in (sglang_set, vllm_set):
        assert result.summary.run_rows == result.summary.rows == 3 and result.summary.run_reused == 0
