"""Selection (issue 24): a derived set of a set, by a recipe's ``select`` rules.

The rules are recomputed here from the parent set's rows, independently of
:mod:`eagle3_raw.selection` (plain Python over the rows as ``load_dataset`` gives them), and the
derived set must hold exactly the rows they keep, in the parent's order, with every dropped row
counted once under the first rule that drops it. Sets are built with the reference server.
"""

from __future__ import annotations

import math
import shutil
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import orjson
import pytest
import yaml

from eagle3_raw import hub
from eagle3_raw.builder import Built, build
from eagle3_raw.errors import FatalError, RecipeError
from eagle3_raw.export import export
from eagle3_raw.recipe import load_recipe
from eagle3_raw.resources import builder_scripts_dir
from eagle3_raw.selection import NearDuplicates, lowest_accept, repetition_rate

try:
    from tests.support.hub_server import HubServer, hub_server
    from tests.support.hub_server import hub as hub_fixture
except ModuleNotFoundError:  # `tests` is a package only when the repo root is on sys.path
    from support.hub_server import HubServer, hub_server  # type: ignore[no-redef]
    from support.hub_server import hub as hub_fixture  # type: ignore[no-redef]

emulator = hub_fixture
__all__ = ["emulator", "hub_server"]  # fixtures used by name

REPO = "alice/selected"
SPECULATE = [
    "--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
    "--speculative-num-draft-tokens", "4", "--draft-acceptance", "0.6",
]  # fmt: skip
PARENT: dict[str, Any] = {
    "name": "chats",
    "prompts": {"source": "plain.jsonl", "id_column": "id"},
    "server": {"launch": "reference", "launch_args": SPECULATE},
    "sampling": {"max_new_tokens": 96, "temperature": 0.9, "seed": 3, "samples_per_prompt": 2},
}


# --- the rules on crafted values ---------------------------------------------------------------


def naive_rate(ids: Sequence[int], n: int) -> float:
    """The repetition rate as the docs define it, the slow way."""
    grams = [tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)]
    seen: set[tuple[int, ...]] = set()
    repeats = 0
    for gram in grams:
        repeats += gram in seen
        seen.add(gram)
    return repeats / len(grams) if grams else 0.0


def test_repetition_rate_is_the_share_of_ngrams_seen_earlier_in_the_span() -> None:
    assert repetition_rate([1, 2, 3, 1, 2, 3, 1, 2, 3], 3) == pytest.approx(4 / 7)
    assert repetition_rate([7] * 10, 1) == pytest.approx(0.9)
    assert repetition_rate([1, 2, 3, 4], 2) == 0.0
    assert repetition_rate([1, 2], 4) == repetition_rate([], 1) == 0.0
    rng = np.random.default_rng(5)
    for _ in range(200):
        loop = list(rng.integers(0, 6, rng.integers(1, 5)))
        ids = [*rng.integers(0, 50, rng.integers(0, 30)), *loop * int(rng.integers(1, 8))]
        n = int(rng.integers(1, 6))
        assert repetition_rate(ids, n) == pytest.approx(naive_rate(ids, n))


def test_lowest_accept_keeps_the_lowest_share_of_measured_rows_ties_to_the_earlier() -> None:
    accept = np.array([3.0, np.nan, 1.5, 2.0, 1.5, np.nan, 4.0])
    assert lowest_accept(accept, 0.4).tolist() == [False, False, True, False, True, False, False]
    assert lowest_accept(accept, 0.2).tolist() == [False, False, True, False, False, False, False]
    assert lowest_accept(accept, 1.0).tolist() == [True, False, True, True, True, False, True]


def test_minhash_finds_a_near_copy_and_not_an_unrelated_prompt() -> None:
    rng = np.random.default_rng(2)
    prompt = rng.integers(0, 6000, 400).astype(np.int32)
    copy, other = prompt.copy(), rng.integers(0, 6000, 400).astype(np.int32)
    copy[200] = 6001  # one id changed: 5 of ~396 shingles differ (Jaccard ~0.975)
    near = NearDuplicates(5)
    near.add(near.signature(prompt))
    assert near.matches(near.signature(copy), 0.9)
    assert not near.matches(near.signature(other), 0.1)


# --- the recipe section ------------------------------------------------------------------------


def _recipe(tmp_path: Path, **select: Any) -> Any:
    shutil.copy(builder_scripts_dir() / "prompts" / "plain.jsonl", tmp_path / "plain.jsonl")
    return load_recipe(_write(tmp_path, {**PARENT, "server": {"launch": "reference"}}, select or None))


