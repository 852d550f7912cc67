"""On-policy rollouts (issue 12): every assistant turn written by the target, its history the target's
own earlier turns as the server's parsers split them, rendered by the server's chat path.

Real reference servers on 127.0.0.1 (their ``/separate_reasoning``, ``/parse_function_call`` and
``/tokenize`` are SGLang 0.5.23's, held to SGLang's own code in ``test_chatpath.py``), the real
``datasets`` cache, real ``eagle3-raw build`` processes killed with SIGKILL. The oracle of every
prompt is built here from the ledger's texts and the server's endpoints, not from eagle3_raw's code.
"""

from __future__ import annotations

import json
import random
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import datasets
import pytest

import eagle3_raw
from eagle3_raw.errors import RecipeError
from eagle3_raw.journal import Journal
from eagle3_raw.recipe import load_recipe
from eagle3_raw.reference.ledger import read_ledger
from eagle3_raw.run.build import journal_dir_for
from eagle3_raw.run.mixture import draw
from eagle3_raw.run.rollout import History, Message, call_key, tool_call_id
from eagle3_raw.sglang.client import ToolCall
from tests.helpers import (
    WEATHER,
    generations,
    reference_server,
    requested_rids,
    rid_run,
    write_jsonl,
    write_recipe,
)
from tests.reference.wire import wait_until
from tests.support.pace import scaled

VERBATIM = Path(__file__).parent / "data" / "templates" / "verbatim.jinja"
PARSERS = ("--reasoning-parser", "qwen3", "--tool-call-parser", "qwen25")
TOPICS = ["rivers", "owls", "bread", "tides", "maps", "glass", "moss", "clocks", "trains", "stars"]


def _chats(count: int, users: int = 3) -> list[dict[str, Any]]:
    """``count`` conversations of ``users`` user turns, each answered by another model."""
    rows = []
    for i in range(count):
        messages: list[dict[str, Any]] = [{"role": "system", "content": f"You are helper number {i}."}]
        for turn in range(users):
            messages.append(
                {"role": "user", "content": f"Tell me about {TOPICS[(i + turn) % 10]}, part {turn}."}
            )
            if turn + 1 < users:
                messages.append({"role": "assistant", "content": f"An answer from another model ({turn})."})
        rows.append({"id": f"c{i:03d}", "messages": messages})
    return rows


