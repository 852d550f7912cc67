"""``eagle3-raw eval`` (issue 24): a set's prompts replayed through speculating reference servers.

The end-to-end tests build a small set on a reference server without a drafter, then replay it
through two reference servers that speculate with drafters of different quality
(``--draft-acceptance``), each keeping a ledger: the report's figures are recomputed from the
``spec`` the servers' ledgers record for the requests eval sent. The points (what is replayed,
with which params) are checked on plain rows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

from eagle3_raw.acceptance import length_bucket
from eagle3_raw.cli.main import main
from eagle3_raw.evaluate.replay import Answer, Failure, Replay
from eagle3_raw.evaluate.report import Report, server_report, tables
from eagle3_raw.evaluate.sets import Point, open_split, points
from eagle3_raw.recipe import load_recipe
from eagle3_raw.reference.ledger import read_ledger
from eagle3_raw.run.mixture import draw
from eagle3_raw.run.plan import derive_seed
from eagle3_raw.sglang.protocol.outputs import SPEC_KEYS
from eagle3_raw.sglang.sampling import SGLANG_SAMPLING_DEFAULTS
from tests.helpers import (
    CHATS,
    error_line,
    generations,
    reference_server,
    run_main,
    write_jsonl,
    write_recipe,
)
from tests.support.hostile import Forward, HostileServer

SPECULATING = (
    "--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
    "--speculative-num-draft-tokens", "4",
)  # fmt: skip


def _recipe(tmp_path: Path, **sampling: Any) -> Any:
    write_jsonl(tmp_path / "prompts.jsonl", CHATS)
    path = write_recipe(tmp_path, endpoints=["http://127.0.0.1:9"], sampling=sampling)
    return load_recipe(path)


def _row(**fields: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "id": "plain-1:1:0", "source_id": "plain-1", "turn": 1, "sample": 0,
        "input_ids": [5, 6, 7, 8, 9, 10], "prompt_len": 4, "finish_reason": "stop", "sampling_seed": 1234,
        "meta": {"max_new_tokens": 40}, "kind": "turn",
        "spans": [{"turn": 1, "start": 4, "end": 6}],
    }  # fmt: skip
    return {**row, **fields}


# --- points, on plain rows -------------------------------------------------------------------


def test_a_turn_row_replays_its_prompt_with_its_max_new_tokens_seed_and_the_recipes_sampling(
    tmp_path: Path,
) -> None:
    recipe = _recipe(tmp_path, temperature=0.7, top_p=0.9)
    (point,) = points([_row()], recipe)
    assert point.prompt_ids == (5, 6, 7, 8)
    assert (point.row_id, point.source_id, point.turn) == ("plain-1:1:0", "plain-1", 1)
    expected = {**SGLANG_SAMPLING_DEFAULTS, "max_new_tokens": 40, "temperature": 0.7, "top_p": 0.9}
    assert dict(point.sampling_params) == {**expected, "sampling_seed": 1234}


def test_greedy_sends_temperature_zero_and_min_new_tokens_never_passes_max(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, temperature=0.7, min_new_tokens=50)
    (point,) = points([_row()], recipe, greedy=True)
    assert point.sampling_params["temperature"] == 0.0
    assert point.sampling_params["max_new_tokens"] == 40
    assert point.sampling_params["min_new_tokens"] == 40  # SGLang refuses min above max


def test_a_merged_row_replays_each_turn_at_its_span_with_that_turns_seed(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, temperature=0.7)
    spans = [{"turn": 1, "start": 2, "end": 4}, {"turn": 3, "start": 6, "end": 9}]
    row = _row(
        id="share-1:merged:0", source_id="share-1", turn=3, kind="merged", prompt_len=2,
        input_ids=list(range(100, 109)), spans=spans, sampling_seed=77,
    )  # fmt: skip
    first, last = points([row], recipe)
    assert (first.turn, first.prompt_ids) == (1, (100, 101))
    assert (last.turn, last.prompt_ids) == (3, (100, 101, 102, 103, 104, 105))
    assert first.sampling_params["sampling_seed"] == derive_seed(recipe.sampling.seed, "share-1", 1, 0)
    assert last.sampling_params["sampling_seed"] == derive_seed(recipe.sampling.seed, "share-1", 3, 0)
    assert first.max_new_tokens == 64 and last.max_new_tokens == 40  # the recipe's; the row's meta


def test_a_mixture_component_s_params_are_the_row_s(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "prompts.jsonl", CHATS)
    mixture = [{"weight": 1, "temperature": 0.2}, {"weight": 1, "temperature": 0.9}]
    path = write_recipe(tmp_path, endpoints=["http://127.0.0.1:9"], sampling={"mixture": mixture})
    recipe = load_recipe(path)
    rows = [_row(source_id=f"s{i}", id=f"s{i}:1:0") for i in range(8)]
    for row, point in zip(rows, points(rows, recipe), strict=True):
        choice = draw(recipe, row["source_id"], 0)
        assert choice is not None
        assert point.sampling_params["temperature"] == choice.component.params["temperature"]


def test_categories_name_each_points_category(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path)
    rows = [_row(), _row(source_id="plain-2", id="plain-2:1:0")]
    found = points(rows, recipe, categories={"plain-1": "poetry"})
    assert [p.category for p in found] == ["poetry", None]


# --- the report, on plain answers -----------------------------------------------------------


def _answer(turn: int, tokens: int, steps: int, correct: int, histogram: list[int], latency: float) -> Answer:
    point = Point(f"s:{turn}:0", "s", turn, tuple(range(10 * turn)), {"max_new_tokens": 64})
    spec = {
        "spec_accept_rate": correct / (3 * steps), "spec_accept_length": tokens / steps,
        "spec_num_correct_drafts": correct, "spec_num_proposed_drafts": 3 * steps, "spec_verify_ct": steps,
        "spec_correct_drafts_histogram": histogram,
    }  # fmt: skip
    return Answer(point, tokens, "length", spec, latency)


def _replay() -> Replay:
    answers = (
        _answer(1, 20, 8, 12, [2, 2, 2, 2], 0.5),
        _answer(1, 10, 5, 5, [1, 3, 1, 0], 0.25),
        _answer(3, 30, 10, 20, [0, 3, 4, 3], 1.0),
    )
    one = Answer(
        Point("t:1:0", "t", 1, (1, 2), {"max_new_tokens": 1}), 1, "length", dict.fromkeys(SPEC_KEYS), 0.1
    )
    failed = Failure(Point("u:1:0", "u", 1, (1,), {"max_new_tokens": 8}), "3 attempts failed; last: boom")
    return Replay("http://127.0.0.1:1", {"speculative_algorithm": "EAGLE3"}, (*answers, one), (failed,), 2.0)


def test_the_report_sums_the_servers_figures_over_requests_with_speed_beside_them() -> None:
    report = server_report(_replay()).to_dict()
    overall = report["overall"]
    assert (overall["rows"], overall["measured"], overall["tokens"], overall["verify_steps"]) == (
        4,
        3,
        60,
        23,
    )
    assert overall["accept_length"] == pytest.approx(60 / 23)
    assert overall["accept_rate"] == pytest.approx(37 / 69)
    assert list(overall["histogram"]) == [3, 8, 7, 5]
    assert overall["tokens_per_s"] == pytest.approx(61 / 1.85)  # every answer's tokens and latency
    assert report["throughput_tokens_per_s"] == pytest.approx(61 / 2.0)  # every token, over wall time
    assert report["failed"] == {"3 attempts failed; last: boom": 1} and report["answered"] == 4
    turns = report["groups"]["turn"]
    first = turns["1"]
    assert set(turns) == {"1", "3"} and first["verify_steps"] == 13 and first["rows"] == 3
    assert first["accept_length"] == pytest.approx(30 / 13)
    assert first["tokens_per_s"] == pytest.approx(31 / 0.85)  # the one-token answer counts for speed


def test_the_tables_put_the_servers_side_by_side() -> None:
    from rich.console import Console

    good, poor = (
        server_report(_replay()),
        server_report(dataclasses.replace(_replay(), url="http://127.0.0.1:2")),
    )
    report = Report("recipe t (t-0), split train", "train", 5, "recipe", (good, poor))
    console = Console(width=200, record=True, file=io.StringIO())
    for table in tables(report):
        console.print(table)
    text = console.export_text()
    assert "http://127.0.0.1:1" in text and "http://127.0.0.1:2" in text
    assert "A length" in text and "B length" in text and "2.61" in text  # 60 / 23
    assert "accepted drafts" in text and "finish reason" in text
    stacked = [str(table.title) for table in tables(report, stacked=True)]  # a narrow terminal
    assert [title for title in stacked if "by group" in title] == [
        "acceptance length (accept rate) and tokens/s by group: A",
        "acceptance length (accept rate) and tokens/s by group: B",
    ]


# --- end to end, against reference servers --------------------------------------------------

PLAIN = [
    {"id": f"q{i:02d}", "prompt": f"Say something about the number {i} and its neighbours."}
    for i in range(12)
]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A greedy set of every turn of CHATS and a dozen plain prompts, built into ``<folder>/c`` by
    a reference server without a drafter (stopped since: eval reads the set from the cache)."""
    folder = tmp_path_factory.mktemp("eval")
    write_jsonl(folder / "prompts.jsonl", [*CHATS, *PLAIN])
    with reference_server(folder) as (server, _):
        recipe = write_recipe(
            folder, endpoints=[server.url], turns="all", sampling={"temperature": 0, "max_new_tokens": 48}
        )
        assert main([*_where(folder, "build", str(recipe)), "--quiet"]) == 0
    return folder


