"""The held-out split (issue 24): a recipe's ``splits`` section, the seeded hash that assigns whole
conversations, and the two splits of a set built on the reference server, loaded and exported.

The hash rule is recomputed here from its definition (sha256 of a domain, the seed and the source
id), never through :mod:`eagle3_raw.splits`; the expected splits of a set come from its rows.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import datasets
import orjson
import pyarrow as pa
import pytest
import yaml

import eagle3_raw
from eagle3_raw import hub
from eagle3_raw.builder import build
from eagle3_raw.errors import FatalError, RecipeError
from eagle3_raw.export import export
from eagle3_raw.recipe import load_recipe
from eagle3_raw.splits import SplitRule, split_key, split_mask, validation_ids
from tests.helpers import run_main, write_jsonl

try:
    from tests.support.hub_server import HubServer, hub_server
    from tests.support.hub_server import hub as hub_fixture
except ModuleNotFoundError:  # `tests` is a package only when the repo root is on sys.path
    from support.hub_server import HubServer, hub_server  # type: ignore[no-redef]
    from support.hub_server import hub as hub_fixture  # type: ignore[no-redef]

emulator = hub_fixture
__all__ = ["emulator", "hub_server"]  # fixtures used by name

BASE: dict[str, Any] = {
    "name": "held",
    "prompts": {"source": "org/data"},
    "model": {"tokenizer": "org/tok"},
    "server": {"endpoints": ["http://h:1"]},
    "sampling": {"max_new_tokens": 8},
}


def _key(source_id: str, seed: int) -> int:
    """The rule as the docs state it, computed apart from eagle3_raw.splits."""
    data = b"eagle3_raw/split/1\0" + str(seed).encode() + b"\0" + source_id.encode()
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "big")


def _held_fraction(ids: Iterable[str], fraction: float, seed: int) -> set[str]:
    return {s for s in ids if _key(s, seed) < int(fraction * 2**64)}


def _held_count(ids: Iterable[str], count: int, seed: int) -> set[str]:
    return {s for _, s in sorted((_key(s, seed), s) for s in set(ids))[:count]}


# --- the rule ----------------------------------------------------------------------------------


def test_the_key_is_the_documented_hash() -> None:
    for source_id in ("p000", "plain-1", "é/ü:1", ""):
        for seed in (0, 7):
            assert split_key(source_id, seed) == _key(source_id, seed)
    assert split_key("p000", 0) != split_key("p000", 1)


def test_a_fraction_holds_out_about_that_share_and_is_stable_as_the_source_grows() -> None:
    rule = SplitRule(fraction=0.05, seed=3)
    small = [f"row-{i}" for i in range(2000)]
    grown = small + [f"new-{i}" for i in range(2000)]
    held_small, held_grown = validation_ids(small, rule), validation_ids(grown, rule)
    assert held_small == _held_fraction(small, 0.05, 3)
    assert held_grown & set(small) == held_small  # no earlier conversation changed split
    assert 0.03 < len(held_grown) / len(grown) < 0.07


def test_a_count_takes_the_lowest_keys_and_growth_only_moves_some_back_to_train() -> None:
    rule = SplitRule(count=20, seed=0)
    small = [f"row-{i}" for i in range(300)]
    grown = small + [f"new-{i}" for i in range(300)]
    held_small, held_grown = validation_ids(small, rule), validation_ids(grown, rule)
    assert held_small == _held_count(small, 20, 0) and len(held_grown) == 20
    assert held_grown & set(small) <= held_small  # nothing of train entered validation


def test_the_rule_says_itself_in_words() -> None:
    assert SplitRule(fraction=0.05, seed=2).describe() == (
        "the conversations whose key is below 0.05 x 2^64 (0.05 of them on average), "
        "the key being sha256 of seed 2 and the source id"
    )
    assert SplitRule(count=1200).describe().startswith("the 1,200 conversations with the lowest keys")
    with pytest.raises(ValueError, match="exactly one"):
        SplitRule(fraction=0.1, count=3)


def test_the_table_mask_agrees_with_the_rule_row_by_row() -> None:
    ids = [f"c{i % 97}" for i in range(1000)]  # several rows per conversation
    table = pa.table({"source_id": ids})
    rule = SplitRule(fraction=0.2, seed=5)
    held = _held_fraction(ids, 0.2, 5)
    validation = split_mask(table, "validation", rule).to_pylist()
    assert validation == [s in held for s in ids]
    assert split_mask(table, "train", frozenset(held)).to_pylist() == [s not in held for s in ids]


# --- the recipe section ------------------------------------------------------------------------


def test_a_recipe_without_splits_keeps_its_fingerprint_and_dict() -> None:
    plain = load_recipe(BASE)
    assert load_recipe({**BASE, "splits": {}}).fingerprint == plain.fingerprint
    assert load_recipe({**BASE, "splits": None}).fingerprint == plain.fingerprint
    assert "splits" not in plain.to_dict()
    assert plain.splits.rule is None


def test_a_split_gets_its_own_fingerprint_and_round_trips() -> None:
    plain = load_recipe(BASE).fingerprint
    prints = {
        load_recipe({**BASE, "splits": splits}).fingerprint
        for splits in ({"validation": 0.05}, {"validation": 0.05, "seed": 1}, {"validation": 0.1},
                       {"validation": 5})
    }  # fmt: skip
    assert len(prints) == 4 and plain not in prints
    held = load_recipe({**BASE, "splits": {"validation": 0.05, "seed": 2}})
    assert held.to_dict()["splits"] == {"validation": 0.05, "seed": 2}
    again = load_recipe(yaml.safe_load(held.to_yaml()))
    assert again.fingerprint == held.fingerprint and again.splits.rule == SplitRule(fraction=0.05, seed=2)
    assert load_recipe({**BASE, "splits": {"validation": 3}}).splits.rule == SplitRule(count=3)


@pytest.mark.parametrize(
    ("splits", "field", "words"),
    [
        ({"validation": 0}, "splits.validation", "at least 1 conversation"),
        ({"validation": -2}, "splits.validation", "at least 1 conversation"),
        ({"validation": 0.0}, "splits.validation", "between 0 and 1"),
        ({"validation": 1.0}, "splits.validation", "a count of conversations is an integer"),
        ({"validation": 1.5}, "splits.validation", "between 0 and 1"),
        ({"validation": "5%"}, "splits.validation", "a fraction between 0 and 1"),
        ({"validation": True}, "splits.validation", "a fraction between 0 and 1"),
        ({"validation": float("nan")}, "splits.validation", "a fraction between 0 and 1"),
        ({"seed": 3}, "splits.validation", "required with splits.seed"),
        ({"validation": 0.1, "seed": -1}, "splits.seed", "integer >= 0"),
        ({"validation": 0.1, "sed": 1}, "splits.sed", "did you mean 'seed'"),
        ("0.05", "splits", "expected a mapping"),
    ],
)
def test_bad_splits_name_the_field(splits: Any, field: str, words: str) -> None:
    with pytest.raises(RecipeError) as caught:
        load_recipe({**BASE, "splits": splits})
    assert caught.value.field == field
    assert words in str(caught.value)


def test_asking_for_validation_of_a_recipe_without_splits_says_so_before_building(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match=r"holds no split out.*splits: \{validation: 0.05\}") as caught:
        eagle3_raw.load("demo", split="validation", cache_dir=str(tmp_path / "cache"),
                        journal_dir=tmp_path / "journals", progress="none")  # fmt: skip
    assert caught.value.field == "splits.validation"
    assert not (tmp_path / "journals").exists()  # nothing was built


# --- a set built on the reference server ---------------------------------------------------------


def _prompts(count: int, start: int = 0) -> list[dict[str, Any]]:
    return [{"id": f"p{i:03d}", "prompt": f"Say something about number {i}."} for i in range(start, count)]


def _recipe(folder: Path, **more: Any) -> Path:
    raw = {
        "name": "held",
        "prompts": {"source": "prompts.jsonl", "id_column": "id"},
        "server": {"launch": "reference"},
        "sampling": {"max_new_tokens": 12, "temperature": 0.7, "samples_per_prompt": 2, "seed": 1},
        "splits": {"validation": 0.05, "seed": 0},
        **more,
    }
    path = folder / "held.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _run(folder: Path) -> dict[str, Any]:
    return {"journal_dir": folder / "journals", "progress": "none"}


def _ids(rows: datasets.Dataset) -> list[str]:
    return list(rows["id"])


@pytest.mark.slow
def test_a_five_percent_split_is_whole_conversations_stable_as_the_source_grows(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "prompts.jsonl", _prompts(60))
    recipe, cache = _recipe(tmp_path), tmp_path / "cache"
    first = build(str(recipe), cache_dir=cache, run_options=_run(tmp_path))
    assert first.validation is not None and set(first.splits) == {"train", "validation"}
    train, held = set(first.dataset["source_id"]), set(first.validation["source_id"])
    assert not train & held  # no source row in both splits
    assert held == _held_fraction(train | held, 0.05, 0) and held  # the rule, recomputed
    assert len(first.dataset) + len(first.validation) == 120  # 60 conversations x 2 samples

    loaded = datasets.load_dataset("eagle3_raw", recipe=str(recipe), split="validation",
                                   cache_dir=str(cache), **_run(tmp_path))  # fmt: skip
    assert loaded.to_list() == first.validation.to_list()
    same = eagle3_raw.load(str(recipe), split="validation", cache_dir=str(cache), **_run(tmp_path))
    assert same.to_list() == first.validation.to_list()

    write_jsonl(tmp_path / "prompts.jsonl", _prompts(140))  # the source grows
    grown = build(str(recipe), cache_dir=cache, run_options=_run(tmp_path))
    assert grown.validation is not None and grown.config_id != first.config_id
    grown_held = set(grown.validation["source_id"])
    assert grown_held & (train | held) == held  # every earlier row kept its split
    assert set(grown.dataset["source_id"]) >= train
    assert grown_held == _held_fraction(set(grown.dataset["source_id"]) | grown_held, 0.05, 0)
    earlier = {r["id"]: r["input_ids"] for r in first.validation.to_list() + first.dataset.to_list()}
    later = {r["id"]: r["input_ids"] for r in grown.validation.to_list() + grown.dataset.to_list()}
    assert all(later[i] == ids for i, ids in earlier.items())  # the same rows, from the journal


@pytest.mark.slow
def test_both_splits_export_and_read_back_identical(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_jsonl(tmp_path / "prompts.jsonl", _prompts(40))
    recipe, cache = _recipe(tmp_path, splits={"validation": 4, "seed": 9}), tmp_path / "cache"
    built = build(str(recipe), cache_dir=cache, run_options=_run(tmp_path))
    assert built.validation is not None
    held = set(built.validation["source_id"])
    assert held == _held_count(set(built.dataset["source_id"]) | held, 4, 9) and len(held) == 4
    for layout in ("specforge", "speculators", "modelopt", "parquet"):
        out = tmp_path / f"out-{layout}"
        done = export(recipe=str(recipe), layout=layout, output_dir=out, cache_dir=cache,
                      run_options=_run(tmp_path))  # fmt: skip
        assert done.validation_file is not None and done.validation_rows == len(built.validation)
        assert done.rows_written == len(built.dataset)
        for path, rows in ((done.data_file, built.dataset), (done.validation_file, built.validation)):
            assert _read_back(path, layout) == _expected(rows, layout)
        text = done.render()
        assert str(done.validation_file) in text and "validation" in text
    speculators = tmp_path / "out-speculators"
    assert not list((speculators / "data").rglob("*validation*"))  # prepare-data reads data/ whole

    where = ["--cache-dir", str(cache), "--journal-dir", str(tmp_path / "journals")]
    code, out, _ = run_main(capsys, "stats", str(recipe), *where, "--split", "validation", "--plain")
    assert code == 0 and f"split validation: {len(built.validation)} rows" in out
    held_row = built.validation[0]["id"]
    code, out, _ = run_main(capsys, "inspect", str(recipe), *where, "--split", "validation", "--plain")
    assert code == 0 and held_row in out
    code, out, _ = run_main(
        capsys, "build", str(recipe), *where, "--quiet", "--output-dir", str(tmp_path / "pq")
    )
    assert code == 0 and f"validation {len(built.validation)} rows" in out
    import pyarrow.parquet as pq

    assert (
        pq.read_table(tmp_path / "pq" / "held-validation.parquet").to_pylist() == built.validation.to_list()
    )
    assert pq.read_table(tmp_path / "pq" / "held.parquet").num_rows == len(built.dataset)


def _read_back(path: Path, layout: str) -> list[dict[str, Any]]:
    if layout == "parquet":
        import pyarrow.parquet as pq

        return [{k: r[k] for k in ("id", "input_ids", "loss_mask")} for r in pq.read_table(path).to_pylist()]
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def _expected(rows: datasets.Dataset, layout: str) -> list[dict[str, Any]]:
    plain = ("id", "input_ids", "loss_mask")
    names = ("conversation_id", "token_ids", "loss_mask") if layout == "modelopt" else plain
    return [dict(zip(names, (r["id"], r["input_ids"], r["loss_mask"]), strict=True)) for r in rows.to_list()]


@pytest.mark.slow
def test_an_empty_split_says_why(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "prompts.jsonl", _prompts(3))
    recipe = _recipe(tmp_path, splits={"validation": 0.0001})
    with pytest.raises(FatalError, match=r"validation split is empty.*raise splits.validation"):
        build(str(recipe), cache_dir=tmp_path / "cache", run_options=_run(tmp_path))
    recipe = _recipe(tmp_path, splits={"validation": 5})
    with pytest.raises(FatalError, match=r"train split is empty.*lower splits.validation"):
        build(str(recipe), cache_dir=tmp_path / "cache", run_options=_run(tmp_path))


@pytest.mark.slow
def test_push_publishes_both_splits_and_their_counts(
    emulator: HubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", emulator.tokens.write)
    write_jsonl(tmp_path / "prompts.jsonl", _prompts(40))
    recipe = _recipe(tmp_path, splits={"validation": 0.1, "seed": 4})
    result = hub.push(str(recipe), "alice/held", tag="v1", run_options=_run(tmp_path))
    local = build(str(recipe), run_options=_run(tmp_path))
    assert local.validation is not None and not local.generated
    for split, rows in local.splits.items():
        published = datasets.load_dataset("alice/held", "held", revision="v1", split=split,
                                          token=emulator.tokens.write)  # fmt: skip
        assert published.to_list() == rows.to_list()
    files = emulator.files("alice/held", "v1")
    manifest = orjson.loads(files["recipes/held.manifest.json"])
    conversations = {s: len(set(rows["source_id"])) for s, rows in local.splits.items()}
    for split, rows in local.splits.items():
        assert manifest["splits"][split] == {"rows": len(rows), "conversations": conversations[split]}
    assert manifest["splits"]["rule"]["validation"] == 0.1 and manifest["splits"]["rule"]["seed"] == 4
    assert manifest["counts"]["rows"] == len(local.dataset) == result.rows
    assert result.validation_rows == len(local.validation)
    assert f"{len(local.dataset)} train and {len(local.validation)} validation rows" in result.render()
    card = files["README.md"].decode()
    assert f"| `validation` | {len(local.validation):,} | {conversations['validation']:,} |" in card
    assert 'split="validation"' in card

    again = hub.reproduce("alice/held@v1", run_options={"progress": "none"}, reference_server=True)
    assert again.full_agreement and again.published_rows == len(local.dataset) + len(local.validation)

    done = export(hub="alice/held@v1", layout="specforge", output_dir=tmp_path / "from-hub",
                  token=emulator.tokens.write, cache_dir=tmp_path / "hub-cache")  # fmt: skip
    assert done.validation_file is not None
    assert _read_back(done.validation_file, "specforge") == _expected(local.validation, "specforge")
    assert _read_back(done.data_file, "specforge") == _expected(local.dataset, "specforge")

    whole = _recipe(tmp_path, splits=None)  # the same config pushed again without a held-out split
    hub.push(str(whole), "alice/held", tag="v2", run_options=_run(tmp_path))
    rows = datasets.load_dataset(
        "alice/held", "held", revision="v2", split="train", token=emulator.tokens.write
    )
    assert len(rows) == len(local.dataset) + len(local.validation)
    with pytest.raises(ValueError, match="validation"):  # the earlier push's split is gone, files and all
        datasets.load_dataset(
            "alice/held", "held", revision="v2", split="validation", token=emulator.tokens.write
        )
    assert not [f for f in emulator.files("alice/held", "v2") if f.startswith("held/validation")]
    assert "splits" not in orjson.loads(emulator.files("alice/held", "v2")["recipes/held.manifest.json"])


@pytest.mark.slow
@pytest.mark.parametrize("validation", [0.3, 4])
def test_a_derived_set_is_split_after_its_rows_are_selected(tmp_path: Path, validation: float) -> None:
    write_jsonl(tmp_path / "prompts.jsonl", _prompts(30))
    sampling = {"max_new_tokens": 200, "temperature": 0.7, "samples_per_prompt": 2, "seed": 1}
    shaped = {"splits": {"validation": validation}, "sampling": sampling}
    parent = build(_recipe(tmp_path, **shaped), run_options=_run(tmp_path))
    rows = [*parent.dataset, *parent.validation]
    bound = sorted(sum(row["loss_mask"]) for row in rows)[len(rows) // 2]  # keeps about half
    derived = build(_recipe(tmp_path, **shaped, select={"max_output_len": bound}), run_options=_run(tmp_path))
    kept = {row["id"] for row in rows if sum(row["loss_mask"]) <= bound}
    assert 0 < len(kept) < len(rows)
    assert sorted([*_ids(derived.dataset), *_ids(derived.validation)]) == sorted(kept)
    source_ids = [row["source_id"] for row in [*derived.dataset, *derived.validation]]
    held = (
        _held_fraction(source_ids, validation, 0)
        if isinstance(validation, float)
        else _held_count(source_ids, validation, 0)
    )  # the count's lowest keys among the selected rows' conversations
    assert {row["source_id"] for row in derived.validation} == held
    assert not held & {row["source_id"] for row in derived.dataset}
