"""prompts.py: real files (tests/data and generated ones), the real `datasets` Hub path, no mocks."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson
import pytest

from eagle3_raw.errors import PromptFormatError, SourceError
from eagle3_raw.recipe import Recipe, parse_recipe
from eagle3_raw.rows import PassOver, id_hash
from eagle3_raw.source.prompts import Conversation, content_id, iter_conversations, shuffled_positions

try:
    from tests.support.hub_server import HubServer, hub, hub_server
except ModuleNotFoundError:  # `tests` is a package only when the repo root is on sys.path
    from support.hub_server import HubServer, hub, hub_server  # type: ignore[no-redef]  # noqa: F401

DATA = Path(__file__).parent / "data"


def make_recipe(base_dir: Path = DATA, **prompts: Any) -> Recipe:
    raw = {
        "name": "t",
        "prompts": prompts,
        "server": {"launch": "reference"},
        "sampling": {"max_new_tokens": 8},
    }
    return parse_recipe(raw, base_dir=base_dir)


def items(**prompts: Any) -> list[Conversation | PromptFormatError]:
    return list(iter_conversations(make_recipe(**prompts)))


def outcome(item: Conversation | PromptFormatError) -> str:
    return f"error {item.row_id}" if isinstance(item, PromptFormatError) else item.source_id


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    return path


def write_parquet(path: Path, rows: list[dict[str, Any]], row_group_size: int = 1024) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=row_group_size)
    return path


def prompt_rows(n: int, start: int = 0) -> list[dict[str, Any]]:
    return [{"id": f"p{i}", "prompt": f"prompt number {i}"} for i in range(start, start + n)]


# --- formats ---------------------------------------------------------------------------------


def test_sharegpt_rows_become_openai_messages_and_malformed_rows_keep_their_place() -> None:
    got = items(source="sharegpt.jsonl", format="sharegpt", id_column="id")
    assert [outcome(i) for i in got] == [
        "sg-1", "sg-2", "sg-3", "error sg-bad-role", "error sg-empty", "sg-4", "error sg-bad-value", "sg-5",
    ]  # fmt: skip
    assert [i.index for i in got] == list(range(8))
    sg2, sg3 = got[1], got[2]
    assert isinstance(sg2, Conversation) and isinstance(sg3, Conversation)
    assert sg2.messages[0] == {"role": "system", "content": "Be brief."}
    assert [m["role"] for m in sg2.messages] == ["system", "user", "assistant", "user", "assistant"]
    assert [m["role"] for m in sg3.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert sg3.tools is None


def test_sharegpt_conversations_of_role_content_turns_as_specforge_writes_them(tmp_path: Path) -> None:
    turns = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello", "reasoning_content": "r"},
    ]
    bad = [{"role": "wizard", "content": "x"}]
    rows = [{"id": "sf-1", "conversations": turns}, {"id": "sf-bad", "conversations": bad}]
    write_jsonl(tmp_path / "sf.jsonl", rows)
    for fmt in ("auto", "sharegpt"):
        good, broken = items(source=str(tmp_path / "sf.jsonl"), format=fmt, id_column="id")
        assert isinstance(good, Conversation) and list(good.messages) == turns
        assert isinstance(
            broken, PromptFormatError
        ) and "conversations[0].role: unknown role 'wizard'" in str(broken)


def test_openai_rows_keep_tools_tool_calls_and_reasoning() -> None:
    by_id = {outcome(i): i for i in items(source="openai.jsonl", format="openai", id_column="id")}
    reasoning = by_id["oa-1"]
    assert isinstance(reasoning, Conversation)
    assert reasoning.messages[2]["reasoning_content"] == "7 has no divisors but 1 and 7."
    tools = by_id["oa-tools"]
    assert isinstance(tools, Conversation) and tools.tools is not None
    assert tools.tools[0]["function"]["name"] == "get_weather"
    call = tools.messages[1]
    assert call["content"] == ""
    assert call["tool_calls"] == [
        {
            "type": "function",
            "id": "call_1",
            "function": {"name": "get_weather", "arguments": {"city": "Oslo"}},
        }
    ]
    assert tools.messages[2] == {"role": "tool", "content": '{"temp": 3}', "tool_call_id": "call_1"}


def test_openai_content_parts_are_kept_as_a_client_sends_them_and_shorthand_tools_are_wrapped() -> None:
    by_id = {outcome(i): i for i in items(source="openai.jsonl", id_column="id")}
    parts, shorthand = by_id["oa-parts"], by_id["oa-shorthand-tool"]
    assert isinstance(parts, Conversation) and isinstance(shorthand, Conversation)
    # the chat path joins them (or hands the list to templates that loop over parts), not the reader
    assert parts.messages[0]["content"] == [
        {"type": "text", "text": "First part."}, {"type": "text", "text": "Second part."}
    ]  # fmt: skip
    assert shorthand.tools == (
        {
            "type": "function",
            "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}},
        },
    )


@pytest.mark.parametrize(
    ("row_id", "fragment"),
    [
        ("oa-no-messages", "row 'oa-no-messages' messages: missing"),
        ("oa-bad-tool", "row 'oa-bad-tool' tools[0].function.name: expected a non-empty string, got null"),
        ("oa-bad-call", "row 'oa-bad-call' messages[1].tool_calls[0].function.arguments: not valid JSON"),
        ("oa-null-content", "row 'oa-null-content' messages[0].content: expected a string"),
        ("oa-image", "row 'oa-image' messages[0].content[0]: expected a {'type': 'text', 'text': ...} part"),
    ],
)
def test_each_malformed_openai_row_is_reported_with_its_id_and_field(row_id: str, fragment: str) -> None:
    got = items(source="openai.jsonl", format="openai", id_column="id")
    errors = {i.row_id: i for i in got if isinstance(i, PromptFormatError)}
    assert fragment in str(errors[row_id])
    assert "openai.jsonl line" in str(errors[row_id])
    assert [outcome(i) for i in got][-2:] == ["oa-shorthand-tool", "oa-2"]


@pytest.mark.parametrize(
    ("message", "fragment"),
    [
        ({"role": "bot", "content": "x"}, "messages[0].role: unknown role 'bot'"),
        ({"content": "x"}, "messages[0].role: expected a role string, got null"),
        ({"role": "user", "content": 7}, "messages[0].content: expected a string"),
        ({"role": "assistant", "content": None}, "messages[0].content: expected a string"),
        ({"role": "user", "content": "x", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]},
         "messages[0].tool_calls: only assistant messages have tool calls"),
        ({"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": [1]}}]},
         "messages[0].tool_calls[0].function.arguments: expected an object"),
        ({"role": "assistant", "content": "", "tool_calls": [{"name": "f", "arguments": {}}]},
         "messages[0].tool_calls[0]: expected {'type': 'function'"),
        ({"role": "assistant", "content": "x", "reasoning_content": 1}, "messages[0].reasoning_content"),
        ("just text", "messages[0]: expected an object, got a string"),
    ],
)  # fmt: skip
def test_message_validation(tmp_path: Path, message: Any, fragment: str) -> None:
    rows = [
        {"messages": [{"role": "user", "content": "before"}]},
        {"messages": [message]},
        {"prompt": "after"},
    ]
    got = items(source=str(write_jsonl(tmp_path / "m.jsonl", rows)))
    assert isinstance(got[0], Conversation) and isinstance(got[2], Conversation)
    error = got[1]
    assert isinstance(error, PromptFormatError) and error.row_id == "#1" and error.index == 1
    assert f"row #1 {fragment}" in str(error)


@pytest.mark.parametrize(
    ("tools", "fragment"),
    [
        ({"type": "function"}, "tools: expected a list of tool definitions"),
        ("[not json", "tools: not valid JSON"),
        ([{"type": "retrieval", "function": {"name": "x"}}], "tools[0].type: expected 'function'"),
        (
            [{"type": "function", "function": {"name": "x", "parameters": "str"}}],
            "tools[0].function.parameters",
        ),
        ([3], "tools[0]: expected an object, got int"),
    ],
)
def test_tool_definition_validation(tmp_path: Path, tools: Any, fragment: str) -> None:
    rows = [{"id": "t", "tools": tools, "messages": [{"role": "user", "content": "hi"}]}]
    [error] = items(source=str(write_jsonl(tmp_path / "t.jsonl", rows)), id_column="id")
    assert isinstance(error, PromptFormatError) and error.row_id == "t"
    assert f"row 't' {fragment}" in str(error)


def test_tools_as_json_string_and_empty_tools(tmp_path: Path) -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    rows = [
        {"tools": orjson.dumps([tool]).decode(), "messages": [{"role": "user", "content": "a"}]},
        {"tools": [], "messages": [{"role": "user", "content": "b"}]},
    ]
    first, second = items(source=str(write_jsonl(tmp_path / "t.jsonl", rows)))
    assert isinstance(first, Conversation) and first.tools == (tool,)
    assert isinstance(second, Conversation) and second.tools is None


def test_plain_prompts_from_a_json_array_with_integer_ids() -> None:
    got = items(source="prompts.json", format="prompt", id_column="id")
    assert [outcome(i) for i in got] == ["1", "2", "error 3", "4"]
    second = got[1]
    assert isinstance(second, Conversation)
    assert second.messages == ({"role": "system", "content": "Answer in French."},
                               {"role": "user", "content": "List three fruits."})  # fmt: skip
    assert "row '3' prompt: expected a non-empty string" in str(got[2])


def test_json_object_with_data_and_json_lines_named_json(tmp_path: Path) -> None:
    rows = prompt_rows(3)
    (tmp_path / "wrapped.json").write_bytes(orjson.dumps({"data": rows}))
    write_jsonl(tmp_path / "lines.json", rows)
    for name in ("wrapped.json", "lines.json"):
        got = list(iter_conversations(make_recipe(tmp_path, source=name, id_column="id")))
        assert [outcome(i) for i in got] == ["p0", "p1", "p2"]
    (tmp_path / "scalar.json").write_bytes(b'{"rows": []}')
    with pytest.raises(SourceError, match=r"scalar\.json"):
        iter_conversations(make_recipe(tmp_path, source="scalar.json"))


def test_auto_detects_the_format_per_row() -> None:
    got = items(source="mixed.jsonl")
    texts = [i.messages[-1]["content"] if isinstance(i, Conversation) else None for i in got]
    assert texts == ["Hello from ShareGPT.", "Hello from OpenAI.", "Hello from a plain prompt.", None,
                     "Nulls mean absent."]  # fmt: skip
    assert "row #3 messages: missing: expected a 'messages', 'conversations' or 'prompt' field" in str(got[3])


def test_explicit_format_ignores_other_shapes() -> None:
    got = items(source="mixed.jsonl", format="sharegpt")
    assert [isinstance(i, Conversation) for i in got] == [True, False, False, False, False]
    assert "row #1 conversations: missing" in str(got[1])


def test_unparseable_lines_and_non_object_rows_are_row_errors(tmp_path: Path) -> None:
    path = tmp_path / "broken.jsonl"
    path.write_text('{"prompt": "a"}\n\n{oops\n[1, 2]\n   \n{"prompt": "b"}\n')
    got = list(iter_conversations(make_recipe(tmp_path, source="broken.jsonl")))
    assert [outcome(i) for i in got][1:3] == ["error #1", "error #2"]
    assert "row #1: not valid JSON" in str(got[1]) and "broken.jsonl line 3" in str(got[1])
    assert "row #2: expected an object, got a list" in str(got[2])
    assert isinstance(got[3], Conversation) and got[3].index == 3


# --- ids -------------------------------------------------------------------------------------


def test_content_hash_ids_do_not_depend_on_the_format(tmp_path: Path) -> None:
    rows = [
        {"conversations": [{"from": "human", "value": "same"}, {"from": "gpt", "value": "answer"}]},
        {"messages": [{"role": "user", "content": "same"}, {"role": "assistant", "content": "answer"}]},
        {"prompt": "same"},
    ]
    first, second, third = items(source=str(write_jsonl(tmp_path / "h.jsonl", rows)))
    assert isinstance(first, Conversation) and isinstance(third, Conversation)
    assert first.source_id == content_id(first.messages, None)
    assert len(first.source_id) == 16 and int(first.source_id, 16) >= 0
    assert isinstance(second, PromptFormatError) and second.row_id == first.source_id
    assert "duplicate id, first seen at row 0" in str(second)
    assert third.source_id != first.source_id


def test_duplicate_ids_from_the_id_column(tmp_path: Path) -> None:
    rows = [{"id": "a", "prompt": "x"}, {"id": "b", "prompt": "y"}, {"id": "a", "prompt": "z"}]
    got = items(source=str(write_jsonl(tmp_path / "d.jsonl", rows)), id_column="id")
    assert [outcome(i) for i in got] == ["a", "b", "error a"]
    assert "row 'a': duplicate id, first seen at row 0 (d.jsonl line 3)" in str(got[2])


@pytest.mark.parametrize("shuffle_seed", [None, 3])
def test_rows_a_resume_passes_over_are_never_parsed_and_their_ids_still_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shuffle_seed: int | None
) -> None:
    """A resume's done source rows (issue 26) are left out before parsing; a later row repeating
    the id of one of them is still a duplicate, naming it; the other rows keep their indices."""
    import numpy as np

    import eagle3_raw.source.prompts as prompts_module

    rows = [*prompt_rows(8), {"id": "p3", "prompt": "a second p3"}, *prompt_rows(2, start=8)]
    source = str(write_jsonl(tmp_path / "r.jsonl", rows))
    recipe = make_recipe(source=source, id_column="id", shuffle_seed=shuffle_seed)
    every = list(iter_conversations(recipe))
    ids = {item.index: item.source_id if isinstance(item, Conversation) else item.row_id for item in every}
    passed_indices = np.arange(6, dtype=np.int64)
    hashes = np.array([id_hash(ids[i]) for i in range(6)], np.uint64)
    parsed: list[bytes] = []
    real_parse = prompts_module._parse_line
    monkeypatch.setattr(prompts_module, "_parse_line", lambda line: parsed.append(line) or real_parse(line))
    got = list(iter_conversations(recipe, passed=PassOver.of(passed_indices, hashes)))
    assert [i.index for i in got] == [i.index for i in every if i.index >= 6]
    assert [outcome(i) for i in got] == [outcome(i) for i in every if i.index >= 6]
    order = shuffled_positions(len(rows), shuffle_seed) if shuffle_seed is not None else range(len(rows))
    passed_rows = [rows[order[i]] for i in range(6)]
    parsed_rows = [orjson.loads(line) for line in parsed[1:]]  # the first: the source check reads row 0
    assert parsed[0] == orjson.dumps(rows[0]) + b"\n"
    assert not [r for r in parsed_rows if r in passed_rows]
    if shuffle_seed is None:  # in file order, the second p3 is row 8: its twin, row 3, was passed over
        assert "row 'p3': duplicate id, first seen at row 3" in str(got[2])


@pytest.mark.parametrize("value", [None, "", 1.5, True, ["x"]])
def test_a_bad_or_missing_id_is_a_format_error(tmp_path: Path, value: Any) -> None:
    rows = [{"id": "ok", "prompt": "y"}, {"prompt": "x"} if value is None else {"id": value, "prompt": "x"}]
    good, bad = items(source=str(write_jsonl(tmp_path / "i.jsonl", rows)), id_column="id")
    assert isinstance(bad, PromptFormatError) and bad.row_id == "#1"
    assert "row #1 id: expected a non-empty string or an integer id" in str(bad)
    assert isinstance(good, Conversation) and good.source_id == "ok"


# --- sources ---------------------------------------------------------------------------------


def test_parquet_file_and_sorted_folder_of_mixed_files(tmp_path: Path) -> None:
    folder = tmp_path / "src"
    folder.mkdir()
    write_parquet(folder / "b.parquet", prompt_rows(3, start=3), row_group_size=2)
    write_jsonl(folder / "a.jsonl", prompt_rows(3))
    (folder / "c.json").write_bytes(orjson.dumps(prompt_rows(2, start=6)))
    (folder / "README.md").write_text("not data")
    (folder / ".hidden.jsonl").write_text('{"prompt": "hidden"}\n')
    got = list(iter_conversations(make_recipe(tmp_path, source="src", id_column="id")))
    assert [outcome(i) for i in got] == [f"p{i}" for i in range(8)]
    assert [i.index for i in got] == list(range(8))
    single = list(iter_conversations(make_recipe(tmp_path, source="src/b.parquet", id_column="id")))
    assert [outcome(i) for i in single] == ["p3", "p4", "p5"]


def test_parquet_nulls_from_unified_structs_are_absent(tmp_path: Path) -> None:
    rows = [
        {"messages": [{"role": "user", "content": "a", "name": "ann"}]},
        {"messages": [{"role": "user", "content": "b", "tool_call_id": None}]},
    ]
    first, second = items(source=str(write_parquet(tmp_path / "n.parquet", rows)))
    assert isinstance(first, Conversation) and isinstance(second, Conversation)
    assert first.messages == ({"role": "user", "content": "a", "name": "ann"},)
    assert second.messages == ({"role": "user", "content": "b"},)


def test_limit_counts_source_rows_malformed_included() -> None:
    got = items(source="sharegpt.jsonl", id_column="id", limit=5)
    assert [outcome(i) for i in got] == ["sg-1", "sg-2", "sg-3", "error sg-bad-role", "error sg-empty"]


def test_shuffle_is_a_deterministic_permutation(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "s.jsonl", prompt_rows(50))

    def order(**extra: Any) -> list[str]:
        got = iter_conversations(make_recipe(tmp_path, source="s.jsonl", id_column="id", **extra))
        return [outcome(i) for i in got]

    plain, seven, eight = order(), order(shuffle_seed=7), order(shuffle_seed=8)
    assert seven == order(shuffle_seed=7) and seven != eight and seven != plain
    assert sorted(seven) == sorted(eight) == sorted(plain)
    assert order(shuffle_seed=7, limit=10) == seven[:10]
    permutation = shuffled_positions(5, 1)
    assert permutation == shuffled_positions(5, 1) and sorted(permutation) == [0, 1, 2, 3, 4]


def test_shuffle_gives_the_same_order_for_jsonl_parquet_and_folders(tmp_path: Path) -> None:
    rows = prompt_rows(40)
    write_jsonl(tmp_path / "all.jsonl", rows)
    write_parquet(tmp_path / "all.parquet", rows, row_group_size=7)
    (tmp_path / "split").mkdir()
    write_jsonl(tmp_path / "split" / "0.jsonl", rows[:15])
    write_parquet(tmp_path / "split" / "1.parquet", rows[15:], row_group_size=4)
    recipes = [
        make_recipe(tmp_path, source=s, id_column="id", shuffle_seed=3)
        for s in ("all.jsonl", "all.parquet", "split")
    ]
    orders = [list(iter_conversations(recipe)) for recipe in recipes]
    assert (
        [outcome(i) for i in orders[0]] == [outcome(i) for i in orders[1]] == [outcome(i) for i in orders[2]]
    )
    assert [i.index for i in orders[2]] == list(range(40))


@pytest.mark.parametrize(
    ("source", "fragment"),
    [
        ("missing.jsonl", "no such file or folder"),
        ("org/missing.jsonl", "no such file or folder"),
        ("not a hub id", "not a Hub dataset id"),
        ("notes.txt", "unknown file type"),
        ("empty", "folder holds no .jsonl, .json, .parquet files"),
        ("bad.parquet", "cannot read it as Parquet"),
    ],
)
def test_whole_source_problems_raise_source_error_at_call_time(
    tmp_path: Path, source: str, fragment: str
) -> None:
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "empty").mkdir()
    (tmp_path / "bad.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(SourceError, match=fragment) as info:
        iter_conversations(make_recipe(tmp_path, source=source))
    assert source.split("/")[-1] in str(info.value)


# --- streaming -------------------------------------------------------------------------------


def _read_position(path: Path) -> int:
    """The file offset of this process's open handle on ``path`` (Linux /proc)."""
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == str(path):
                fields = Path(f"/proc/self/fdinfo/{fd}").read_text().split()
                return int(fields[fields.index("pos:") + 1])
        except OSError:
            continue
    raise AssertionError(f"{path} is not open")


