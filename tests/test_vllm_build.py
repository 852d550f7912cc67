"""Builds through a vLLM-protocol server (the reference server's vLLM mode, ``--protocol vllm``;
the real vLLM is ``tests/real_vllm``): rows are the server's tokens (its ``/tokenize`` of each
conversation, its ``/v1/completions`` ids, as its ledger recorded them), faults are retried and
never rows, ``render: local`` (vLLM's chat path here) equals the server's, rollouts take their
history from the server's derender, the batch size comes from dev-mode ``/server_info``, and the
same recipe against the SGLang-mode server is another set reusing nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import eagle3_raw
from eagle3_raw.engines import identify
from eagle3_raw.errors import ServerMismatch
from eagle3_raw.journal.manifest import read_manifest
from eagle3_raw.launching.reference import launch_reference
from eagle3_raw.recipe import load_recipe
from eagle3_raw.reference.ledger import read_ledger
from eagle3_raw.run.build import RunOptions, run
from eagle3_raw.run.runtime import run_sync
from eagle3_raw.transport import new_session
from tests.helpers import CHATS, generations, reference_server, write_jsonl, write_prompts, write_recipe
from tests.reference.wire import request

pytestmark = pytest.mark.slow
VLLM = ("--protocol", "vllm", "--enable-scale-out")
GREEDY = {"max_new_tokens": 48, "temperature": 0.0}
LONG = {"max_new_tokens": 2048, "temperature": 0.0}  # the reference model ends its own turns


def _tokenize(url: str, chat: dict[str, Any]) -> list[int]:
    reply = request(url, "/tokenize", {**chat, "add_generation_prompt": True})
    assert reply.status == 200, reply.body
    tokens: list[int] = reply.json()["tokens"]
    return tokens


def _build(tmp_path: Path, url: str, journal: str = "j", **sections: Any) -> Any:
    recipe = write_recipe(tmp_path, endpoints=[url], **sections)
    return eagle3_raw.load(str(recipe), cache_dir=str(tmp_path / f"cache-{journal}"),
                           journal_dir=tmp_path / journal, progress="none")  # fmt: skip


def test_rows_are_the_vllm_servers_render_and_completions(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "prompts.jsonl", CHATS)
    with reference_server(tmp_path, *VLLM) as (server, ledger):
        rows = _build(tmp_path, server.url, turns="all", sampling=GREEDY)
        local = _build(
            tmp_path, server.url, "j-local", turns="all", sampling=GREEDY, model={"render": "local"}
        )
        answered = {g["rid"]: g for g in generations(ledger) if g["endpoint"] == "/v1/completions"}
    assert len(rows) >= len(CHATS) and local["input_ids"] == rows["input_ids"]
    for row in rows:
        (sent,) = [g for g in answered.values() if g["input_ids"] == row["input_ids"][: row["prompt_len"]]][
            :1
        ]
        assert row["input_ids"][row["prompt_len"] :] == sent["output_ids"], row["id"]
        assert (
            row["finish_reason"] == sent["finish_reason"]
            and row["meta"]["prompt_tokens"] == row["prompt_len"]
        )
        assert sent["sampling_params"]["seed"] == row["sampling_seed"]  # the row's seed, as vLLM's seed


def test_a_vllm_set_and_an_sglang_set_of_one_recipe_are_two_sets_sharing_no_generation(
    tmp_path: Path,
) -> None:
    write_jsonl(tmp_path / "prompts.jsonl", CHATS[:3])
    results = {}
    for engine, args in (("sglang", ()), ("vllm", VLLM)):
        with reference_server(tmp_path, *args) as (server, _):
            recipe = load_recipe(write_recipe(tmp_path, endpoints=[server.url], sampling=GREEDY))
            results[engine] = run(recipe, RunOptions(journal_dir=tmp_path / "j", progress="none"))
    sglang, vllm = results["sglang"], results["vllm"]
    assert sglang.config_id != vllm.config_id and vllm.target.engine == "vllm"
    assert vllm.summary.run_rows == 3 and vllm.summary.run_reused == 0
    manifest = read_manifest(vllm.journal_dir)
    assert manifest is not None and manifest["server"]["engine"] == "vllm"


def test_faults_are_retried_and_an_aborted_or_broken_answer_is_never_a_row(tmp_path: Path) -> None:
    write_prompts(tmp_path, 40)
    with reference_server(tmp_path, *VLLM) as (clean, _):
        expected = _build(tmp_path, clean.url, "j-clean", sampling=GREEDY)
    faults = ("--faults", "http500=0.15,http503=0.1,reset=0.1,abort=0.15", "--fault-seed", "5")
    with reference_server(tmp_path, *VLLM, *faults) as (server, ledger):
        rows = _build(tmp_path, server.url, sampling=GREEDY, server={"max_retries": 12})
        drawn = {line.get("fault") for line in read_ledger(ledger)}
    assert rows["input_ids"] == expected["input_ids"]  # the rows of the clean server, every one
    assert {"http500", "http503", "reset", "abort"} <= drawn and max(m["attempts"] for m in rows["meta"]) > 1


CONVERSATIONS = [
    {"id": "three-turns", "messages": [
        {"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4."}, {"role": "user", "content": "And times 3?"},
        {"role": "assistant", "content": "12."}]},
    {"id": "two-turns", "messages": [
        {"role": "user", "content": "Write a haiku about rivers."}, {"role": "assistant", "content": "..."},
        {"role": "user", "content": "Another one, about stars."}, {"role": "assistant", "content": "..."}]},
]  # fmt: skip


def test_a_rollouts_history_is_the_servers_derender_of_the_targets_turns(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "prompts.jsonl", CONVERSATIONS)
    kwargs = {"enable_thinking": True}
    parsers = ("--reasoning-parser", "qwen3", "--tool-call-parser", "hermes", "--enable-auto-tool-choice")
    with reference_server(tmp_path, *VLLM, *parsers) as (server, _):
        rows = _build(tmp_path, server.url, turns="rollout", rollout={"merge": "never"}, sampling=LONG,
                      model={"chat_template_kwargs": kwargs})  # fmt: skip
        by_turn = {(r["source_id"], r["turn"]): r for r in rows}
        reasoned = 0
        for conv in CONVERSATIONS:
            history: list[dict[str, Any]] = []
            cursor = 0
            for point in [i for i, m in enumerate(conv["messages"]) if m["role"] == "assistant"]:
                history += conv["messages"][cursor:point]
                cursor = point + 1
                chat = {"messages": history, "chat_template_kwargs": kwargs}
                row = by_turn[(conv["id"], point)]
                assert row["input_ids"][: row["prompt_len"]] == _tokenize(server.url, chat), (
                    conv["id"],
                    point,
                )
                output = row["input_ids"][row["prompt_len"] :]
                response = {
                    "request_id": "t",
                    "choices": [{"index": 0, "token_ids": output, "finish_reason": "stop"}],
                }
                split = request(server.url, "/v1/chat/completions/derender",
                                {"generate_response": response, "chat_request": chat}).json()  # fmt: skip
                message = split["choices"][0]["message"]
                turn: dict[str, Any] = {"role": "assistant", "content": message["content"] or ""}
                if message.get("reasoning"):
                    turn["reasoning"] = message["reasoning"]
                    reasoned += 1
                history = [*history, turn]
    assert reasoned  # the reference model thinks: the history carried its reasoning back


def test_the_batch_size_comes_from_dev_mode_server_info(tmp_path: Path) -> None:
    async def ask(url: str) -> Any:
        async with new_session(connect_timeout=10, api_key=None) as session:
            return await identify(session, url, 10, None)

    args = [*VLLM, "--max-num-seqs", "24"]
    with launch_reference(args=args) as plain:
        assert run_sync(lambda: ask(plain.url)).max_running_requests is None  # not in dev mode
    with launch_reference(args=args, env={"VLLM_SERVER_DEV_MODE": "1"}) as dev:
        identity = run_sync(lambda: ask(dev.url))
    assert identity.engine == "vllm" and identity.max_running_requests == 24
    assert identity.server_info["max_num_seqs"] == 24 and identity.label == "vLLM 0.32.0"


def test_a_rollout_on_a_vllm_without_its_scale_out_routes_stops_saying_which_flag(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "prompts.jsonl", CONVERSATIONS[:1])
    refused = pytest.raises(ServerMismatch, match=r"derender is not served .*--enable-scale-out")
    with reference_server(tmp_path, "--protocol", "vllm") as (server, _), refused:  # no --enable-scale-out
        _build(tmp_path, server.url, turns="rollout", rollout={"merge": "never"}, sampling=LONG)
