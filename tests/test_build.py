"""The main path end to end: recipe -> reference server -> journal -> datasets cache (issue 3).

Every check is made against the reference server's ledger: what the server really received and
returned, not what eagle3_raw says it did.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import datasets
import orjson
import pytest

import eagle3_raw
from eagle3_raw.errors import FatalError, RecipeError, ServerMismatch, ServerUnreachable
from eagle3_raw.journal import Journal
from eagle3_raw.recipe import load_recipe
from eagle3_raw.reference.model_files import load_tokenizer
from eagle3_raw.resources import reference_model_dir
from eagle3_raw.run.build import journal_dir_for
from eagle3_raw.run.plan import derive_seed
from tests.helpers import CHATS, generations, reference_server, rid_row_id, write_jsonl, write_recipe
from tests.support.pace import scaled

EOS = 6139


def _load(recipe: Path, tmp_path: Path, **overrides: Any) -> datasets.Dataset:
    return eagle3_raw.load(
        str(recipe),
        cache_dir=str(tmp_path / "cache"),
        journal_dir=tmp_path / "journals",
        progress="none",
        **overrides,
    )


@pytest.fixture()
def chats(tmp_path: Path) -> Path:
    write_jsonl(tmp_path / "prompts.jsonl", CHATS)
    return tmp_path


@pytest.mark.slow
def test_rows_are_exactly_the_ids_sent_and_returned(chats: Path) -> None:
    with reference_server(chats) as (server, ledger):
        recipe = write_recipe(chats, endpoints=[server.url], turns="all", sampling={"samples_per_prompt": 2})
        rows = _load(recipe, chats)
    sent = {rid_row_id(g["rid"]): g for g in generations(ledger)}
    assert len(rows) == len(sent) > 0
    tokenizer = load_tokenizer()
    non_canonical = 0
    for row in rows:
        g = sent[row["id"]]
        prompt, output = g["input_ids"], g["output_ids"]
        assert row["input_ids"] == prompt + output
        assert row["prompt_len"] == len(prompt)
        assert row["loss_mask"] == [0] * len(prompt) + [1] * len(output)
        assert row["finish_reason"] == g["finish_reason"]["type"]
        if row["finish_reason"] == "stop":
            assert row["input_ids"][-1] == EOS
        non_canonical += tokenizer.encode(tokenizer.decode(output), add_special_tokens=False) != output
    # the reference emits non-canonical splits: any decode/re-encode on the way would have failed this
    assert non_canonical > len(rows) // 3


@pytest.mark.slow
def test_turns_samples_and_seeds(chats: Path) -> None:
    with reference_server(chats) as (server, ledger):
        recipe = write_recipe(chats, endpoints=[server.url], turns="all", sampling={"samples_per_prompt": 3})
        rows = _load(recipe, chats)
    by_id = {row["id"]: row for row in rows}
    # share-1 has assistant turn 1 and a final generation point at 3; tools-1 at 1 and 4
    assert {(r["source_id"], r["turn"]) for r in rows} >= {
        ("share-1", 1),
        ("share-1", 3),
        ("tools-1", 1),
        ("tools-1", 4),
    }
    for source_id, turn in [("plain-1", 1), ("share-1", 3)]:
        samples = [by_id[f"{source_id}:{turn}:{s}"] for s in range(3)]
        assert len({tuple(r["input_ids"]) for r in samples}) == 3
        assert [r["sampling_seed"] for r in samples] == [derive_seed(1, source_id, turn, s) for s in range(3)]
    seeds = {rid_row_id(g["rid"]): g["sampling_params"]["sampling_seed"] for g in generations(ledger)}
    assert all(seeds[row["id"]] == row["sampling_seed"] for row in rows)
    assert all(g["sampling_params"]["max_new_tokens"] == 64 for g in generations(ledger))


@pytest.mark.slow
def test_thinking_and_tool_calls_come_through_untouched(chats: Path) -> None:
    with reference_server(chats) as (server, _ledger):
        recipe = write_recipe(chats, endpoints=[server.url], sampling={"max_new_tokens": 1024})
        rows = _load(recipe, chats)
    tokenizer = load_tokenizer()
    tools_row = next(r for r in rows if r["source_id"] == "tools-1")
    prompt_text = tokenizer.decode(tools_row["input_ids"][: tools_row["prompt_len"]])
    assert (
        "get_weather" in prompt_text
        and "<tool_call>" in prompt_text
        and "The user wants the weather" in prompt_text
    )
    special = {
        tokenizer.convert_tokens_to_ids(t) for t in ("<think>", "</think>", "<tool_call>", "</tool_call>")
    }
    generated = [tid for r in rows for tid in r["input_ids"][r["prompt_len"] :]]
    assert special & set(generated), "no think/tool-call token reached a row"


@pytest.mark.slow
def test_malformed_rows_are_reported_and_the_run_goes_on(tmp_path: Path) -> None:
    bad = [
        {"id": "no-messages", "title": "x"},
        {"id": "bad-role", "messages": [{"role": "bot", "content": "hi"}]},
        {"id": "non-string", "messages": [{"role": "user", "content": 42}]},
        {"id": "empty", "messages": []},
        {"id": "bad-tools", "tools": [{"type": "function"}], "messages": [{"role": "user", "content": "x"}]},
    ]
    write_jsonl(tmp_path / "prompts.jsonl", [CHATS[0], *bad, CHATS[1]])
    with reference_server(tmp_path) as (server, _ledger):
        recipe = write_recipe(tmp_path, endpoints=[server.url])
        rows = _load(recipe, tmp_path)
        journal = Journal.read_dir(journal_dir_for(load_recipe(recipe), tmp_path / "journals"))
    assert sorted(rows["source_id"]) == ["plain-1", "plain-2"]
    failures = {f["id"]: f for f in journal.failures()}
    assert set(failures) == {row["id"] for row in bad}
    assert all(f["kind"] == "skipped" for f in failures.values())
    assert "role" in failures["bad-role"]["reason"] and "content" in failures["non-string"]["reason"]
    assert journal.stats()["failures"]["skipped"]


@pytest.mark.parametrize(
    ("sampling", "message"),
    [
        ({"seed_value": 3}, "not an SGLang sampling key"),
        ({"top_p": 0}, r"\(0, 1\]"),
        ({"n": 2}, "samples_per_prompt"),
    ],
)
def test_bad_recipe_is_refused_before_any_request(
    chats: Path, sampling: dict[str, Any], message: str
) -> None:
    with reference_server(chats) as (server, ledger):
        recipe = write_recipe(chats, endpoints=[server.url], sampling=sampling)
        with pytest.raises(RecipeError, match=message):
            _load(recipe, chats)
    assert generations(ledger) == []


def test_unreachable_server_fails_fast_naming_the_url(chats: Path) -> None:
    url = "http://127.0.0.1:9"  # discard port: nothing listens
    recipe = write_recipe(chats, endpoints=[url])
    started = time.monotonic()
    with pytest.raises(ServerUnreachable, match=r"127\.0\.0\.1:9"):
        _load(recipe, chats)
    assert time.monotonic() - started < scaled(20)


@pytest.mark.slow
def test_tokenizer_mismatch_is_refused_before_any_request(chats: Path) -> None:
    other = chats / "other-tokenizer"
    shutil.copytree(reference_model_dir(), other)
    spec = orjson.loads((other / "tokenizer.json").read_bytes())
    vocab = spec["model"]["vocab"]
    a, b = "Ġthe", "Ġand"
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (other / "tokenizer.json").write_bytes(orjson.dumps(spec))
    with reference_server(chats) as (server, ledger):
        recipe = write_recipe(chats, endpoints=[server.url], model={"tokenizer": str(other)})
        with pytest.raises(ServerMismatch, match="tokenizes differently"):
            _load(recipe, chats)
    assert generations(ledger) == []


@pytest.mark.slow
def test_second_load_sends_nothing_and_a_new_temperature_builds_anew(chats: Path) -> None:
    with reference_server(chats) as (server, ledger):
        recipe = write_recipe(chats, endpoints=[server.url])
        first = _load(recipe, chats)
        sent = len(generations(ledger))
    # the server is gone: a second load can only come from the datasets cache
    again = _load(recipe, chats)
    assert again["input_ids"] == first["input_ids"] and again.cache_files == first.cache_files
    with reference_server(chats) as (server, ledger2):
        hotter = _load(recipe, chats, **{"sampling.temperature": 1.0, "server.endpoints": [server.url]})
    assert len(generations(ledger2)) == sent == len(hotter)
    assert hotter.cache_files != first.cache_files


@pytest.mark.slow
def test_load_dataset_works_from_any_working_directory(chats: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    elsewhere = chats / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "stray.csv").write_text("a,b\n1,2\n")
    monkeypatch.chdir(elsewhere)
    with reference_server(chats) as (server, _ledger):
        recipe = write_recipe(chats, endpoints=[server.url])
        rows = datasets.load_dataset(
            "eagle3_raw", recipe=str(recipe), split="train", cache_dir=str(chats / "cache"),
            journal_dir=chats / "journals", progress="none",
        )  # fmt: skip
    assert rows.column_names[:5] == ["id", "source_id", "turn", "sample", "input_ids"]
    assert len(rows) == len(CHATS)


@pytest.mark.slow
def test_too_long_prompt_is_skipped_never_sent(tmp_path: Path) -> None:
    long_prompt = {"id": "long", "prompt": "word " * 400}
    write_jsonl(tmp_path / "prompts.jsonl", [CHATS[0], long_prompt])
    with reference_server(tmp_path, "--context-length", "256") as (server, ledger):
        recipe = write_recipe(tmp_path, endpoints=[server.url])
        rows = _load(recipe, tmp_path)
    assert rows["source_id"] == ["plain-1"]
    assert all(rid_row_id(g["rid"]) != "long:1:0" for g in generations(ledger))
    # a row near the limit gets max_new_tokens lowered to fit the context rather than a 400
    assert all(len(r) <= 256 for r in rows["input_ids"])


@pytest.mark.slow
def test_on_truncation_drop(chats: Path) -> None:
    with reference_server(chats) as (server, _ledger):
        sampling = {"max_new_tokens": 120, "samples_per_prompt": 4}
        recipe = write_recipe(chats, endpoints=[server.url], on_truncation="drop", sampling=sampling)
        rows = _load(recipe, chats)
        kept = _load(recipe, chats, on_truncation="keep")
        with pytest.raises(FatalError, match=r"produced no rows: 16 generated \(all ended on length"):
            _load(recipe, chats, **{"sampling.max_new_tokens": 2})
    assert "length" not in rows["finish_reason"] and len(rows) > 0
    assert "length" in kept["finish_reason"] and len(kept) > len(rows)


@pytest.mark.slow
def test_api_key_comes_from_the_environment_and_is_never_written(
    chats: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "sk-test-0123456789abcdef"
    recipe = write_recipe(chats, endpoints=[], server={"launch": "reference", "api_key_env": "E3R_TEST_KEY"})
    with pytest.raises(RecipeError, match="E3R_TEST_KEY"):
        _load(recipe, chats)
    monkeypatch.setenv("E3R_TEST_KEY", secret)
    rows = _load(recipe, chats)
    assert len(rows) == len(CHATS)
    written = [p for p in chats.rglob("*") if p.is_file()]
    assert written and not [p for p in written if secret.encode() in p.read_bytes()]


def test_a_key_written_where_its_variable_name_goes_is_never_echoed(tmp_path: Path) -> None:
    secret = "sk-test-0123456789abcdef"
    write_jsonl(tmp_path / "prompts.jsonl", CHATS)
    recipe = write_recipe(tmp_path, endpoints=[], server={"launch": "reference", "api_key_env": secret})
    with pytest.raises(RecipeError) as info:
        _load(recipe, tmp_path)
    assert secret not in str(info.value) and "NAME of a variable holding the key" in str(info.value)


def test_a_server_with_an_api_key_refuses_a_recipe_without_one(chats: Path) -> None:
    with reference_server(chats, "--api-key", "right-key") as (server, ledger):
        recipe = write_recipe(chats, endpoints=[server.url])
        with pytest.raises(FatalError, match=r"401.*api_key_env"):
            _load(recipe, chats)
    assert generations(ledger) == []


@pytest.mark.slow
def test_retry_failed_rebuilds_the_cached_set(chats: Path) -> None:
    with reference_server(chats, "--faults", "http500=0.5", "--fault-seed", "1") as (server, _):
        sampling = {"samples_per_prompt": 4}
        recipe = write_recipe(chats, endpoints=[server.url], server={"max_retries": 0}, sampling=sampling)
        partial = _load(recipe, chats)
    with reference_server(chats) as (server, ledger):
        healthy = {"server.endpoints": [server.url]}
        assert len(_load(recipe, chats, **healthy)) == len(partial)  # cached; failures not retried
        assert generations(ledger) == []
        full = _load(recipe, chats, retry_failed=True, **healthy)
    assert len(partial) < len(full) == 4 * len(CHATS)
    assert set(partial["id"]) < set(full["id"])


@pytest.mark.slow
def test_no_rows_error_names_the_skipped_rows_and_why(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "prompts.jsonl", [{"id": "bad-1", "title": "no messages here"}])
    with reference_server(tmp_path) as (server, ledger):
        recipe = write_recipe(tmp_path, endpoints=[server.url])
        with pytest.raises(FatalError) as info:
            _load(recipe, tmp_path)
    assert generations(ledger) == []
    message = str(info.value)
    assert "1 skipped" in message
    assert "row 'bad-1'" in message and "messages" in message.split("bad-1", 1)[1]


@pytest.mark.slow
def test_no_rows_error_lists_the_rows_behind_each_reason(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "prompts.jsonl", [{"id": f"long-{i}", "prompt": "word " * 400} for i in range(5)])
    with (
        reference_server(tmp_path, "--context-length", "256") as (server, ledger),
        pytest.raises(FatalError) as info,
    ):
        _load(write_recipe(tmp_path, endpoints=[server.url]), tmp_path)
    assert generations(ledger) == []
    message = str(info.value)
    assert "5 skipped" in message and "(rows long-0:1:0, long-1:1:0, long-2:1:0, ...)" in message, message