@pytest.mark.skipif(not Path("/proc/self/fdinfo").exists(), reason="needs Linux /proc")
def test_the_first_jsonl_row_comes_out_before_the_file_is_read(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "big.jsonl", prompt_rows(200_000))
    stream = iter_conversations(make_recipe(tmp_path, source="big.jsonl", id_column="id"))
    first = next(stream)
    assert isinstance(first, Conversation) and first.source_id == "p0"
    assert _read_position(path.resolve()) < path.stat().st_size // 20
    assert outcome(next(stream)) == "p1"


def test_parquet_is_streamed_by_batches(tmp_path: Path) -> None:
    """A corrupt later row group does not stop the first rows; reaching it is a SourceError."""
    import pyarrow.parquet as pq

    path = write_parquet(tmp_path / "p.parquet", prompt_rows(4000), row_group_size=1000)
    chunk = pq.ParquetFile(path).metadata.row_group(3).column(1)
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    with path.open("r+b") as handle:
        handle.seek(start)
        handle.write(b"\xff" * chunk.total_compressed_size)
    stream = iter_conversations(make_recipe(tmp_path, source="p.parquet", id_column="id"))
    assert [outcome(next(stream)) for _ in range(3)] == ["p0", "p1", "p2"]
    with pytest.raises(SourceError, match=r"p\.parquet"):
        list(stream)