def _write(folder: Path, raw: Mapping[str, Any], select: Mapping[str, Any] | None, name: str = "r") -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump({**raw, **({"select": dict(select)} if select is not None else {})}))
    return path


def test_a_recipe_selects_nothing_without_a_rule_and_keeps_its_fingerprint(tmp_path: Path) -> None:
    plain = _recipe(tmp_path)
    assert not plain.select.active and "select" not in plain.to_dict()
    for empty in (
        {},
        {"repetition_ngram": 8, "near_duplicate_shingle": 3},
        {"drop_duplicate_prompts": False},
    ):
        same = load_recipe(_write(tmp_path, {**PARENT, "server": {"launch": "reference"}}, empty))
        assert same.fingerprint == plain.fingerprint, empty
    ruled = _recipe(tmp_path, max_repetition=0.2, finish_reasons="stop")
    assert ruled.fingerprint != plain.fingerprint
    assert ruled.select.rules() == {"finish_reasons": ["stop"], "max_repetition": 0.2, "repetition_ngram": 4}
    assert _recipe(tmp_path, max_repetition=0.2, repetition_ngram=3).fingerprint != ruled.fingerprint
    again = load_recipe(_write(tmp_path, ruled.to_dict(), None, "again"))  # as push publishes it
    assert (again.select, again.fingerprint) == (ruled.select, ruled.fingerprint)


@pytest.mark.parametrize(
    ("select", "message"),
    [
        ({"max_repetition": 1.5}, "'select.max_repetition': got 1.5; expected a number from 0 to 1, or null"),
        ({"lowest_accept_fraction": 0}, "'select.lowest_accept_fraction': got 0; expected a number > 0 "
         "and <= 1"),
        ({"max_accept_length": -1}, "'select.max_accept_length': got -1; expected a number >= 0, or null"),
        ({"finish_reasons": ["abort"]}, "'select.finish_reasons': got ['abort']; expected a list of finish "
         "reasons from: stop, length"),
        ({"min_output_len": 9, "max_output_len": 3}, "'select.min_output_len': got 9; expected at most "
         "select.max_output_len (3)"),
        ({"max_repetitoin": 0.5}, "'select.max_repetitoin': got 0.5; unknown field (did you mean "
         "'max_repetition'?)"),
        ({"near_duplicate_threshold": 0}, "'select.near_duplicate_threshold': got 0; expected a similarity "
         "> 0 and <= 1 (e.g. 0.8), or null"),
        ({"repetition_ngram": 0}, "'select.repetition_ngram': got 0; expected an integer >= 1"),
        ({"drop_duplicate_prompts": "yes"}, "'select.drop_duplicate_prompts': got 'yes'; "
         "expected true or false"),
    ],
)  # fmt: skip
def test_a_bad_rule_is_refused_naming_the_field(tmp_path: Path, select: dict[str, Any], message: str) -> None:
    with pytest.raises(RecipeError) as caught:
        _recipe(tmp_path, **select)
    assert message in str(caught.value)


# --- derived sets, built ----------------------------------------------------------------------