def _post(url: str, path: str, body: Mapping[str, Any]) -> Any:
    request = urllib.request.Request(
        url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def _recipe(work: Path, url: str, rows: list[dict[str, Any]], **sections: Any) -> Path:
    write_jsonl(work / "chats.jsonl", rows)
    sampling = {"max_new_tokens": 400, "temperature": 0.8, "seed": 5, **sections.pop("sampling", {})}
    sections.setdefault("turns", "rollout")
    return write_recipe(work, endpoints=[url], source="chats.jsonl", sampling=sampling, **sections)


def _load(recipe: Path, work: Path, tag: str = "", **overrides: Any) -> datasets.Dataset:
    cache, journals = str(work / f"cache{tag}"), work / f"journals{tag}"
    return eagle3_raw.load(str(recipe), cache_dir=cache, journal_dir=journals, progress="none", **overrides)


def _failures(recipe: Path, work: Path, tag: str = "") -> list[dict[str, Any]]:
    with Journal.read_dir(journal_dir_for(load_recipe(recipe), work / f"journals{tag}")) as journal:
        return journal.failures()


# --- the oracle: what a chat client would have sent -------------------------------------------------


def _turns(row: Mapping[str, Any]) -> list[tuple[int, list[int], list[int]]]:
    """(point, prompt ids, output ids) of each turn a row holds (a merged row holds them all)."""
    ids = row["input_ids"]
    return [(s["turn"], ids[: s["start"]], ids[s["start"] : s["end"]]) for s in row["spans"]]


def _rollouts(built: datasets.Dataset) -> dict[tuple[str, int], list[tuple[int, list[int], list[int]]]]:
    """Every rollout's turns in order, from its rows."""
    found: dict[tuple[str, int], list[tuple[int, list[int], list[int]]]] = {}
    for row in built:
        found.setdefault((row["source_id"], row["sample"]), []).extend(_turns(row))
    return {key: sorted(turns) for key, turns in found.items()}


class _Texts:
    """The server's text of each delivered generation (``/detokenize`` of its output ids, as
    ``/generate`` decodes them), by (prompt ids, output ids); only delivered ones are in it."""

    def __init__(self, url: str, ledger: Path) -> None:
        self.url = url
        self.delivered = {(tuple(g["input_ids"]), tuple(g["output_ids"])) for g in generations(ledger)}

    def __contains__(self, key: object) -> bool:
        return key in self.delivered

    def __getitem__(self, key: tuple[tuple[int, ...], tuple[int, ...]]) -> str:
        assert key in self.delivered, "not a generation the server delivered"
        return server_text(self.url, list(key[1]))


def _client_message(url: str, text: str, tools: Sequence[Mapping[str, Any]] | None) -> dict[str, Any]:
    """The assistant message SGLang's chat API returns for ``text``: reasoning split off, then calls."""
    split = _post(url, "/separate_reasoning", {"text": text, "reasoning_parser": "qwen3"})
    content, calls = split["text"], []
    if tools:
        parsed = _post(
            url, "/parse_function_call", {"text": content, "tools": tools, "tool_call_parser": "qwen25"}
        )
        content, calls = parsed["normal_text"], parsed["calls"]
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if split["reasoning_text"]:
        message["reasoning_content"] = split["reasoning_text"]
    if calls:
        message["tool_calls"] = [
            {
                "id": f"call-{j}",
                "type": "function",
                "function": {"name": c["name"], "arguments": c["parameters"]},
            }
            for j, c in enumerate(calls)
        ]
    return message


def _expected_prompts(
    url: str, source: Mapping[str, Any], turns: list[tuple[int, list[int], list[int]]], texts: _Texts
) -> list[list[int]]:
    """The prompt of each turn as a chat client makes it: the source's messages up to the turn, its
    own earlier answers as the server parsed them in place of the source's assistant messages."""
    messages, tools = source["messages"], source.get("tools")
    history: list[dict[str, Any]] = []
    cursor, prompts = 0, []
    for point, prompt, output in turns:
        history += [m for m in messages[cursor:point]]
        body: dict[str, Any] = {"messages": history, **({"tools": tools} if tools else {})}
        prompts.append(_post(url, "/tokenize", body)["tokens"])
        history = [*history, _client_message(url, texts[tuple(prompt), tuple(output)], tools)]
        cursor = point + 1
    return prompts


def _assert_on_policy(url: str, built: datasets.Dataset, rows: list[dict[str, Any]], ledger: Path) -> None:
    sources, texts = {row["id"]: row for row in rows}, _Texts(url, ledger)
    for (source_id, _), turns in _rollouts(built).items():
        expected = _expected_prompts(url, sources[source_id], turns, texts)
        assert [prompt for _, prompt, _ in turns] == expected, source_id
        for _, prompt, output in turns:  # every turn's ids are the ids the server delivered for its prompt
            assert (tuple(prompt), tuple(output)) in texts


# --- every row is on policy ------------------------------------------------------------------------


@pytest.mark.slow
def test_every_rollout_prompt_is_the_chat_path_of_the_targets_own_history(tmp_path: Path) -> None:
    rows = _chats(6)
    with reference_server(tmp_path, *PARSERS) as (server, ledger):
        recipe = _recipe(
            tmp_path, server.url, rows, sampling={"samples_per_prompt": 2}, rollout={"merge": "never"}
        )
        built = _load(recipe, tmp_path)
        assert set(built["kind"]) == {"rollout"}
        _assert_on_policy(server.url, built, rows, ledger)
        ended = _failures(recipe, tmp_path)
    assert len(built) + len(ended) == 6 * 2 * 3  # each turn a row, or ended with its rollout
    assert all(f["kind"] == "ended" for f in ended)
    first = {(r["source_id"], r["sample"]): r for r in built if r["turn"] == 2}
    assert len(first) == 12, "every rollout has its first turn"
    # the history is the target's: the source's other-model answers appear in no prompt
    assert not any("another model" in _decoded(r) for r in built)


def server_text(url: str, ids: list[int]) -> str:
    return str(_post(url, "/detokenize", {"tokens": ids})["text"])


@pytest.mark.slow
def test_a_template_that_keeps_history_verbatim_merges_each_rollout_into_one_row(tmp_path: Path) -> None:
    rows = _chats(30, users=2)  # the reference engine's ids are often not what its text re-tokenizes to:
    with reference_server(tmp_path, "--chat-template", str(VERBATIM), *PARSERS) as (
        server,
        ledger,
    ):  # some merge
        recipe = _recipe(
            tmp_path,
            server.url,
            rows,
            sampling={"samples_per_prompt": 2, "temperature": 0.6},
            model={"chat_template": str(VERBATIM)},
        )
        built = _load(recipe, tmp_path)
        _assert_on_policy(server.url, built, rows, ledger)
    merged = [r for r in built if r["kind"] == "merged"]
    assert merged, Counter(built["kind"])
    texts = _Texts(server.url, ledger)
    for row in merged:
        spans = row["spans"]
        assert len(spans) >= 2 and row["id"] == f"{row['source_id']}:merged:{row['sample']}"
        assert row["turn"] == spans[-1]["turn"] and row["prompt_len"] == spans[0]["start"]
        mask = [0] * len(row["input_ids"])
        for span in spans:
            mask[span["start"] : span["end"]] = [1] * (span["end"] - span["start"])
        assert row["loss_mask"] == mask  # 1 exactly over the generated turns
        for _, prompt, output in _turns(row):
            assert (tuple(prompt), tuple(output)) in texts  # each span is the delivered ids, in place
    # a merged conversation has no per-turn rows beside it
    merged_keys = {(r["source_id"], r["sample"]) for r in merged}
    assert not [r for r in built if r["kind"] != "merged" and (r["source_id"], r["sample"]) in merged_keys]


# --- tool loops ------------------------------------------------------------------------------------


def _weather(row_id: str, user: str, call: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "id": row_id,
        "tools": [WEATHER],
        "messages": [
            {"role": "user", "content": user},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "src-1",
                        "type": "function",
                        "function": {"name": call["name"], "arguments": call["arguments"]},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "src-1", "content": '{"temp_c": 21, "sky": "clear-marker"}'},
            {"role": "assistant", "content": "It is 21 degrees."},
            {"role": "user", "content": "Thanks!"},
        ],
    }