# --- Hub datasets through `datasets` -----------------------------------------------------------


def _push(hub: HubServer, repo: str, config: str, rows: list[dict[str, Any]]) -> None:
    from datasets import Dataset

    Dataset.from_list(rows).push_to_hub(repo, config_name=config, token=hub.tokens.write)


def test_hub_dataset_with_subset_split_and_revision(hub: HubServer) -> None:
    from huggingface_hub import HfApi

    sharegpt = [{"id": f"h{i}", "conversations": [{"from": "human", "value": f"q{i}"}]} for i in range(6)]
    _push(hub, "alice/prompts", "chat", sharegpt)
    HfApi(token=hub.tokens.write).create_tag("alice/prompts", tag="v1", repo_type="dataset")
    _push(hub, "alice/prompts", "chat", sharegpt[:2])  # main moves on; v1 keeps 6 rows
    base = {"source": "alice/prompts", "subset": "chat", "id_column": "id"}
    assert [outcome(i) for i in items(**base)] == ["h0", "h1"]
    pinned = items(**base, revision="v1", limit=4)
    assert [outcome(i) for i in pinned] == ["h0", "h1", "h2", "h3"]
    assert pinned[0] == Conversation(0, "h0", ({"role": "user", "content": "q0"},), None)
    shuffled = [outcome(i) for i in items(**base, revision="v1", shuffle_seed=5)]
    assert sorted(shuffled) == [f"h{i}" for i in range(6)] and shuffled != sorted(shuffled)