class Sets:
    """A parent set built once on the speculating reference server, and sets derived from it."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        shutil.copy(builder_scripts_dir() / "prompts" / "plain.jsonl", folder / "plain.jsonl")
        self.parent_path = _write(folder, PARENT, None, "chats")
        self.parent = self.build(self.parent_path)
        self.rows = self.parent.dataset.to_list()

    @property
    def options(self) -> dict[str, Any]:
        return {"journal_dir": self.folder / "journals", "progress": "none"}

    def build(self, recipe: Path) -> Built:
        return build(str(recipe), cache_dir=self.folder / "cache", run_options=self.options)

    def derive(self, name: str, select: Mapping[str, Any]) -> tuple[Path, Built]:
        path = _write(self.folder, {**PARENT, "name": name}, select, name)
        return path, self.build(path)


@pytest.fixture(scope="module")
def sets(tmp_path_factory: pytest.TempPathFactory) -> Sets:
    made = Sets(tmp_path_factory.mktemp("select"))
    assert len(made.rows) == 80
    return made


def _accept(row: Mapping[str, Any]) -> float | None:
    value = (row["meta"] or {}).get("spec_accept_length")
    return None if value is None else float(value)


def _lengths(row: Mapping[str, Any]) -> dict[str, int]:
    return {"prompt": row["prompt_len"], "output": sum(row["loss_mask"]), "total": len(row["input_ids"])}


def _row_rate(row: Mapping[str, Any], n: int) -> float:
    return max((naive_rate(row["input_ids"][s["start"] : s["end"]], n) for s in row["spans"]), default=0.0)


def _first_reason(i: int, row: Mapping[str, Any], rules: Mapping[str, Any], lowest: set[int]) -> str | None:
    """The first row rule (the documented order) that drops ``row``, the ``i``-th parent row."""
    if "finish_reasons" in rules and row["finish_reason"] not in rules["finish_reasons"]:
        return "finish_reasons"
    lengths = _lengths(row)
    for what in ("prompt", "output", "total"):
        low, high = rules.get(f"min_{what}_len"), rules.get(f"max_{what}_len")
        if low is not None and lengths[what] < low:
            return f"min_{what}_len"
        if high is not None and lengths[what] > high:
            return f"max_{what}_len"
    accept = _accept(row)
    if {"min_accept_length", "max_accept_length", "lowest_accept_fraction"} & set(rules):
        if accept is None:
            return "accept_not_measured"
        if accept < rules.get("min_accept_length", -math.inf):
            return "min_accept_length"
        if accept > rules.get("max_accept_length", math.inf):
            return "max_accept_length"
        if "lowest_accept_fraction" in rules and i not in lowest:
            return "lowest_accept_fraction"
    if (
        "max_repetition" in rules
        and _row_rate(row, rules.get("repetition_ngram", 4)) > rules["max_repetition"]
    ):
        return "max_repetition"
    return None


def expected(rows: Sequence[Mapping[str, Any]], rules: Mapping[str, Any]) -> tuple[list[str], Counter[str]]:
    """The ids of the rows ``rules`` keep and the dropped rows by first reason, as the docs say."""
    lowest: set[int] = set()
    if "lowest_accept_fraction" in rules:
        measured = sorted((a, i) for i, r in enumerate(rows) if (a := _accept(r)) is not None)
        lowest = {i for _, i in measured[: math.ceil(rules["lowest_accept_fraction"] * len(measured))]}
    kept, dropped, prompts = [], Counter[str](), set()
    for i, row in enumerate(rows):
        reason = _first_reason(i, row, rules, lowest)
        prompt = tuple(row["input_ids"][: row["prompt_len"]])
        if reason is None and rules.get("drop_duplicate_prompts") and prompt in prompts:
            reason = "drop_duplicate_prompts"
        if reason is None:
            kept.append(row["id"])
            prompts.add(prompt)
        else:
            dropped[reason] += 1
    return kept, dropped


def _as_parent(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Rows but for ``meta.attempts``: a derived set's build reuses the parent's generations, so
    its rows count no attempt of their own (as any set whose requests were journaled before)."""
    return [{**row, "meta": {k: v for k, v in row["meta"].items() if k != "attempts"}} for row in rows]


def _quantile(values: Sequence[float], share: float) -> float:
    return float(sorted(values)[int(share * (len(values) - 1))])


def _rules(sets: Sets, kind: str) -> dict[str, Any]:
    """Rules whose bounds come from the parent's own distribution, so each drops some rows."""
    accept = [a for r in sets.rows if (a := _accept(r)) is not None]
    rates = [_row_rate(r, 3) for r in sets.rows]
    totals = [_lengths(r)["total"] for r in sets.rows]
    if kind == "acceptance and repetition":
        return {"max_accept_length": _quantile(accept, 0.5), "max_repetition": _quantile(rates, 0.7),
                "repetition_ngram": 3}  # fmt: skip
    if kind == "lowest acceptance, duplicates":
        return {"lowest_accept_fraction": 0.4, "drop_duplicate_prompts": True}
    assert kind == "lengths and finish reasons"
    return {"finish_reasons": ["stop"], "max_total_len": int(_quantile(totals, 0.8)), "min_output_len": 8,
            "min_accept_length": _quantile(accept, 0.1)}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["acceptance and repetition", "lowest acceptance, duplicates",
                                  "lengths and finish reasons"])  # fmt: skip
def test_a_derived_set_holds_exactly_the_rows_its_rules_keep(sets: Sets, kind: str) -> None:
    from eagle3_raw.selection import report

    rules = _rules(sets, kind)
    path, derived = sets.derive("chats-" + kind.split()[0], rules)
    ids, dropped = expected(sets.rows, rules)
    assert 0 < len(ids) < len(sets.rows) and dropped
    assert derived.dataset["id"] == ids
    by_id = {row["id"]: row for row in sets.rows}
    assert _as_parent(derived.dataset.to_list()) == _as_parent([by_id[i] for i in ids])
    assert derived.config_id != sets.parent.config_id
    assert derived.run_result is not None  # built, from the parent's generations: no request sent
    assert (derived.run_result.summary.run_rows, derived.run_result.summary.run_reused) == (0, len(sets.rows))
    made = report(load_recipe(path), derived.journal_dir)
    assert made is not None
    assert made.to_dict() == {
        "parent": {"config_id": sets.parent.config_id, "pushed": []},
        "rules": load_recipe(path).select.rules(),
        "parent_rows": len(sets.rows),
        "kept": len(ids),
        "dropped": dict(dropped),
    }
    order = ["finish_reasons", "min_prompt_len", "max_prompt_len", "min_output_len", "max_output_len",
             "min_total_len", "max_total_len", "accept_not_measured", "min_accept_length",
             "max_accept_length", "lowest_accept_fraction", "max_repetition",
             "drop_duplicate_prompts"]  # fmt: skip
    assert list(made.to_dict()["dropped"]) == [reason for reason in order if reason in dropped]