def _where(folder: Path, command: str, *argv: str) -> list[str]:
    return [command, *argv, "--journal-dir", str(folder / "j"), "--cache-dir", str(folder / "c")]


def _eval(folder: Path, *argv: str) -> list[str]:
    return _where(folder, "eval", str(folder / "recipe.yaml"), *argv)


def _eval_lines(ledger: Path) -> list[dict[str, Any]]:
    """The generations a server answered to eval's requests (their rids start ``eval:``)."""
    return [g for g in generations(ledger) if g["rid"].startswith("eval:")]


def _turn(rid: str) -> int:
    """The turn in an eval request id: ``eval:<row id>:<turn>#<attempt>-<hex>``."""
    return int(rid.split("#", 1)[0].rsplit(":", 1)[1])


def _expected(lines: list[dict[str, Any]]) -> dict[str, Any]:
    """Acceptance recomputed from the ledger's lines: sums over the requests measured."""
    measured = [g for g in lines if g.get("spec") is not None]
    tokens = sum(len(g["output_ids"]) for g in measured)
    steps = sum(g["spec"]["spec_verify_ct"] for g in measured)
    correct = sum(g["spec"]["spec_num_correct_drafts"] for g in measured)
    proposed = sum(g["spec"]["spec_num_proposed_drafts"] for g in measured)
    width = max((len(g["spec"]["spec_correct_drafts_histogram"]) for g in measured), default=0)
    histogram = [0] * width
    for g in measured:
        for k, n in enumerate(g["spec"]["spec_correct_drafts_histogram"]):
            histogram[k] += n
    return {
        "rows": len(lines), "measured": len(measured), "tokens": tokens, "verify_steps": steps,
        "correct_drafts": correct, "proposed_drafts": proposed, "histogram": histogram,
        "accept_length": tokens / steps if steps else None,
        "accept_rate": correct / proposed if proposed else None,
    }  # fmt: skip