def test_hub_shuffle_matches_a_local_copy(hub: HubServer, tmp_path: Path) -> None:
    rows = prompt_rows(30)
    _push(hub, "alice/plain", "default", rows)
    write_jsonl(tmp_path / "plain.jsonl", rows)
    hub_order = [outcome(i) for i in items(source="alice/plain", id_column="id", shuffle_seed=11)]
    local = iter_conversations(make_recipe(tmp_path, source="plain.jsonl", id_column="id", shuffle_seed=11))
    assert hub_order == [outcome(i) for i in local]


@pytest.mark.parametrize(
    ("prompts", "fragment"),
    [
        ({"source": "alice/nothing-here"}, "alice/nothing-here"),
        ({"source": "alice/plain2", "split": "test"}, "alice/plain2"),
        ({"source": "alice/plain2", "revision": "v9"}, "revision 'v9'"),
    ],
)
def test_hub_problems_raise_source_error(hub: HubServer, prompts: dict[str, Any], fragment: str) -> None:
    _push(hub, "alice/plain2", "default", prompt_rows(2))
    with pytest.raises(SourceError, match=fragment):
        iter_conversations(make_recipe(**prompts))


# --- the demo prompt files -----------------------------------------------------------------------

REPO = Path(__file__).resolve().parent.parent