@pytest.mark.slow
def test_a_derived_set_reads_back_from_the_cache_and_loads_by_name(sets: Sets) -> None:
    rules = _rules(sets, "acceptance and repetition")
    path, first = sets.derive("chats-again", rules)
    again = sets.build(path)
    assert not again.generated and again.dataset.to_list() == first.dataset.to_list()
    loaded = datasets.load_dataset("eagle3_raw", recipe=str(path), split="train",
                                   cache_dir=str(sets.folder / "cache"), **sets.options)  # fmt: skip
    assert loaded["id"] == first.dataset["id"]
    overridden = build(str(sets.parent_path), overrides={"select": rules}, cache_dir=sets.folder / "cache",
                       run_options=sets.options)  # fmt: skip
    assert overridden.dataset["id"] == first.dataset["id"]  # select given as an override
    assert overridden.config_id not in (first.config_id, sets.parent.config_id)  # another name: another id


@pytest.mark.slow
def test_a_derived_set_pushes_with_its_parent_named_and_exports(
    sets: Sets, emulator: HubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", emulator.tokens.write)
    hub.push(str(sets.parent_path), REPO, tag="v1", cache_dir=sets.folder / "cache", run_options=sets.options)
    rules = _rules(sets, "acceptance and repetition")
    path = _write(sets.folder, {**PARENT, "name": "chats-hard"}, rules, "chats-hard")
    pushed = hub.push(str(path), REPO, tag="v2", cache_dir=sets.folder / "cache", run_options=sets.options)
    ids, dropped = expected(sets.rows, rules)
    assert pushed.rows == len(ids)

    files = emulator.files(REPO, "v2")
    manifest = orjson.loads(files["recipes/chats-hard.manifest.json"])
    assert manifest["selection"]["parent"] == {"config_id": sets.parent.config_id, "pushed": [f"{REPO}@v1"]}
    assert manifest["selection"]["dropped"] == dict(dropped) and manifest["selection"]["kept"] == len(ids)
    assert manifest["config_id"] != sets.parent.config_id and manifest["counts"]["rows"] == len(ids)
    card = files["README.md"].decode()
    section = card.split("<!-- eagle3_raw:config:chats-hard:start -->")[1].split("### How it was made")[0]
    assert f"`{sets.parent.config_id}` (published as `{REPO}@v1`)" in section
    assert f"{len(ids)} of its {len(sets.rows)} rows" in section
    for reason, count in dropped.items():
        assert f"| `{reason}` | {count} |" in section
    assert "### Selection" not in card.split("<!-- eagle3_raw:config:chats:start -->")[1].split(":end -->")[0]

    rows = datasets.load_dataset(
        REPO, "chats-hard", revision="v2", split="train", token=emulator.tokens.write
    )
    assert rows["id"] == ids
    done = export(recipe=str(path), output_dir=tmp_path / "out", layout="specforge",
                  cache_dir=sets.folder / "cache", run_options=sets.options)  # fmt: skip
    lines = [orjson.loads(line) for line in (tmp_path / "out" / "chats-hard.jsonl").read_bytes().splitlines()]
    assert [line["id"] for line in lines] == ids and done is not None


# --- the command line ---------------------------------------------------------------------------


def test_select_writes_a_derived_recipe_whose_parent_is_the_recipe(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from eagle3_raw.selection import parent_recipe
    from tests.helpers import error_line, run_main

    original = _recipe(tmp_path)
    source = tmp_path / "r.yaml"
    out = tmp_path / "derived" / "hard.yaml"
    out.parent.mkdir()
    argv = ["select", str(source), "--name", "hard", "--out", str(out), "--max-accept-length", "2.5",
            "--max-repetition", "0.3", "--repetition-ngram", "3", "--finish-reasons", "stop",
            "--drop-duplicate-prompts"]  # fmt: skip
    code, stdout, _ = run_main(capsys, *argv)
    assert code == 0 and f"eagle3-raw build {out}" in stdout
    derived = load_recipe(out)  # its prompt file found from its own folder
    assert derived.name == "hard" and yaml.safe_load(out.read_text())["prompts"]["source"] == "../plain.jsonl"
    assert derived.select.rules() == {
        "finish_reasons": ["stop"], "max_accept_length": 2.5, "max_repetition": 0.3, "repetition_ngram": 3,
        "drop_duplicate_prompts": True,
    }  # fmt: skip
    assert parent_recipe(derived).fingerprint == original.fingerprint != derived.fingerprint

    code, _, err = run_main(capsys, *argv)
    assert code == 1 and error_line(err).endswith("exists: choose another --out, or --force to replace it")
    code, _, err = run_main(capsys, *argv[:5], str(tmp_path / "x.yaml"), "--max-repetition", "2")
    assert code == 1 and "'select.max_repetition': got 2; expected a number from 0 to 1" in error_line(err)
    code, _, err = run_main(capsys, *argv[:5], str(tmp_path / "x.yaml"))
    assert code == 1 and "give at least one rule" in error_line(err)


@pytest.mark.slow
def test_acceptance_rules_on_a_set_without_figures_say_why_nothing_is_kept(tmp_path: Path) -> None:
    shutil.copy(builder_scripts_dir() / "prompts" / "plain.jsonl", tmp_path / "plain.jsonl")
    plain = {**PARENT, "server": {"launch": "reference"}, "prompts": {**PARENT["prompts"], "limit": 4}}
    path = _write(tmp_path, plain, {"max_accept_length": 9.0}, "plain")
    with pytest.raises(FatalError) as caught:
        build(
            str(path),
            cache_dir=tmp_path / "cache",
            run_options={"journal_dir": tmp_path / "j", "progress": "none"},
        )
    assert str(caught.value) == (
        "recipe 'chats' kept no row: select: kept 0 of 8 rows; dropped: accept_not_measured 8 (the parent's "
        "rows have no acceptance figures: was its server speculating?); loosen its select rules"
    )


def _shingles(ids: Sequence[int], k: int) -> set[tuple[int, ...]]:
    return {tuple(ids[i : i + k]) for i in range(max(1, len(ids) - k + 1))}


@pytest.mark.slow
def test_near_duplicate_prompts_are_dropped_and_distinct_ones_kept(tmp_path: Path) -> None:
    """Prompts and near copies (one word changed) whose shingle Jaccard similarities are far from
    the threshold on both sides: the derived set keeps exactly the first of each group."""
    words = [
        "river",
        "stone",
        "cloud",
        "lantern",
        "meadow",
        "copper",
        "violin",
        "harbor",
        "ember",
        "willow",
        "quartz",
        "falcon",
    ]
    rng = np.random.default_rng(11)
    prompts = []
    for group in range(6):
        text = [str(w) for w in rng.choice(words, 60)]
        prompts.append({"id": f"g{group}-0", "prompt": f"Story {group}: " + " ".join(text)})
        for copy in range(1, 1 + group % 3):
            changed = [*text[:30], "saffron", *text[31:]]
            prompts.append({"id": f"g{group}-{copy}", "prompt": f"Story {group}: " + " ".join(changed)})
    (tmp_path / "plain.jsonl").write_bytes(b"".join(orjson.dumps(p) + b"\n" for p in prompts))
    raw = {**PARENT, "sampling": {**PARENT["sampling"], "samples_per_prompt": 1, "max_new_tokens": 8}}
    options = {"journal_dir": tmp_path / "j", "progress": "none"}
    parent = build(str(_write(tmp_path, raw, None, "p")), cache_dir=tmp_path / "cache", run_options=options)
    rows = parent.dataset.to_list()
    threshold = 0.8
    kept: list[dict[str, Any]] = []
    for row in rows:
        shingles = _shingles(row["input_ids"][: row["prompt_len"]], 5)
        similar = [
            len(shingles & s) / len(shingles | s)
            for s in (_shingles(k["input_ids"][: k["prompt_len"]], 5) for k in kept)
        ]
        assert all(j >= 0.85 or j <= 0.5 for j in similar), similar  # far from the threshold
        if not any(j >= threshold for j in similar):
            kept.append(row)
    assert [r["id"] for r in kept] == [f"g{g}-0:1:0" for g in range(6)] and len(rows) == 12
    path = _write(tmp_path, {**raw, "name": "distinct"}, {"near_duplicate_threshold": threshold}, "d")
    derived = build(str(path), cache_dir=tmp_path / "cache", run_options=options)
    assert derived.dataset["id"] == [r["id"] for r in kept]