def _first_calls(url: str, built: datasets.Dataset, ledger: Path) -> dict[str, list[dict[str, Any]]]:
    """Each conversation's first turn's tool calls, as the server parses them."""
    texts, calls = _Texts(url, ledger), {}
    for row in built:
        if row["turn"] == 1:
            _, prompt, output = _turns(row)[0]
            message = _client_message(url, texts[tuple(prompt), tuple(output)], [WEATHER])
            calls[row["source_id"]] = message.get("tool_calls", [])
    return calls


@pytest.mark.slow
def test_matching_tool_calls_continue_with_the_sources_results_and_others_end(tmp_path: Path) -> None:
    users = [
        f"What is the weather like in {city} today?"
        for city in (
            "Paris",
            "Lima",
            "Oslo",
            "Quito",
            "Accra",
            "Hanoi",
            "Perth",
            "Bern",
            "Cairo",
            "Dakar",
            "Riga",
            "Suva",
        )
    ]
    nowhere = {"name": "get_weather", "arguments": {"city": "Nowhere"}}
    probe = [_weather(f"w{i}", user, nowhere) for i, user in enumerate(users)]
    with reference_server(tmp_path, *PARSERS) as (server, ledger):
        greedy = {"temperature": 0.0, "max_new_tokens": 600}
        recipe = _recipe(tmp_path, server.url, probe, sampling=greedy, rollout={"merge": "never"})
        probed = _load(recipe, tmp_path)
        cut = {r["source_id"] for r in probed if r["finish_reason"] == "length"}
        first = {
            source: calls
            for source, calls in _first_calls(server.url, probed, ledger).items()
            if source not in cut
        }
        calling = {source: calls for source, calls in first.items() if calls}
        assert calling, "no greedy first turn called the tool: the reference engine offers calls with tools"
        ended = {f["id"]: f["reason"] for f in _failures(recipe, tmp_path)}
        for source in calling:  # the target asked something other than Nowhere: no result answers it
            assert ended[f"{source}:3:0"].startswith("tool_calls_differ: the target called get_weather("), (
                ended
            )
        for source in set(first) - set(calling):
            assert ended[f"{source}:3:0"].startswith("no_tool_call: the source calls get_weather("), ended
        for source in cut:
            assert ended[f"{source}:3:0"].startswith("length: "), ended
        # the same conversations, their source now calling what the target calls
        matched = [
            _weather(row["id"], row["messages"][0]["content"], calling[row["id"]][0]["function"])
            for row in probe
            if row["id"] in calling and len(calling[row["id"]]) == 1
        ]
        assert matched, calling
        (tmp_path / "again").mkdir()
        again = _recipe(tmp_path / "again", server.url, matched, sampling=greedy, rollout={"merge": "never"})
        built = _load(again, tmp_path / "again")
        _assert_on_policy(server.url, built, matched, ledger)
    later = [r for r in built if r["turn"] == 3]
    assert {r["source_id"] for r in later} == {row["id"] for row in matched}, (
        "every matched rollout continues"
    )
    assert all("clear-marker" in _decoded(row) for row in later), "the source's tool result follows the call"