def test_demo_prompt_files_are_clean_and_match_their_generator(tmp_path: Path) -> None:
    import runpy

    runpy.run_path(str(REPO / "scripts" / "make_demo_prompts.py"))["write"](tmp_path)
    shipped = REPO / "builder_scripts" / "prompts"
    names = sorted(p.name for p in shipped.glob("*.jsonl"))
    assert (
        names
        == sorted(p.name for p in tmp_path.iterdir())
        == ["openai.jsonl", "plain.jsonl", "sharegpt.jsonl"]
    )
    for name in names:
        assert (shipped / name).read_bytes() == (tmp_path / name).read_bytes(), f"regenerate {name}"
    got = list(iter_conversations(make_recipe(shipped, source=".")))
    assert len(got) == 120 and all(isinstance(i, Conversation) for i in got)
    with_tools = [i for i in got if isinstance(i, Conversation) and i.tools]
    assert with_tools and any("tool_calls" in m for i in with_tools for m in i.messages)


def test_a_utf8_bom_is_not_part_of_the_first_row(tmp_path: Path) -> None:
    (tmp_path / "bom.jsonl").write_bytes(b'\xef\xbb\xbf{"prompt": "a"}\n{"prompt": "b"}\n')
    (tmp_path / "bom.json").write_bytes(b'\xef\xbb\xbf[{"prompt": "a"}]')
    for name in ("bom.jsonl", "bom.json"):
        first = next(iter_conversations(make_recipe(tmp_path, source=name)))
        assert isinstance(first, Conversation) and first.messages[0]["content"] == "a"


