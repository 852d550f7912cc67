"""From set to trainer (issue 15): exports and draft-vocabulary files, checked against the set itself.

The set is real (the reference server generates it); every expectation is computed here from the
set's rows, independently of eagle3_raw's export code. The trainers are not installed here:
``scripts/prove_trainers.py`` feeds these files to SpecForge's and speculators' own code. The
``.pt`` files are read by :func:`_torch_load`, a stand-in for ``torch.load(weights_only=True)``
that accepts only the globals that does.
"""

from __future__ import annotations

import collections
import io
import pickle
import shutil
import struct
import zipfile
from collections import Counter
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import orjson
import pyarrow.parquet as pq
import pytest
import yaml

import eagle3_raw
from eagle3_raw import hub
from eagle3_raw.cli.main import main
from eagle3_raw.errors import ExportError, RecipeError
from eagle3_raw.export import ExportResult, export, torchfile
from eagle3_raw.export.lengths import apply, measure
from eagle3_raw.recipe import load_recipe
from tests.helpers import CHATS, write_jsonl

try:
    from tests.support.hub_server import HubServer, hub_server
    from tests.support.hub_server import hub as hub_fixture
except ModuleNotFoundError:  # `tests` is a package only when the repo root is on sys.path
    from support.hub_server import HubServer, hub_server  # type: ignore[no-redef]
    from support.hub_server import hub as hub_fixture  # type: ignore[no-redef]

emulator = hub_fixture
__all__ = ["emulator", "hub_server"]  # fixtures used by name

VOCAB = 6144  # the reference model's config.json vocab_size
REPO = "alice/chats"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, datasets.Dataset]:
    """A recipe with every kind of chat, all turns, two samples each; its set, built once."""
    folder = tmp_path_factory.mktemp("set")
    write_jsonl(folder / "prompts.jsonl", CHATS)
    raw = {
        "name": "chats",
        "prompts": {"source": "prompts.jsonl", "id_column": "id"},
        "turns": "all",
        "server": {"launch": "reference"},
        "sampling": {"max_new_tokens": 48, "temperature": 0.7, "samples_per_prompt": 2, "seed": 3},
        "export": {"draft_vocab_sizes": [64]},
    }
    recipe = folder / "chats.yaml"
    recipe.write_text(yaml.safe_dump(raw))
    rows = eagle3_raw.load(str(recipe), **_run(folder))
    assert len(rows) > 10
    return recipe, rows


def _run(folder: Path) -> dict[str, Any]:
    return {"cache_dir": str(folder / "cache"), "journal_dir": folder / "journals", "progress": "none"}


def _export(built: tuple[Path, datasets.Dataset], out: Path, **options: Any) -> ExportResult:
    recipe, _ = built
    run = _run(recipe.parent)
    cache = run.pop("cache_dir")
    return export(recipe=str(recipe), output_dir=out, cache_dir=cache, run_options=run, **options)


