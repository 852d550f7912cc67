"""Rollouts on the real vLLM: each later turn's prompt is the real ``/tokenize`` of a history whose
assistant turns are the real parsers' split (``/v1/chat/completions/derender``) of what the target
itself generated before; and the engine's split of a parser-level text is the real parsers' own.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import eagle3_raw
from eagle3_raw.serving import TurnToSplit
from eagle3_raw.transport import new_session
from eagle3_raw.vllm.engine import VLLM
from tests.helpers import write_jsonl, write_recipe
from tests.real_vllm.model import EOS_ID
from tests.real_vllm.server import RealVLLM
from tests.real_vllm.test_routes import WEATHER, send

KWARGS = {"enable_thinking": True}
CONVERSATIONS = [
    {"id": "three-turns", "messages": [
        {"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Sunny."}, {"role": "user", "content": "Tomorrow?"},
        {"role": "assistant", "content": "Rain."}]},
    {"id": "two-turns", "messages": [
        {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3+3?"}, {"role": "assistant", "content": "6"}]},
]  # fmt: skip


def _split(server: RealVLLM, output_ids: list[int], chat: dict[str, Any]) -> dict[str, Any]:
    """The real parsers' assistant message for ``output_ids`` answering ``chat`` (asked here, by hand)."""
    response = {
        "request_id": "test",
        "choices": [{"index": 0, "token_ids": output_ids, "finish_reason": "length"}],
    }
    reply = send(
        server, "/v1/chat/completions/derender", {"generate_response": response, "chat_request": chat}
    )
    assert reply.status == 200, reply.body
    message = reply.body["choices"][0]["message"]
    history: dict[str, Any] = {"role": "assistant", "content": message["content"] or ""}
    if message.get("reasoning"):
        history["reasoning"] = message["reasoning"]
    return history


def test_each_later_turn_is_prompted_with_the_real_parsers_split_of_the_targets_own_turns(
    tmp_path: Path, real_vllm: RealVLLM, vllm_model: Path
) -> None:
    write_jsonl(tmp_path / "prompts.jsonl", CONVERSATIONS)
    recipe = write_recipe(
        tmp_path, endpoints=[real_vllm.url], turns="rollout", rollout={"merge": "never"},
        model={"tokenizer": str(vllm_model), "chat_template_kwargs": KWARGS},
        # six ids of the random model, then its EOS (a turn cut at max_new_tokens would end the rollout)
        sampling={"max_new_tokens": 16, "temperature": 0.0, "min_new_tokens": 6,
                  "logit_bias": {str(EOS_ID): 100}},
    )  # fmt: skip
    rows = eagle3_raw.load(str(recipe), cache_dir=str(tmp_path / "cache"), journal_dir=tmp_path / "j",
                           progress="none")  # fmt: skip
    by_turn = {(r["source_id"], r["turn"]): r for r in rows}
    for conv in CONVERSATIONS:
        points = [i for i, m in enumerate(conv["messages"]) if m["role"] == "assistant"]
        history: list[dict[str, Any]] = []
        cursor = 0
        for point in points:
            history += conv["messages"][cursor:point]  # the source's messages up to the point ...
            cursor = point + 1  # ... its assistant message there is the target's
            chat = {"messages": history, "chat_template_kwargs": KWARGS}
            prompt = send(real_vllm, "/tokenize", {**chat, "add_generation_prompt": True}).body["tokens"]
            row = by_turn[(conv["id"], point)]
            assert row["kind"] == "rollout" and row["input_ids"][: row["prompt_len"]] == prompt, (
                conv["id"],
                point,
            )
            assert row["finish_reason"] == "stop"
            history = [*history, _split(real_vllm, row["input_ids"][row["prompt_len"] :], chat)]
        assert len(points) == sum(1 for r in rows if r["source_id"] == conv["id"])


def test_the_engines_split_of_a_turn_is_the_real_reasoning_and_tool_call_parsers(real_vllm: RealVLLM) -> None:
    text = ('<think>\nLet me look.\n</think>\n\nChecking.\n<tool_call>\n'
            '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>')  # fmt: skip
    ids = send(real_vllm, "/tokenize", {"prompt": text, "add_special_tokens": False}).body["tokens"]
    chat = {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER]}

    async def split() -> Any:
        async with new_session(connect_timeout=30, api_key=None) as session:
            turn = TurnToSplit(ids, None, True, "stop", chat)
            return await VLLM.split_turn(session, real_vllm.url, turn, {}, 120)

    parsed = asyncio.run(split())
    assert parsed.reasoning == "\nLet me look.\n" and parsed.content.strip() == "Checking."
    (call,) = parsed.calls
    assert call.name == "get_weather" and json.loads(call.parameters) == {"city": "Paris"}
