"""Acceptance summaries (issue 24): SGLang's definitions over each group's sums, by turn, length,
category and finish reason; from a built set's rows with the source's category column."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

import eagle3_raw
from eagle3_raw.acceptance import length_bucket, records_of_table, summarize
from eagle3_raw.recipe import load_recipe
from eagle3_raw.source.prompts import source_categories
from tests.helpers import reference_server, write_jsonl, write_recipe


def _record(rng: random.Random, measured: bool = True) -> dict[str, Any]:
    steps = rng.randint(1, 30)
    histogram = [0] * 4
    for _ in range(steps):
        histogram[rng.randint(0, 3)] += 1
    correct = sum(k * n for k, n in enumerate(histogram))
    spec = {
        "spec_verify_ct": steps, "spec_num_correct_drafts": correct, "spec_num_proposed_drafts": steps * 3,
        "spec_correct_drafts_histogram": histogram,
    }  # fmt: skip
    return {
        "turn": rng.choice([1, 3]), "prompt_len": rng.randint(1, 3000), "output_len": steps + correct + 1,
        "completion_tokens": steps + correct + 1, "finish_reason": rng.choice(["stop", "length"]),
        "category": rng.choice(["math", "code", None]),
        **(spec if measured else dict.fromkeys(spec)),
    }  # fmt: skip


def test_figures_are_sglangs_definitions_over_the_sums() -> None:
    rng = random.Random(3)
    records = [_record(rng) for _ in range(200)] + [_record(rng, measured=False) for _ in range(7)]
    summary = summarize(records)
    measured = [r for r in records if r["spec_verify_ct"] is not None]
    overall = summary.overall
    assert (overall.rows, overall.measured) == (207, 200)
    assert overall.accept_length == sum(r["completion_tokens"] for r in measured) / sum(
        r["spec_verify_ct"] for r in measured
    )
    assert overall.accept_rate == sum(r["spec_num_correct_drafts"] for r in measured) / sum(
        r["spec_num_proposed_drafts"] for r in measured
    )
    assert list(overall.histogram) == [
        sum(r["spec_correct_drafts_histogram"][k] for r in measured) for k in range(4)
    ]
    for name, key in (("turn", "turn"), ("finish reason", "finish_reason"), ("category", "category")):
        buckets = summary.groups[name]
        assert sum(stats.rows for stats in buckets.values()) == sum(r[key] is not None for r in records)
        for label, stats in buckets.items():
            members = [r for r in measured if str(r[key]) == label]
            assert stats.tokens == sum(r["completion_tokens"] for r in members)
    lengths = summary.groups["prompt length"]
    for label, stats in lengths.items():
        low, high = map(int, label.split("-"))
        assert stats.rows == sum(low <= r["prompt_len"] <= high for r in records)
    assert list(lengths) == sorted(lengths, key=lambda label: int(label.split("-")[0]))
    assert summary.to_dict()["overall"]["accept_length"] == overall.accept_length


def test_no_figures_and_no_category_say_so() -> None:
    rng = random.Random(1)
    records = [{**_record(rng, measured=False), "category": None} for _ in range(5)]
    summary = summarize(records)
    assert not summary.measured and summary.overall.accept_length is None
    assert "category" not in summary.groups


@pytest.mark.parametrize(
    ("length", "bucket"), [(0, 0), (63, 0), (64, 64), (127, 64), (128, 128), (5000, 4096)]
)
def test_length_buckets_are_powers_of_two(length: int, bucket: int) -> None:
    assert length_bucket(length) == bucket


@pytest.mark.slow
def test_a_sets_rows_summarize_by_the_sources_category_column(tmp_path: Path) -> None:
    topics = [("rivers", "nature"), ("owls", "nature"), ("loops", "code"), ("sums", "math"), ("tides", None)]
    rows = [
        {"id": f"r{i}", "prompt": f"Tell me about {t}.", "kind": kind} for i, (t, kind) in enumerate(topics)
    ]
    write_jsonl(tmp_path / "prompts.jsonl", rows)
    speculate = ("--speculative-algorithm", "EAGLE3", "--speculative-num-draft-tokens", "4")
    with reference_server(tmp_path, *speculate) as (server, _):
        recipe = write_recipe(
            tmp_path, endpoints=[server.url], prompts={"category_column": "kind"},
            sampling={"temperature": 0, "max_new_tokens": 40},
        )  # fmt: skip
        built = eagle3_raw.load(
            str(recipe), cache_dir=str(tmp_path / "cache"), journal_dir=tmp_path / "j", progress="none"
        )
    categories = source_categories(load_recipe(str(recipe)))
    assert categories == {"r0": "nature", "r1": "nature", "r2": "code", "r3": "math"}
    summary = summarize(records_of_table(built.data.table, categories))
    by_category = summary.groups["category"]
    assert {label: stats.rows for label, stats in by_category.items()} == {"nature": 2, "code": 1, "math": 1}
    nature = [r for r in built if r["source_id"] in ("r0", "r1")]
    assert by_category["nature"].verify_steps == sum(r["meta"]["spec_verify_ct"] for r in nature)
    assert summary.overall.measured == len(built) == 5
