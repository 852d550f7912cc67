"""Rows built on the real SGLang are its tokens: every prompt is the real chat path's render of the
conversation (tools, content parts, reasoning in the history, names; thinking on and off), every
output is what the real ``/generate`` returns for that prompt, and ``render: local`` builds the same
set as ``render: server``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import eagle3_raw
from tests.helpers import write_jsonl, write_recipe
from tests.real_sglang.server import RealSGLang, post, tokenize_chat
from tests.test_rendering import ROWS

SAMPLING = {"max_new_tokens": 24, "temperature": 0.0}


def _chat(row: dict[str, Any], turn: int, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The chat request a client sends for the history before ``turn`` (straight from the source row)."""
    body: dict[str, Any] = {}
    if row.get("tools"):
        body["tools"] = row["tools"]
    if kwargs:
        body["chat_template_kwargs"] = kwargs
    return {"messages": row["messages"][:turn], **body}


@pytest.mark.parametrize("thinking", [True, False], ids=["thinking", "no-thinking"])
def test_rows_are_the_real_servers_render_and_generation_in_both_render_modes(
    tmp_path: Path, real_server: RealSGLang, real_model: Path, thinking: bool
) -> None:
    write_jsonl(tmp_path / "prompts.jsonl", ROWS)
    kwargs = {"enable_thinking": thinking}
    built = {}
    for render in ("server", "local"):
        model = {"tokenizer": str(real_model), "render": render, "chat_template_kwargs": kwargs}
        recipe = write_recipe(
            tmp_path, endpoints=[real_server.url], turns="all", model=model, sampling=SAMPLING
        )
        built[render] = eagle3_raw.load(
            str(recipe), cache_dir=str(tmp_path / f"cache-{render}"), journal_dir=tmp_path / f"j-{render}",
            progress="none",
        )  # fmt: skip
    rows, by_id = built["server"], {row["id"]: row for row in ROWS}
    assert sorted(set(rows["source_id"])) == sorted(by_id)  # no conversation skipped
    for row in rows:
        chat = _chat(by_id[row["source_id"]], row["turn"], kwargs)
        prompt = tokenize_chat(real_server.url, **chat)
        assert row["input_ids"][: row["prompt_len"]] == prompt, row["id"]
        again = post(real_server.url, "/generate", {"input_ids": prompt, "sampling_params": SAMPLING})
        assert row["input_ids"][row["prompt_len"] :] == again["output_ids"], row["id"]
        assert row["finish_reason"] == again["meta_info"]["finish_reason"]["type"]
    assert built["local"]["id"] == rows["id"] and built["local"]["input_ids"] == rows["input_ids"]