def _decoded(row: Mapping[str, Any]) -> str:
    from eagle3_raw.reference.model_files import load_tokenizer

    return str(load_tokenizer().decode(row["input_ids"][: row["prompt_len"]]))


def test_parallel_calls_match_as_a_multiset_and_results_point_at_the_targets_ids() -> None:
    from eagle3_raw.source.prompts import Conversation

    calls = [
        {"id": "a", "type": "function", "function": {"name": "f", "arguments": {"x": 1, "y": 2}}},
        {"id": "b", "type": "function", "function": {"name": "g", "arguments": {}}},
    ]
    messages = (
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "b", "content": "G"},
        {"role": "tool", "tool_call_id": "a", "content": "F"},
        {"role": "user", "content": "and?"},
    )
    conv = Conversation(0, "row", messages, ({"type": "function", "function": {"name": "f"}},))
    history = History(conv, [1, 5], "kimi_k2", 0)
    history.before(1)
    target = Message(
        "", "", (ToolCall("g", "{}"), ToolCall("f", '{"y": 2, "x": 1}'))
    )  # other order, other spelling
    assert history.add(0, target) == ""
    sent = history.before(5)
    assert [m.get("tool_call_id") for m in sent if m["role"] == "tool"] == ["functions.g:0", "functions.f:1"]
    assert sent[1]["tool_calls"][0] == {
        "id": "functions.g:0",
        "type": "function",
        "function": {"name": "g", "arguments": "{}"},
    }
    other = History(conv, [1, 5], None, 0)
    other.before(1)
    assert other.add(0, Message("", "", (ToolCall("f", '{"x": 1, "y": 3}'), ToolCall("g", "{}")))).startswith(
        "tool_calls_differ"
    )
    assert call_key("f", '{"b": 1, "a": 2}') == call_key("f", {"a": 2, "b": 1})
    assert tool_call_id("kimi_k3", "f", 4, "r:1:0", 0) == "f:4"
    generic = tool_call_id("qwen25", "f", 4, "r:1:0", 0)
    assert (
        generic.startswith("call_")
        and len(generic) == 29
        and generic == tool_call_id("qwen25", "f", 9, "r:1:0", 0)
    )
    assert generic != tool_call_id("qwen25", "f", 4, "r:1:1", 0)


# --- kill -9 and resume ----------------------------------------------------------------------------