# --- problems every row would have: refused before any row (issue 14) ------------------------------


def test_an_unknown_sharegpt_role_is_quoted_once(tmp_path: Path) -> None:
    rows = [{"id": "a", "conversations": [{"from": "alien", "value": "hi"}]},
            {"id": "b", "conversations": [{"from": 3, "value": "hi"}]}]  # fmt: skip
    alien, number = items(source=str(write_jsonl(tmp_path / "r.jsonl", rows)), id_column="id")
    assert "conversations[0].from: unknown role 'alien'; allowed: system, human" in str(alien)
    assert "conversations[0].from: expected a role string, got int 3" in str(number)


@pytest.mark.parametrize(
    ("rows", "prompts", "fragment"),
    [
        ([{"prompt": "x"}], {"id_column": "id"}, "prompts.id_column 'id' is not in the first row (p.parquet"),
        ([{"id": "a", "text": "x"}], {}, "or 'prompt' column for format 'auto' (columns: id, text)"),
        ([{"id": "a", "prompt": "x"}], {"format": "openai"}, "no 'messages' column for format 'openai'"),
    ],
)  # fmt: skip
def test_a_parquet_file_with_the_wrong_columns_is_refused_at_open(
    tmp_path: Path, rows: list[dict[str, Any]], prompts: dict[str, Any], fragment: str
) -> None:
    if "id_column" in prompts:
        fragment = "no column 'id' (prompts.id_column); columns: prompt"
    write_parquet(tmp_path / "p.parquet", rows)
    with pytest.raises(SourceError) as refused:
        iter_conversations(make_recipe(tmp_path, source="p.parquet", **prompts))
    assert str(tmp_path / "p.parquet") in str(refused.value) and fragment in str(refused.value)