def _check_stats(reported: Mapping[str, Any], expected: Mapping[str, Any]) -> None:
    for key, value in expected.items():
        if isinstance(value, float):
            assert reported[key] == pytest.approx(value, rel=1e-12), key
        elif key == "histogram":
            assert list(reported[key])[: len(value)] == value and not any(list(reported[key])[len(value) :])
        else:
            assert reported[key] == value, key


@contextlib.contextmanager
def _drafters(folder: Path, *qualities: str) -> Iterator[list[tuple[Any, Path]]]:
    with contextlib.ExitStack() as stack:
        yield [
            stack.enter_context(reference_server(folder, *SPECULATING, "--draft-acceptance", quality))
            for quality in qualities
        ]


@pytest.mark.slow
def test_eval_reports_the_better_drafter_as_better_with_the_servers_own_figures(
    built: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with _drafters(built, "0.8", "0.3") as [(good, good_ledger), (poor, poor_ledger)]:
        code, out, err = run_main(
            capsys, *_eval(built, "--server", good.url, "--against", poor.url, "--json")
        )
    assert code == 0, err
    report = json.loads(out)
    rows = len(_set_rows(built))
    assert report["split"] == "train" and report["points"] == rows and report["sampling"] == "recipe"
    first, second = report["servers"]
    assert (first["url"], second["url"]) == (good.url, poor.url)
    assert first["drafter"]["speculative_algorithm"] == "EAGLE3"
    for server, ledger in ((first, good_ledger), (poor_server := second, poor_ledger)):
        lines = _eval_lines(ledger)
        assert len(lines) == rows and server["answered"] == rows and server["failed"] == {}
        _check_stats(server["overall"], _expected(lines))
        by_turn = server["groups"]["turn"]
        for turn in {_turn(g["rid"]) for g in lines}:
            _check_stats(by_turn[str(turn)], _expected([g for g in lines if _turn(g["rid"]) == turn]))
        by_output = server["groups"]["output length"]
        for low in {length_bucket(len(g["output_ids"])) for g in lines}:
            label = f"{low}-{(64 if low == 0 else 2 * low) - 1}"
            bucket = [g for g in lines if length_bucket(len(g["output_ids"])) == low]
            _check_stats(by_output[label], _expected(bucket))
        for group in ("prompt length", "finish reason"):  # every answer in one bucket of each
            buckets = server["groups"][group].values()
            assert sum(b["rows"] for b in buckets) == rows and sum(b["tokens"] for b in buckets) == sum(
                len(g["output_ids"]) for g in lines
            )
        assert server["overall"]["tokens_per_s"] > 0 and server["throughput_tokens_per_s"] > 0
    assert first["overall"]["accept_length"] > poor_server["overall"]["accept_length"]
    assert first["overall"]["accept_rate"] > poor_server["overall"]["accept_rate"]
    # the same prompts, the same greedy answers: one target, two drafters
    assert sorted(map(_prompt_and_output, _eval_lines(good_ledger))) == sorted(
        map(_prompt_and_output, _eval_lines(poor_ledger))
    )
    # and each request is the one the build sent for its row: prompt ids and every sampling param
    assert sorted(map(_request, _eval_lines(good_ledger))) == sorted(
        map(_request, generations(built / "ledger-0.jsonl"))
    )


def _request(line: Mapping[str, Any]) -> tuple[tuple[int, ...], bytes]:
    return tuple(line["input_ids"]), orjson.dumps(line["sampling_params"], option=orjson.OPT_SORT_KEYS)


def _prompt_and_output(line: Mapping[str, Any]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return tuple(line["input_ids"]), tuple(line["output_ids"])


def _set_rows(folder: Path) -> list[dict[str, Any]]:
    opened = open_split(folder / "recipe.yaml", cache_dir=folder / "c", journal_dir=folder / "j")
    return list(opened.dataset)


@pytest.mark.slow
def test_a_server_that_does_not_speculate_is_named_before_any_prompt_is_sent(
    built: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with _drafters(built, "0.8") as [(good, good_ledger)], reference_server(built) as (plain, plain_ledger):
        code, _, err = run_main(capsys, *_eval(built, "--server", good.url, "--against", plain.url))
    assert code == 1
    line = error_line(err)
    assert plain.url in line and "does not speculate" in line and "speculative_algorithm" in line
    assert _eval_lines(good_ledger) == [] and generations(plain_ledger) == []


@pytest.mark.slow
def test_a_server_that_reports_a_drafter_but_measures_nothing_stops_at_its_first_answer(
    built: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async def unmeasured(request: web.Request, forward: Forward) -> web.StreamResponse:
        status, body = await forward()
        answer = orjson.loads(body)
        for key in SPEC_KEYS:
            answer["meta_info"].pop(key, None)
        return web.Response(body=orjson.dumps(answer), status=status, content_type="application/json")

    with (
        _drafters(built, "0.8") as [(worker, ledger)],
        HostileServer({"/generate": unmeasured}, worker=worker.url) as proxy,
    ):
        code, _, err = run_main(capsys, *_eval(built, "--server", proxy.url))
    assert code == 1
    line = error_line(err)
    assert proxy.url in line and "carries none of SGLang's spec_* figures" in line
    assert len(_eval_lines(ledger)) == 1  # the first answer said it; no other prompt was sent


@pytest.mark.slow
def test_the_table_shows_both_servers_and_the_plot_is_a_png(
    built: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plot = built / "plots" / "eval.png"
    with _drafters(built, "0.8", "0.3") as [(good, _), (poor, _)]:
        code, out, err = run_main(
            capsys,
            *_eval(built, "--server", good.url, "--server", poor.url, "--plot", str(plot), "--limit", "6"),
        )
    assert code == 0, err
    assert good.url in out and poor.url in out
    for title in ("acceptance length", "by group", "accepted drafts", "turn", "finish reason"):
        assert title in out, title
    assert f"plot              {plot}" in out
    assert plot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


@pytest.mark.slow
def test_a_split_the_set_lacks_is_named_with_those_it_has(
    built: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_main(capsys, *_eval(built, "--server", "http://127.0.0.1:9", "--split", "validation"))
    assert code == 1
    line = error_line(err)
    assert "no split 'validation'" in line and "it has train" in line


def test_a_plot_without_matplotlib_names_the_extra_before_anything_is_sent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a)
    )
    recipe = _recipe(tmp_path)
    code, _, err = run_main(
        capsys, "eval", str(recipe.base_dir / "recipe.yaml"), "--server", "http://127.0.0.1:9",
        "--plot", str(tmp_path / "p.png"),
    )  # fmt: skip
    assert code == 1
    assert "eagle3_raw[plot]" in error_line(err)


@pytest.mark.slow
def test_a_merged_rollout_row_is_replayed_turn_by_turn_as_the_build_sent_each(tmp_path: Path) -> None:
    verbatim = Path(__file__).parent / "data" / "templates" / "verbatim.jinja"
    chats = [
        {"id": f"c{i}", "messages": [{"role": "user", "content": f"Tell me about owls, part {i}."},
                                     {"role": "assistant", "content": "An answer from another model."},
                                     {"role": "user", "content": f"And about moss, part {i}?"}]}
        for i in range(16)
    ]  # fmt: skip
    write_jsonl(tmp_path / "prompts.jsonl", chats)
    with reference_server(tmp_path, "--chat-template", str(verbatim)) as (server, build_ledger):
        recipe = write_recipe(
            tmp_path, endpoints=[server.url], turns="rollout", model={"chat_template": str(verbatim)},
            sampling={"temperature": 0.6, "max_new_tokens": 400},  # long enough to stop: the rollout goes on
        )  # fmt: skip
        assert main([*_where(tmp_path, "build", str(recipe)), "--quiet"]) == 0
    rows = _set_rows(tmp_path)
    merged = [r for r in rows if r["kind"] == "merged"]
    assert merged, [r["kind"] for r in rows]
    with _drafters(tmp_path, "0.7") as [(drafter, ledger)]:
        assert main([*_eval(tmp_path, "--server", drafter.url), "--json"]) == 0
    lines = _eval_lines(ledger)
    assert len(lines) == sum(len(r["spans"]) if r["kind"] == "merged" else 1 for r in rows)
    assert sorted(map(_request, lines)) == sorted(map(_request, generations(build_ledger)))
    assert {_turn(g["rid"]) for g in lines} == {1, 3}


@pytest.mark.slow
def test_eval_retries_a_failing_server_sends_the_api_key_and_warns_of_another_model(
    built: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    faults = (
        "--faults",
        "http500=0.4",
        "--fault-seed",
        "2",
        "--api-key",
        "right-key",
        "--weight-version",
        "v2",
    )
    with reference_server(built, *SPECULATING, *faults) as (server, ledger):
        monkeypatch.setenv("E3R_EVAL_KEY", "wrong-key")
        code, _, err = run_main(
            capsys, *_eval(built, "--server", server.url, "--api-key-env", "E3R_EVAL_KEY")
        )
        assert code == 1 and "401" in error_line(err)
        monkeypatch.setenv("E3R_EVAL_KEY", "right-key")
        code, out, err = run_main(
            capsys, *_eval(built, "--server", server.url, "--api-key-env", "E3R_EVAL_KEY", "--json")
        )
    assert code == 0, err
    assert f"{server.url} serves {{'model_path': " in err and "'weight_version': 'v2'}" in err
    assert "the set was generated by" in err and "'weight_version': 'default'}" in err
    (report,) = json.loads(out)["servers"]
    rows = len(_set_rows(built))
    assert report["answered"] == rows and report["failed"] == {}
    assert len(_eval_lines(ledger)) == rows
    assert any(r.get("status") == 500 for r in read_ledger(ledger)), "no fault was injected: nothing retried"


@pytest.mark.slow
def test_a_set_with_a_validation_split_replays_it_by_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_jsonl(tmp_path / "prompts.jsonl", PLAIN)
    with reference_server(tmp_path) as (server, _):
        recipe = write_recipe(
            tmp_path, endpoints=[server.url], splits={"validation": 4},
            sampling={"temperature": 0, "max_new_tokens": 24},
        )  # fmt: skip
        assert main([*_where(tmp_path, "build", str(recipe)), "--quiet"]) == 0
    capsys.readouterr()  # the build's summary
    held = open_split(recipe, cache_dir=tmp_path / "c", journal_dir=tmp_path / "j")
    assert held.split == "validation" and set(held.splits) == {"train", "validation"}
    validation = {row["id"] for row in held.dataset}
    with _drafters(tmp_path, "0.7") as [(drafter, ledger)]:
        code, out, err = run_main(capsys, *_eval(tmp_path, "--server", drafter.url, "--json"))
        assert code == 0, err
        assert json.loads(out)["split"] == "validation"
        assert {
            g["rid"].split("#")[0].rsplit(":", 1)[0].removeprefix("eval:") for g in _eval_lines(ledger)
        } == validation
        code, out, err = run_main(
            capsys, *_eval(tmp_path, "--server", drafter.url, "--json", "--split", "train")
        )
    assert code == 0, err
    assert json.loads(out)["points"] == len(PLAIN) - len(validation)


def test_a_server_that_is_no_url_is_refused_before_the_set_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_main(capsys, "eval", str(tmp_path / "none.yaml"), "--server", "localhost:30000")
    assert code == 1
    assert "'localhost:30000': expected an http:// or https:// URL" in error_line(err)