def _command(recipe: Path, work: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "eagle3_raw.cli.main",
        "build",
        str(recipe),
        "--quiet",
        "--log-interval",
        "1",
        "--journal-dir",
        str(work / "journals"),
        "--cache-dir",
        str(work / "cache"),
    ]


def _journaled_requests(recipe: Path, work: Path) -> set[tuple[tuple[int, ...], int]]:
    """(prompt ids, seed) of every generation the set's rows are made of: the requests journaled."""
    directory = journal_dir_for(load_recipe(recipe), work / "journals")
    if not (directory / "manifest.json").exists():
        return set()
    with Journal.read_dir(directory) as journal:
        return {(tuple(row.prompt_ids), row.sampling_seed) for row in journal.iter_rows()}


def _requests(ledger: Path, runs: set[str] | None = None) -> Iterator[tuple[tuple[int, ...], int]]:
    for line in read_ledger(ledger):
        rid = line.get("rid")
        if "input_ids" in line and isinstance(rid, str) and (runs is None or rid_run(rid) in runs):
            yield tuple(line["input_ids"]), int(line["sampling_params"]["sampling_seed"])


@pytest.mark.slow
def test_a_rollout_build_killed_at_random_points_resumes_to_the_uninterrupted_set(tmp_path: Path) -> None:
    rows = _chats(16, users=4)
    rng = random.Random(12)
    with reference_server(tmp_path, "--slots", "4", "--ms-per-token", "3", *PARSERS) as (server, ledger):
        recipe = _recipe(
            tmp_path, server.url, rows, sampling={"samples_per_prompt": 2, "max_new_tokens": 160}
        )
        for _ in range(3):
            before, seen = _journaled_requests(recipe, tmp_path), set(requested_rids(ledger))
            build = subprocess.Popen(
                _command(recipe, tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
            )
            wait_until(
                lambda: len(_journaled_requests(recipe, tmp_path)) > len(before) or build.poll() is not None,  # noqa: B023
                timeout=scaled(60),
            )
            time.sleep(rng.uniform(0.1, 1.5))
            build.kill()
            assert build.wait() == -signal.SIGKILL, "the build finished before it could be killed"
            runs = {rid_run(rid) for rid in requested_rids(ledger)} - {rid_run(rid) for rid in seen}
            asked = set(_requests(ledger, runs))
            assert not asked & before, "a turn journaled before the build was asked again"
        before, seen = _journaled_requests(recipe, tmp_path), set(requested_rids(ledger))
        finished = subprocess.run(
            _command(recipe, tmp_path), capture_output=True, text=True, timeout=scaled(180)
        )
        assert finished.returncode == 0, finished.stderr[-3000:]
        runs = {rid_run(rid) for rid in requested_rids(ledger)} - {rid_run(rid) for rid in seen}
        assert not set(_requests(ledger, runs)) & before
        resumed = eagle3_raw.load(
            str(recipe), cache_dir=str(tmp_path / "cache"), journal_dir=tmp_path / "journals", progress="none"
        )
        clean = _load(recipe, tmp_path, "-clean")
        resumed_failures = _failures(recipe, tmp_path)
        clean_failures = _failures(recipe, tmp_path, "-clean")
    assert resumed["id"] == clean["id"] and resumed["input_ids"] == clean["input_ids"]
    assert resumed["loss_mask"] == clean["loss_mask"] and resumed["spans"] == clean["spans"]
    assert resumed_failures == clean_failures


# --- mixtures and determinism --------------------------------------------------------------------


MIXTURE = [
    {"weight": 3, "temperature": 0.9, "top_p": 0.95},
    {"weight": 1, "temperature": 0.0, "chat_template_kwargs": {"enable_thinking": False}},
]


@pytest.mark.slow
def test_the_mixture_on_every_row_reproduces_from_the_recipe_and_seed(tmp_path: Path) -> None:
    rows = _chats(16, users=2)
    with reference_server(tmp_path, *PARSERS) as (server, ledger):
        recipe = _recipe(tmp_path, server.url, rows, sampling={"mixture": MIXTURE, "samples_per_prompt": 2})
        built = _load(recipe, tmp_path)
        again = _load(recipe, tmp_path, "-again")
        sent = {
            (tuple(g["input_ids"]), tuple(g["output_ids"])): g["sampling_params"] for g in generations(ledger)
        }
    parsed = load_recipe(recipe)
    for row in built:
        choice = draw(parsed, row["source_id"], row["sample"])
        assert choice is not None and row["mixture"]["index"] == choice.index
        assert json.loads(row["mixture"]["choice"]) == choice.component.to_dict()
        for _, prompt, output in _turns(row):  # what was sent is the component's
            params = sent[tuple(prompt), tuple(output)]
            assert params["temperature"] == MIXTURE[choice.index]["temperature"]
            thinking_off = _decoded({"input_ids": prompt, "prompt_len": len(prompt)}).endswith(
                "<think>\n\n</think>\n\n"
            )
            assert thinking_off == (choice.index == 1)
    assert Counter(built["mixture"][i]["index"] for i in range(len(built))).keys() == {0, 1}
    assert built["id"] == again["id"] and built["mixture"] == again["mixture"]
    drawn = Counter(draw(parsed, f"s{i}", 0).index for i in range(2000))  # type: ignore[union-attr]
    assert 0.70 < drawn[0] / 2000 < 0.80  # weights 3:1


@pytest.mark.slow
def test_greedy_rollouts_are_identical_across_two_builds(tmp_path: Path) -> None:
    rows = [
        *_chats(5),
        _weather(
            "w",
            "What is the weather like in Oslo today?",
            {"name": "get_weather", "arguments": {"city": "Oslo"}},
        ),
    ]
    with reference_server(tmp_path, *PARSERS) as (server, _):
        recipe = _recipe(tmp_path, server.url, rows, sampling={"temperature": 0.0})
        first = _load(recipe, tmp_path)
        second = _load(recipe, tmp_path, "-2")
    assert first.remove_columns("meta").to_list() == second.remove_columns("meta").to_list()
    assert set(first["kind"]) <= {"rollout", "merged"}


@pytest.mark.slow
def test_the_order_turns_get_slots_in_changes_nothing_in_the_set(tmp_path: Path) -> None:
    """Turns with more turns to come take free slots first (issue 26): with one slot every request
    waits in line and that order decides when each is sent; the set is the one a build with room
    for all of them makes."""
    rows = _chats(8, users=4)
    with reference_server(tmp_path, *PARSERS) as (server, ledger):
        recipe = _recipe(tmp_path, server.url, rows)
        roomy = _load(recipe, tmp_path)
        one_slot = _load(recipe, tmp_path, "-1", **{"server.max_in_flight": 1})
        _assert_on_policy(server.url, one_slot, rows, ledger)
    assert one_slot.remove_columns("meta").to_list() == roomy.remove_columns("meta").to_list()
    assert len(_rollouts(one_slot)) == len(rows)


@pytest.mark.slow
def test_server_and_local_rendering_make_the_same_rollouts(tmp_path: Path) -> None:
    rows = _chats(4)
    with reference_server(tmp_path, *PARSERS) as (server, _):
        recipe = _recipe(tmp_path, server.url, rows)
        served = _load(recipe, tmp_path)
        local = _load(recipe, tmp_path, "-l", **{"model.render": "local"})
    assert served["input_ids"] == local["input_ids"] and served["id"] == local["id"]


# --- the recipe ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        ({"rollout": {"merge": "auto"}}, "rollout", "applies to turns: rollout only"),
        (
            {"turns": "rollout", "rollout": {"tool_call_parser": "qwen2"}},
            "rollout.tool_call_parser",
            "did you mean",
        ),
        (
            {"turns": "rollout", "rollout": {"merge": "sometimes"}},
            "rollout.merge",
            "expected one of: auto, never",
        ),
        (
            {"sampling": {"max_new_tokens": 8, "mixture": [{"temperature": 0}]}},
            "sampling.mixture[0].weight",
            "> 0",
        ),
        (
            {"sampling": {"max_new_tokens": 8, "mixture": [{"weight": 1, "temprature": 0}]}},
            "sampling.mixture[0].temprature",
            "did you mean 'temperature'",
        ),
        ({"sampling": {"max_new_tokens": 8, "mixture": []}}, "sampling.mixture", "1 to 64 components"),
    ],
)
def test_rollout_and_mixture_settings_are_checked(change: dict[str, Any], field: str, message: str) -> None:
    raw = {
        "name": "r",
        "prompts": {"source": "x.jsonl"},
        "server": {"launch": "reference"},
        "sampling": {"max_new_tokens": 8},
        **change,
    }
    with pytest.raises(RecipeError) as caught:
        load_recipe(raw)
    assert caught.value.field == field and message in str(caught.value)