def test_a_folder_checks_every_parquet_file(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    write_parquet(tmp_path / "src" / "a.parquet", prompt_rows(2))
    write_parquet(tmp_path / "src" / "b.parquet", [{"prompt": "no id"}])
    with pytest.raises(SourceError, match=r"b\.parquet: no column 'id'"):
        iter_conversations(make_recipe(tmp_path, source="src", id_column="id"))


def test_a_jsonl_file_whose_first_row_has_no_id_column_is_refused(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "p.jsonl", [{"uid": "a", "prompt": "x"}, {"uid": "b", "prompt": "y"}])
    with pytest.raises(SourceError) as refused:
        iter_conversations(make_recipe(tmp_path, source="p.jsonl", id_column="id"))
    assert str(refused.value) == (
        "prompt source p.jsonl: prompts.id_column 'id' is not in the first row (p.jsonl line 1; its fields: "
        "uid, prompt)"
    )


@pytest.mark.parametrize(("name", "content"), [("e.jsonl", b"\n\n"), ("e.json", b"[]"), ("e2.jsonl", b"")])
def test_a_source_without_rows_is_refused(tmp_path: Path, name: str, content: bytes) -> None:
    (tmp_path / name).write_bytes(content)
    with pytest.raises(SourceError, match=f"prompt source {name}: holds no rows"):
        iter_conversations(make_recipe(tmp_path, source=name))


def test_a_hub_dataset_without_the_id_column_is_refused(hub: HubServer) -> None:
    _push(hub, "alice/noid", "default", [{"prompt": "x"}, {"prompt": "y"}])
    with pytest.raises(SourceError, match=r"alice/noid\[train\]: no column 'id' \(prompts.id_column\)"):
        items(source="alice/noid", id_column="id")