def _lines(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def _generated(rows: datasets.Dataset) -> Counter[int]:
    counts: Counter[int] = Counter()
    for row in rows:
        generated = row["input_ids"][row["prompt_len"] :]
        assert generated == [t for t, m in zip(row["input_ids"], row["loss_mask"], strict=True) if m]
        counts.update(generated)
    return counts


def _limit_that_cuts_drops_and_keeps(rows: datasets.Dataset) -> int:
    """A length some rows fit in, some exceed with supervision left, some exceed with none left."""
    for limit in range(1, max(len(r["input_ids"]) for r in rows)):
        over = sum(len(r["input_ids"]) > limit for r in rows)
        emptied = sum(r["prompt_len"] >= limit for r in rows)
        if 0 < emptied < over < len(rows):
            return limit
    raise AssertionError("the set has no such length")


def _selected(counts: Counter[int], size: int) -> list[int]:
    """The draft vocabulary by the stated rule, written out the slow way."""
    ranked = sorted(range(VOCAB), key=lambda t: (-counts.get(t, 0), t))
    return sorted(ranked[:size])


# --- a torch.load(weights_only=True) stand-in --------------------------------------------------------


class _Storage:
    def __init__(self, dtype: str) -> None:
        self.dtype = dtype


_ALLOWED = {
    ("torch._utils", "_rebuild_tensor_v2"): lambda storage, offset, size, stride, grad, hooks: storage[
        offset : offset + size[0]
    ],
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("torch", "LongStorage"): _Storage("<i8"),
    ("torch", "BoolStorage"): _Storage("|b1"),
}


def _torch_load(path: Path) -> Any:
    archive = zipfile.ZipFile(path)
    stem = archive.namelist()[0].split("/")[0]
    assert stem == path.stem
    _check_alignment(path.read_bytes(), archive)
    assert archive.read(f"{stem}/byteorder") == b"little" and archive.read(f"{stem}/version") == b"3\n"

    class Unpickler(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            if (module, name) not in _ALLOWED:
                raise pickle.UnpicklingError(f"weights_only refuses {module}.{name}")
            return _ALLOWED[(module, name)]

        def persistent_load(self, pid: Any) -> Any:
            kind, storage, key, location, count = pid
            assert (kind, location) == ("storage", "cpu")
            array = np.frombuffer(archive.read(f"{stem}/data/{key}"), dtype=storage.dtype)
            assert array.size == count
            return array

    return Unpickler(io.BytesIO(archive.read(f"{stem}/data.pkl"))).load()


def _check_alignment(raw: bytes, archive: zipfile.ZipFile) -> None:
    for info in archive.infolist():
        name_len, extra_len = struct.unpack("<HH", raw[info.header_offset + 26 : info.header_offset + 30])
        assert (info.header_offset + 30 + name_len + extra_len) % 64 == 0, info.filename
        assert info.compress_type == zipfile.ZIP_STORED


# --- layouts -----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_specforge_rows_are_the_sets_ids_and_masks_in_order(built: Any, tmp_path: Path) -> None:
    _, rows = built
    result = _export(built, tmp_path / "sf")
    lines = _lines(tmp_path / "sf" / "chats.jsonl")
    assert [list(line) for line in lines] == [["id", "input_ids", "loss_mask"]] * len(rows)
    assert [(r["id"], r["input_ids"], r["loss_mask"]) for r in rows] == [
        (line["id"], line["input_ids"], line["loss_mask"]) for line in lines
    ]
    assert (result.rows_read, result.rows_written) == (len(rows), len(rows))
    assert result.supervised_tokens == sum(_generated(rows).values())
    assert result.lengths is not None and result.lengths.applied is None  # SpecForge's 2048: reported only
    assert result.lengths.max_length == 2048


def test_boundary_variant_supervises_the_last_prompt_position_and_nothing_else(
    built: Any, tmp_path: Path
) -> None:
    _, rows = built
    plain = _export(built, tmp_path / "plain")
    extended = _export(built, tmp_path / "ext", extend_boundary=True)
    for row, line in zip(rows, _lines(tmp_path / "ext" / "chats.jsonl"), strict=True):
        expected = list(row["loss_mask"])
        expected[row["prompt_len"] - 1] = 1
        assert line["input_ids"] == row["input_ids"] and line["loss_mask"] == expected
    assert extended.supervised_tokens == plain.supervised_tokens + len(rows)
    # the frequencies are of generated ids: the extra position is a prompt token, not counted
    assert np.array_equal(extended.frequencies.counts, plain.frequencies.counts)


def test_truncate_cuts_rows_and_drops_those_left_unsupervised_as_reported(built: Any, tmp_path: Path) -> None:
    _, rows = built
    limit = _limit_that_cuts_drops_and_keeps(rows)
    result = _export(built, tmp_path / "t", max_length=limit)
    kept = [r for r in rows if min(len(r["input_ids"]), limit) > r["prompt_len"]]
    lines = _lines(tmp_path / "t" / "chats.jsonl")
    assert [(r["id"], r["input_ids"][:limit], r["loss_mask"][:limit]) for r in kept] == [
        (line["id"], line["input_ids"], line["loss_mask"]) for line in lines
    ]
    report = result.lengths
    assert report is not None and report.applied == "truncate" and report.max_length == limit
    over = [r for r in rows if len(r["input_ids"]) > limit]
    emptied = [r for r in rows if r["prompt_len"] >= limit]
    assert 0 < len(emptied) < len(over) < len(rows)
    assert report.rows_over == len(over)
    assert report.truncate.rows_truncated == len(over) - len(emptied)
    assert report.truncate.rows_dropped == len(emptied) == len(rows) - result.rows_written
    total = sum(_generated(rows).values())
    assert report.truncate.supervised_lost == total - result.supervised_tokens
    assert report.drop.rows_dropped == len(over)
    assert report.drop.supervised_lost == sum(len(r["input_ids"]) - r["prompt_len"] for r in over)
    assert result.longest_row == limit
    written = Counter(
        t for line in lines for t, m in zip(line["input_ids"], line["loss_mask"], strict=True) if m
    )
    assert dict(enumerate(result.frequencies.counts)) == {**dict.fromkeys(range(VOCAB), 0), **written}


def test_drop_leaves_longer_rows_out_whole(built: Any, tmp_path: Path) -> None:
    _, rows = built
    limit = sorted(len(r["input_ids"]) for r in rows)[len(rows) // 2]
    result = _export(built, tmp_path / "d", layout="jsonl", max_length=limit, overflow="drop")
    lines = _lines(tmp_path / "d" / "chats.jsonl")
    assert lines == [r for r in rows if len(r["input_ids"]) <= limit]
    assert result.lengths is not None and result.lengths.applied == "drop"
    assert result.lengths.drop.rows_dropped == len(rows) - len(lines) > 0


def test_modelopt_layout_names_the_columns_as_model_optimizer_does(built: Any, tmp_path: Path) -> None:
    _, rows = built
    result = _export(built, tmp_path / "m", layout="modelopt")
    lines = _lines(tmp_path / "m" / "chats.jsonl")
    assert lines == [
        {"conversation_id": r["id"], "token_ids": r["input_ids"], "loss_mask": r["loss_mask"]} for r in rows
    ]
    d2t = _torch_load(tmp_path / "m" / "d2t-64.pt")  # data.draft_vocab_cache: one int64 tensor
    assert d2t.dtype == np.int64 and d2t.shape == (64,)
    assert any("2338/2340" in command for command in result.commands)


def test_parquet_keeps_every_column_and_value(built: Any, tmp_path: Path) -> None:
    _, rows = built
    _export(built, tmp_path / "p", layout="parquet")
    table = pq.read_table(tmp_path / "p" / "chats.parquet")
    assert table.schema == rows.data.schema and table.to_pylist() == rows.to_list()


def test_speculators_layout_is_a_folder_of_rows_alone(built: Any, tmp_path: Path) -> None:
    out = tmp_path / "s"
    _export(built, out, layout="speculators", overrides=["name=old"])
    assert sorted(p.name for p in (out / "data").iterdir()) == ["old.jsonl"]
    result = _export(built, out, layout="speculators")  # the earlier export's own files go first
    assert sorted(p.name for p in (out / "data").iterdir()) == ["chats.jsonl"]
    assert {"token_freq.pt", "d2t-64.npy", "t2d-64.npy", "draft_vocab.json"} <= {
        p.name for p in out.glob("*")
    }
    prepare, train = result.commands
    assert f"--data {out}/data" in prepare and "--no-skip-token-freq" in prepare
    assert f"--seq-length {result.longest_row}" in prepare  # every row reaches the trainer whole
    assert f"--draft-vocab-size 64 --d2t-path {out}/d2t-64.npy --t2d-path {out}/t2d-64.npy" in train


@pytest.mark.parametrize("planted", ["data/notes.json", "mine.txt", "data"])
def test_export_writes_only_into_its_own_folder_and_deletes_nothing_else(
    built: Any, tmp_path: Path, planted: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 22, finding 6: `--layout speculators --output DIR` deleted DIR/data whatever it held."""
    recipe, _ = built
    mine = tmp_path / "mine"
    (mine / "data").mkdir(parents=True)
    (mine / "data" / "thesis.jsonl").write_text('{"chapter": 1}\n')
    run = _run(recipe.parent)
    argv = ["export", str(recipe), "--layout", "speculators", "--output", str(mine), "--quiet",
            "--cache-dir", run["cache_dir"], "--journal-dir", str(run["journal_dir"])]  # fmt: skip
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert f"--output {mine} is not empty and was not made by eagle3-raw export (it holds data)" in err
    assert (mine / "data" / "thesis.jsonl").read_text() == '{"chapter": 1}\n'  # untouched
    out = tmp_path / "out"
    _export(built, out, layout="speculators")
    target = out / planted
    if planted == "data":
        shutil.rmtree(target)
        target.write_text("a file where the export's folder was")
    else:
        target.write_text('{"added": "by the user"}\n')
    with pytest.raises(ExportError, match=rf"holds {planted}, which the earlier export there did not write"):
        _export(built, out, layout="speculators")
    assert target.exists()


# --- draft vocabulary --------------------------------------------------------------------------------


def test_frequencies_equal_a_direct_count_of_the_generated_ids(built: Any, tmp_path: Path) -> None:
    _, rows = built
    result = _export(built, tmp_path / "f")
    counted = _generated(rows)
    assert _torch_load(tmp_path / "f" / "token_freq.pt") == dict(sorted(counted.items()))
    summary = orjson.loads((tmp_path / "f" / "draft_vocab.json").read_bytes())
    assert summary["generated_tokens"] == sum(counted.values()) == result.frequencies.total
    assert summary["distinct_generated_ids"] == len(counted) and summary["target_vocab_size"] == VOCAB
    assert result.vocab_from == "the target model's config.json"


@pytest.mark.parametrize("size", [16, 64, 4096])  # ties among equal counts; more ids than were generated
def test_d2t_and_t2d_select_the_stated_ids_in_both_conventions(built: Any, tmp_path: Path, size: int) -> None:
    _, rows = built
    out = tmp_path / "v"
    result = _export(built, out, layout="jsonl", draft_vocab_sizes=[size])
    counts = _generated(rows)
    selected = _selected(counts, size)
    mapping = _torch_load(out / f"vocab_mapping-{size}.pt")
    assert list(mapping) == ["d2t", "t2d"]
    npy = (np.load(out / f"d2t-{size}.npy"), np.load(out / f"t2d-{size}.npy"))
    for d2t, t2d in [(mapping["d2t"], mapping["t2d"]), npy]:
        assert d2t.dtype == np.int64 and d2t.shape == (size,)
        assert t2d.dtype == np.bool_ and t2d.shape == (VOCAB,)
        assert int(t2d.sum()) == size
        assert [int(d2t[i]) + i for i in range(size)] == selected == np.flatnonzero(t2d).tolist()
    assert np.array_equal(_torch_load(out / f"d2t-{size}.pt"), mapping["d2t"])
    covered = sum(counts[t] for t in selected) / sum(counts.values())
    assert dict(result.coverage())[size] == pytest.approx(covered)
    assert (size > len(counts)) == (covered == 1.0)


def test_the_pt_writer_round_trips_large_and_negative_values(tmp_path: Path) -> None:
    values = {0: 0, 255: 256, 65535: 65536, 7: 2**31, 8: 2**40 + 1, 9: 2**63 - 1}
    (tmp_path / "freq.pt").write_bytes(torchfile.int_dict_file("freq", values))
    assert _torch_load(tmp_path / "freq.pt") == values
    d2t = np.array([0, -5, 2**33], dtype=np.int64)
    (tmp_path / "d2t.pt").write_bytes(torchfile.tensor_file("d2t", d2t))
    assert np.array_equal(_torch_load(tmp_path / "d2t.pt"), d2t)
    again = torchfile.tensors_file("m", {"d2t": d2t, "t2d": np.array([True, False])})
    assert again == torchfile.tensors_file("m", {"d2t": d2t, "t2d": np.array([True, False])})  # reproducible
    with pytest.raises(ValueError, match="only 1-D int64 or bool"):
        torchfile.tensor_file("x", np.zeros((2, 2), dtype=np.int64))


# --- lengths on Arrow batches that are slices of a bigger table ---------------------------------------


def test_length_accounting_on_a_sliced_batch() -> None:
    import pyarrow as pa

    table = pa.table(
        {
            "input_ids": pa.array([[1, 2, 3], [4, 5, 6, 7, 8], [9, 10], [11, 12, 13, 14]]),
            "loss_mask": pa.array([[0, 1, 1], [0, 0, 0, 1, 1], [0, 1], [0, 0, 0, 1]], pa.list_(pa.int8())),
        }
    ).slice(1)  # offsets no longer start at 0, as in every batch but the first
    measured = measure(table["loss_mask"], 3)
    assert measured.total.tolist() == [2, 1, 1] and measured.kept.tolist() == [0, 1, 0]
    assert measured.costs() == {
        "truncate_cut": 0, "truncate_dropped": 2, "truncate_lost": 3, "drop_dropped": 2, "drop_lost": 3,
    }  # fmt: skip
    cut = apply(table, measured, 3, "truncate")
    assert cut.to_pylist() == [{"input_ids": [9, 10], "loss_mask": [0, 1]}]


# --- options, the CLI, the recipe field, the function ----------------------------------------------


def test_bad_options_are_refused_with_what_is_allowed(built: Any, tmp_path: Path) -> None:
    recipe, _ = built
    with pytest.raises(ExportError, match="extend_boundary is for SpecForge"):
        export(recipe=str(recipe), output_dir=tmp_path, layout="speculators", extend_boundary=True)
    with pytest.raises(ExportError, match="max_length 0: expected an integer >= 1"):
        export(recipe=str(recipe), output_dir=tmp_path, max_length=0)
    with pytest.raises(ExportError, match="layout 'axolotl': expected one of specforge, speculators"):
        export(recipe=str(recipe), output_dir=tmp_path, layout="axolotl")
    with pytest.raises(ExportError, match="exactly one source"):
        export(output_dir=tmp_path)
    with pytest.raises(ExportError, match=r"draft vocabulary size 9000: expected 1\.\.6144"):
        _export(built, tmp_path / "x", draft_vocab_sizes=[9000])
    outside = r"row '.+' has token id \d+, outside the target vocabulary \(0\.\.99\)"
    with pytest.raises(ExportError, match=outside):
        _export(built, tmp_path / "y", target_vocab_size=100)


def test_recipe_names_draft_sizes_outside_the_fingerprint(tmp_path: Path) -> None:
    base = {"name": "r", "prompts": {"source": "p.jsonl"}, "server": {"launch": "reference"},
            "sampling": {"max_new_tokens": 8}}  # fmt: skip
    with_sizes = load_recipe({**base, "export": {"draft_vocab_sizes": [32000, 8192]}})
    assert with_sizes.export.draft_vocab_sizes == (8192, 32000)
    assert with_sizes.fingerprint == load_recipe(base).fingerprint
    assert load_recipe(yaml.safe_load(with_sizes.to_yaml())).export == with_sizes.export
    assert "export" not in load_recipe(base).to_dict()  # recipes without it publish as before
    for bad in ([0], [8, 8], "32000", [1.5]):
        with pytest.raises(RecipeError, match=r"export\.draft_vocab_sizes"):
            load_recipe({**base, "export": {"draft_vocab_sizes": bad}})
    with pytest.raises(RecipeError, match=r"export\.sizes"):
        load_recipe({**base, "export": {"sizes": [8]}})


def test_cli_prints_what_each_length_choice_costs_and_the_trainer_command(
    built: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe, rows = built
    run = _run(recipe.parent)
    argv = ["export", str(recipe), "--output", str(tmp_path / "c"), "--max-length", "40", "--quiet",
            "--cache-dir", run["cache_dir"], "--journal-dir", str(run["journal_dir"]),
            "--draft-vocab-size", "32"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "max_length 40: " in out and f"of {len(rows)} rows are longer" in out
    assert "applied truncate" in out and "would   drop" in out and "supervised tokens lost" in out
    assert "model.vocab_mapping_path=" + str(tmp_path / "c" / "vocab_mapping-32.pt") in out
    assert "data.max_length=40" in out and "data.train_data_path=" in out
    assert main(["export", "--output", str(tmp_path)]) == 1  # no source: a clear error, exit 1
    assert "give a RECIPE or --hub" in capsys.readouterr().err


def test_eagle3_raw_export_is_the_function_even_after_the_package_is_imported(
    built: Any, tmp_path: Path
) -> None:
    import eagle3_raw.cli.export  # binds the package over the function on eagle3_raw

    recipe, rows = built
    run = _run(recipe.parent)
    cache = run.pop("cache_dir")
    result = eagle3_raw.export(recipe=str(recipe), output_dir=tmp_path, cache_dir=cache, run_options=run)
    assert result.rows_written == len(rows)
    with pytest.raises(TypeError):
        eagle3_raw.export(str(recipe), tmp_path)  # type: ignore[call-arg]  # keyword-only


# --- published ---------------------------------------------------------------------------------------


@pytest.fixture()
def token(emulator: HubServer, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("HF_TOKEN", emulator.tokens.write)
    return emulator.tokens.write


def test_a_pushed_set_carries_the_vocab_files_and_the_card_the_coverage_and_commands(
    built: Any, emulator: HubServer, token: str, tmp_path: Path
) -> None:
    recipe, rows = built
    run = _run(recipe.parent)
    cache = run.pop("cache_dir")
    hub.push(str(recipe), REPO, tag="v1", cache_dir=Path(cache), run_options=run)
    files = emulator.files(REPO, "v1")
    folder = "recipes/chats/vocab/"
    vocab = {path.removeprefix(folder) for path in files if path.startswith(folder)}
    expected = {
        "token_freq.pt",
        "draft_vocab.json",
        "vocab_mapping-64.pt",
        "d2t-64.npy",
        "t2d-64.npy",
        "d2t-64.pt",
    }
    assert vocab == expected
    (tmp_path / "token_freq.pt").write_bytes(files["recipes/chats/vocab/token_freq.pt"])
    counts = _generated(rows)
    assert _torch_load(tmp_path / "token_freq.pt") == dict(sorted(counts.items()))
    t2d = np.load(io.BytesIO(files["recipes/chats/vocab/t2d-64.npy"]))
    assert np.flatnonzero(t2d).tolist() == _selected(counts, 64)

    card = files["README.md"].decode()
    total = sum(counts.values())
    for size in (1024, 2048, 4096):
        assert f"| {size:,} | {sum(counts[t] for t in _selected(counts, size)) / total:.2%} |" in card
    assert f"{total:,} tokens, {len(counts):,} distinct ids of the 6,144" in card
    longest = max(len(r["input_ids"]) for r in rows)
    assert (
        f"speculators prepare-data --model TARGET_MODEL --data hf:{REPO}:chats:train "
        f"--output ./training_data --seq-length {longest} --no-skip-token-freq"
    ) in card
    train = "speculators train --verifier-name-or-path TARGET_MODEL --data-path ./training_data"
    assert f"{train} --draft-vocab-size 64" in card
    assert (
        "specforge train -c online.yaml data.train_data_path= data.prompts_path=./export/chats.jsonl "
        f"data.max_length={longest} model.vocab_mapping_path=./export/vocab_mapping-64.pt"
    ) in card
    assert f"hf download {REPO} {folder}vocab_mapping-64.pt --repo-type dataset --revision v1" in card

    # the published set exports to the same rows, at the tag, with the published vocabulary size
    published = export(hub=f"{REPO}@v1", output_dir=tmp_path / "hub", layout="specforge", token=token)
    local = _export(built, tmp_path / "local")
    hub_rows, local_rows = (tmp_path / "hub" / "chats.jsonl"), (tmp_path / "local" / "chats.jsonl")
    assert hub_rows.read_bytes() == local_rows.read_bytes()
    assert published.vocab_from == "the published draft_vocab.json"
    assert np.array_equal(published.frequencies.counts, local.frequencies.counts)
    assert published.source == f"{REPO}@v1 config chats"