@pytest.mark.slow
def test_a_rollout_reuses_the_first_turns_of_a_turns_all_set_and_goes_on_from_their_ids(
    tmp_path: Path,
) -> None:
    rows = _chats(4)
    with reference_server(tmp_path, *PARSERS) as (server, ledger):
        recipe = _recipe(tmp_path, server.url, rows, turns="all")
        _load(recipe, tmp_path)
        asked = len(generations(ledger))
        rollout = _recipe(tmp_path, server.url, rows)  # the same journal root, turns: rollout
        built = _load(rollout, tmp_path, "")
        _assert_on_policy(server.url, built, rows, ledger)
        again = [tuple(g["input_ids"]) for g in generations(ledger)[asked:]]
    first_prompts = {tuple(r["input_ids"][: r["prompt_len"]]) for r in built if r["turn"] == 2}
    assert first_prompts and not first_prompts & set(again), "the first turns were generated again"
    assert len(built) > len(first_prompts), "the rollouts went on past the reused turns"


@pytest.mark.slow
def test_rollout_counts_add_up_and_a_missing_tool_call_parser_is_named(tmp_path: Path) -> None:
    """Issue 21 finding 8: the bar ends at 100% on the summary's counts (turns never made because
    their rollout ended early leave the total), rollouts are counted as samples x conversations,
    and a rollout that ends on no_tool_call because the server has no tool-call parser says so."""
    paris = {"name": "get_weather", "arguments": {"city": "Paris"}}
    rows = [_weather(f"w{i}", f"What is the weather in town {i}?", paris) for i in range(6)] + _chats(4)
    with reference_server(tmp_path) as (server, _):  # started without --tool-call-parser
        recipe = _recipe(
            tmp_path, server.url, rows, sampling={"samples_per_prompt": 2}, rollout={"merge": "never"}
        )
        command = [
            sys.executable, "-m", "eagle3_raw.cli", "build", str(recipe), "--quiet",
            "--journal-dir", str(tmp_path / "j"), "--cache-dir", str(tmp_path / "c"),
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    last = [line for line in done.stderr.splitlines() if " rows (" in line][-1]
    finished, total, percent = re.search(r"([\d,]+)/([\d,]+) rows \(([\d.]+)%\)", last).groups()  # type: ignore[union-attr]
    counts = {name: int(re.search(rf"^{name} +([\d,]+)", out, re.M)[1].replace(",", "")) for name in
              ("rows", "skipped", "failed")}  # type: ignore[index]  # fmt: skip
    assert finished == total and percent == "100.0", last
    assert int(finished) == counts["rows"] + counts["skipped"] + counts["failed"], (last, out)
    ended = re.search(r"^ended early +(\d+) rollouts, (\d+) turns not made", out, re.M)
    assert ended is not None and f"{ended[2]} turns not made (rollouts ended early)" in last, (last, out)
    assert int(ended[1]) >= 12 and int(ended[2]) >= 24  # each weather rollout, its turns 3 and 5
    assert re.search(r"^rollouts +20 \(2 samples x 10 conversations\)", out, re.M), out
    assert re.search(r"12 x no_tool_call \(no tool-call parser", out), out
    assert "start it with --tool-call-parser NAME (with vLLM also --enable-auto-tool-choice) or set" in out
