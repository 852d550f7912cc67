"""A stranger's set is data on every command, not only in ``reproduce`` (issue 22).

As in ``test_untrusted.py``: alice publishes a small set on the Hub emulator, then its repo is made
hostile (anybody with write access to it could); the victim runs ``inspect``, ``stats``, ``export
--hub``, ``reproduce --work-dir`` and then ``build``/``push`` of the kept copy, with the real
``huggingface_hub`` and ``datasets`` clients. An attacker's server records every request it gets.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from huggingface_hub import CommitOperationAdd, HfApi

from eagle3_raw import hub
from eagle3_raw.cli.main import main
from eagle3_raw.errors import ExportError, HubError, RecipeError, SourceError
from eagle3_raw.export import export
from eagle3_raw.hub import strangers
from tests.helpers import generations, reference_server
from tests.support.hostile import HostileServer
from tests.test_untrusted import REPO, _evil_tokenizer, _publish, _tamper, token, victim

try:
    from tests.support.hub_server import HubServer, hub_server
    from tests.support.hub_server import hub as hub_fixture
except ModuleNotFoundError:  # `tests` is a package only when the repo root is on sys.path
    from support.hub_server import HubServer, hub_server  # type: ignore[no-redef]
    from support.hub_server import hub as hub_fixture  # type: ignore[no-redef]

emulator = hub_fixture
__all__ = ["emulator", "hub_server", "token", "victim"]  # fixtures used by name

BOMB = b"""\
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""


def _commit(token: str, files: dict[str, bytes], repo: str = REPO) -> str:
    """Commit ``files`` (repo path -> bytes) to ``repo`` as its writer; the commit."""
    api = HfApi(token=token)
    api.create_repo(repo, repo_type="dataset", exist_ok=True)
    operations = [CommitOperationAdd(path, data) for path, data in files.items()]
    return str(api.create_commit(repo, operations=operations, repo_type="dataset", commit_message="x").oid)


def _card_with(token: str, metadata: dict[str, Any], repo: str = REPO) -> None:
    """Replace ``repo``'s dataset card metadata by ``metadata`` (its body kept)."""
    card = yaml.safe_dump(metadata)
    _commit(token, {"README.md": f"---\n{card}---\n# hostile\n".encode()}, repo)


def _error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """Run the CLI, expect exit code 1, return its one-line error."""
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


# --- finding 1: inspect honoured the published trust_remote_code ----------------------------------


@pytest.mark.slow
def test_inspect_runs_no_published_code_unless_the_user_allows_it_pinned(
    emulator: HubServer, token: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    marker = tmp_path / "code-ran"
    _publish(tmp_path / "r")
    model = {"tokenizer": "haiku/tok", "trust_remote_code": True}
    commit = _tamper(token, {"model": model}, _evil_tokenizer(marker))
    cache = ["--cache-dir", str(tmp_path / "c"), "--limit", "1"]
    err = _error(capsys, ["inspect", REPO, *cache])
    assert "refused unless you pass --trust-remote-code" in err and not marker.exists()
    err = _error(capsys, ["inspect", REPO, "--trust-remote-code", *cache])
    assert "needs the code pinned to a commit" in err and not marker.exists()
    assert main(["inspect", f"{REPO}@{commit}", "--trust-remote-code", *cache]) == 0
    assert marker.exists()  # the user's own flag, at a commit
    assert "⟦generated⟧" in capsys.readouterr().out


@pytest.mark.slow
def test_inspect_runs_no_code_of_a_hub_tokenizer_the_published_recipe_names(
    emulator: HubServer, token: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's case: the recipe names a Hub tokenizer repo whose code reads the user's secrets."""
    marker = tmp_path / "code-ran"
    _publish(tmp_path / "r")
    api = HfApi(token=token)
    api.create_repo("alice/tok", exist_ok=True)
    files = {path.removeprefix("recipes/haiku/tok/"): data for path, data in _evil_tokenizer(marker).items()}
    operations = [CommitOperationAdd(path, data) for path, data in files.items()]
    commit = str(api.create_commit("alice/tok", operations=operations, commit_message="evil").oid)
    _tamper(token, {"model": {"tokenizer": "alice/tok", "revision": commit, "trust_remote_code": True}})
    err = _error(capsys, ["inspect", REPO, "--cache-dir", str(tmp_path / "c"), "--limit", "1"])
    assert "refused unless you pass --trust-remote-code" in err and not marker.exists()
    assert main(["inspect", REPO, "--cache-dir", str(tmp_path / "c"), "--limit", "1",
                 "--trust-remote-code"]) == 0  # fmt: skip
    assert marker.exists()  # pinned by the recipe's model.revision, allowed by the user


@pytest.mark.slow
@pytest.mark.parametrize("tokenizer", ["/usr/lib", "~/.aws", "../../../../../../../../../../etc"])
def test_inspect_reads_no_tokenizer_outside_the_published_repo(
    emulator: HubServer, token: str, tmp_path: Path, victim: Path,
    capsys: pytest.CaptureFixture[str], tokenizer: str,
) -> None:  # fmt: skip
    _publish(tmp_path / "r")
    _tamper(token, {"model": {"tokenizer": tokenizer}})
    err = _error(capsys, ["inspect", REPO, "--cache-dir", str(tmp_path / "c")])
    assert "'model.tokenizer'" in err and "refused: a published recipe names files" in err


# --- finding 2: a kept copy of a stranger's recipe --------------------------------------------------


@pytest.mark.slow
def test_a_kept_copy_of_a_published_recipe_is_refused_by_build_and_push(
    emulator: HubServer, token: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    marker = tmp_path / "executable-ran"
    _publish(tmp_path / "r")
    with HostileServer() as attacker:
        launcher = [
            "python", "-c", f"import pathlib; pathlib.Path({str(marker)!r}).write_text('ran')",
        ]  # fmt: skip
        hostile = {
            "launch": "sglang", "api_key_env": "HF_TOKEN", "sglang": {
                "model_path": "x", "executable": launcher, "env": {"LD_PRELOAD": "/tmp/evil.so"},
                "log_dir": str(tmp_path / "logs"),
            },
        }  # fmt: skip
        _tamper(token, {"server": hostile})
        work = tmp_path / "work"
        result = hub.reproduce(
            REPO, work_dir=work, reference_server=True, announce=[].append, run_options={"progress": "none"}
        )
        assert result.full_agreement
        kept = work / "hub" / "recipes" / "haiku.yaml"
        assert yaml.safe_load(kept.read_text())["server"]["launch"] == "sglang"  # kept as published
        journals = ["--journal-dir", str(tmp_path / "j")]
        for argv in (
            ["build", str(kept), *journals],
            ["build", str(kept), "--set", f"server.endpoints=[{attacker.url}]", *journals],
            ["push", str(kept), "--repo", "alice/copy", *journals],
        ):
            err = _error(capsys, argv)
            assert "a published recipe (from alice/eagle@" in err, err
            assert "kept by `eagle3-raw reproduce`" in err and "copy it out of that folder" in err
        with pytest.raises(RecipeError, match="kept by `eagle3-raw reproduce`"):
            hub.build(str(kept))
        assert attacker.requests == []
    assert not marker.exists() and not (tmp_path / "logs").exists() and not (tmp_path / "j").exists()
    assert "alice/copy" not in {r.path for r in emulator.requests}


@pytest.mark.slow
def test_a_recipe_planted_in_a_published_recipe_folder_is_refused_too(
    emulator: HubServer, token: str, tmp_path: Path
) -> None:
    _publish(tmp_path / "r")
    planted = yaml.safe_dump({"prompts": {"source": "x"}, "sampling": {"max_new_tokens": 1},
                              "server": {"launch": "reference"}}).encode()  # fmt: skip
    _commit(token, {"recipes/haiku/prompts/run-me.yaml": planted})
    hub.reproduce(REPO, work_dir=tmp_path / "w", reference_server=True, announce=[].append,
                  run_options={"progress": "none"})  # fmt: skip
    with pytest.raises(RecipeError, match="kept by `eagle3-raw reproduce`"):
        hub.build(str(tmp_path / "w" / "hub" / "recipes" / "haiku" / "prompts" / "run-me.yaml"))


# --- finding 7: inspect and export --hub within reproduce's bounds -----------------------------------


@pytest.mark.slow
def test_inspect_refuses_a_published_yaml_bomb(
    emulator: HubServer, token: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _publish(tmp_path / "r")
    assert len(BOMB) < 700
    _commit(token, {"recipes/haiku.yaml": BOMB + b"model: {tokenizer: [*i, *i]}\n"})
    err = _error(capsys, ["inspect", REPO, "--cache-dir", str(tmp_path / "c")])
    assert "expands to more than 100,000 values" in err


@pytest.mark.slow
def test_a_yaml_bomb_in_the_dataset_card_is_refused_before_datasets_reads_it(
    emulator: HubServer, token: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _publish(tmp_path / "r")
    small = b"".join(BOMB.splitlines(keepends=True)[:6])  # 9^6 values: the Hub emulator expands it too
    _commit(token, {"README.md": b"---\n" + small + b"---\n# card\n"})
    for command in ("stats", "inspect"):
        err = _error(capsys, [command, REPO, "--cache-dir", str(tmp_path / "c")])
        assert "alice/eagle: its README.md metadata expands to more than 100,000 values" in err
    with pytest.raises(HubError, match=r"README\.md metadata expands"):
        export(hub=REPO, layout="specforge", output_dir=tmp_path / "out", cache_dir=tmp_path / "c")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("published", "refused"),
    [
        ({"target_vocab_size": 300_000_000}, "gives a vocabulary of 300000000 ids; expected 1 to 4,194,304"),
        ({"target_vocab_size": -1}, "gives a vocabulary of -1 ids"),
        ({"target_vocab_size": "6144"}, "gives a vocabulary of '6144' ids"),
    ],
)
def test_export_from_the_hub_bounds_the_published_vocabulary_size(
    emulator: HubServer, token: str, tmp_path: Path, published: dict[str, Any], refused: str
) -> None:
    _publish(tmp_path / "r")
    _commit(token, {"recipes/haiku/vocab/draft_vocab.json": json.dumps(published).encode()})
    with pytest.raises(HubError, match=refused):
        export(hub=REPO, layout="specforge", output_dir=tmp_path / "out", cache_dir=tmp_path / "c")
    with pytest.raises(ExportError, match="target vocabulary of 300,000,000 ids: expected 1 to 4,194,304"):
        export(hub=REPO, layout="specforge", output_dir=tmp_path / "o2", cache_dir=tmp_path / "c",
               target_vocab_size=300_000_000)  # fmt: skip


@pytest.mark.slow
def test_export_from_the_hub_refuses_a_huge_published_json_before_fetching_it(
    emulator: HubServer, token: str, tmp_path: Path
) -> None:
    _publish(tmp_path / "r")
    huge = b'{"target_vocab_size": 6144, "pad": "' + b"x" * (2 << 20) + b'"}'
    _commit(token, {"recipes/haiku/vocab/draft_vocab.json": huge})
    emulator.clear_requests()
    with pytest.raises(HubError, match=r"draft_vocab\.json is 2,097,\d+ bytes; at most 1,048,576 are read"):
        export(hub=REPO, layout="specforge", output_dir=tmp_path / "out", cache_dir=tmp_path / "c")
    assert not any("draft_vocab.json" in r.path and "/resolve/" in r.path for r in emulator.requests)


# --- finding 8: data files outside the repo, downloads without a cap -------------------------------


@pytest.mark.slow
def test_a_published_card_cannot_send_datasets_to_another_url(
    emulator: HubServer, token: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _publish(tmp_path / "r")
    with HostileServer() as attacker:
        for data_files in (
            f"{attacker.url}/rows.parquet",
            [{"split": "train", "path": [f"{attacker.url}/a.parquet"]}],
            "hf://datasets/bob/private@main/rows.parquet",
            "/etc/passwd",
            "../../../../etc/passwd",
        ):
            _card_with(token, {"configs": [{"config_name": "haiku", "data_files": data_files}]})
            err = _error(capsys, ["stats", REPO, "--cache-dir", str(tmp_path / "c")])
            assert "its dataset card's config 'haiku' names data file" in err, err
            assert "refused: a Hub dataset's files are read from its own repo only" in err
            with pytest.raises(HubError, match="names data file"):
                hub.reproduce(REPO, work_dir=tmp_path / "w", reference_server=True, announce=[].append,
                              run_options={"progress": "none"})  # fmt: skip
        assert attacker.requests == []


@pytest.mark.slow
def test_a_hub_prompt_source_cannot_send_datasets_to_another_url(
    emulator: HubServer, token: str, tmp_path: Path
) -> None:
    _publish(tmp_path / "r")
    with HostileServer() as attacker:
        rows = b'{"id": "1", "prompt": "hello"}\n'
        _commit(token, {"rows.jsonl": rows}, repo="alice/prompts")
        _card_with(token, {"configs": [{"config_name": "default", "data_files": f"{attacker.url}/x.jsonl"}]},
                   repo="alice/prompts")  # fmt: skip
        _tamper(token, {"prompts": {"source": "alice/prompts", "id_column": "id"}})
        with reference_server(tmp_path) as (server, ledger):
            with pytest.raises(SourceError, match=r"prompt source alice/prompts\[train\]: its dataset card"):
                hub.reproduce(REPO, work_dir=tmp_path / "w", overrides=[f"server.endpoints={server.url}"],
                              announce=[].append, run_options={"progress": "none"})  # fmt: skip
            assert generations(ledger) == []
        assert attacker.requests == []


@pytest.mark.slow
def test_reproduce_refuses_a_config_folder_above_the_download_cap_before_fetching(
    emulator: HubServer, token: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cap is 4 GiB; lowered here so that a 64 KB file crosses it."""
    _publish(tmp_path / "r")
    _commit(token, {"recipes/haiku/junk/big.bin": b"\0" * (64 << 10)})
    monkeypatch.setattr(strangers, "DOWNLOAD_BYTES", 32 << 10)
    with pytest.raises(HubError, match=r"refusing to download more than .* recipes/haiku/junk/big\.bin"):
        hub.reproduce(REPO, work_dir=tmp_path / "w", reference_server=True, announce=[].append)
    assert not (tmp_path / "w" / "hub" / "recipes" / "haiku").exists()
    monkeypatch.setattr(strangers, "DOWNLOAD_FILES", 3)
    monkeypatch.setattr(strangers, "DOWNLOAD_BYTES", 4 << 30)
    with pytest.raises(HubError, match="refusing to download more than 3 files"):
        hub.reproduce(REPO, work_dir=tmp_path / "w", reference_server=True, announce=[].append)


# --- finding 5: push uploads exactly the files the build read, listed first ------------------------


@pytest.mark.slow
def test_push_of_a_prompt_folder_uploads_only_the_files_the_build_read_and_lists_them_first(
    emulator: HubServer, token: str, tmp_path: Path
) -> None:
    folder = tmp_path / "r"
    prompts = folder / "prompts"
    (prompts / "sub").mkdir(parents=True)
    (prompts / "a.jsonl").write_text('{"id": "1", "prompt": "Write a haiku about rain."}\n')
    (prompts / "notes.txt").write_text("customer list is in sub/")
    (prompts / "sub" / "customers.csv").write_text("name,card\nbob,4111-e3raw-secret\n")
    (prompts / "sub" / "more.jsonl").write_text('{"id": "2", "prompt": "not read: below the folder"}\n')
    raw = {"name": "haiku", "prompts": {"source": "prompts", "id_column": "id"},
           "server": {"launch": "reference"},
           "sampling": {"max_new_tokens": 8, "temperature": 0}}  # fmt: skip
    (folder / "haiku.yaml").write_text(yaml.safe_dump(raw))
    seen: list[tuple[str, list[str]]] = []

    def announce(text: str) -> None:
        seen.append((text, sorted(emulator.files(REPO))))

    result = hub.push(
        str(folder / "haiku.yaml"), REPO, announce=announce,
        run_options={"journal_dir": tmp_path / "j", "progress": "none"},
    )  # fmt: skip
    assert result.rows == 1
    uploaded = sorted(emulator.files(REPO))
    assert "recipes/haiku/prompts/prompts/a.jsonl" in uploaded
    assert not any(p.endswith(("notes.txt", "customers.csv", "more.jsonl")) for p in uploaded), uploaded
    assert emulator.find_bytes("4111-e3raw-secret") == []
    ((plan, before),) = seen
    assert not any(p.startswith(("recipes/", "haiku/")) for p in before)  # listed before any upload
    assert f"recipes/haiku/prompts/prompts/a.jsonl  from {prompts / 'a.jsonl'} (" in plan
    listed = {line.split()[0] for line in plan.splitlines()[1:]}
    assert {p for p in uploaded if p.startswith("recipes/")} <= listed
    assert "notes.txt" not in plan and "customers.csv" not in plan


# --- finding 8: what a stranger wrote is printed escaped --------------------------------------------

ESCAPES = "\x1b[2J\x1b]0;owned\x07\rerror: fake line\u202e"


@pytest.mark.slow
def test_inspect_and_stats_escape_a_published_sets_ids_text_and_reasons(
    emulator: HubServer, token: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import datasets
    from transformers import AutoTokenizer

    from eagle3_raw.resources import reference_model_dir

    _publish(tmp_path / "r")
    tokenizer = AutoTokenizer.from_pretrained(str(reference_model_dir()))
    prompt = tokenizer.encode(f"hi {ESCAPES}", add_special_tokens=False)
    generated = tokenizer.encode(f"answer {ESCAPES}", add_special_tokens=False)
    hostile = datasets.Dataset.from_dict({
        "id": [f"x{ESCAPES}:0:0"], "source_id": [f"x{ESCAPES}"], "turn": [0], "sample": [0],
        "input_ids": [prompt + generated], "loss_mask": [[0] * len(prompt) + [1] * len(generated)],
        "prompt_len": [len(prompt)], "finish_reason": [f"stop{ESCAPES}"], "sampling_seed": [1],
    })  # fmt: skip
    hostile.push_to_hub(REPO, "haiku", token=token)
    cache = ["--cache-dir", str(tmp_path / "c")]
    assert main(["inspect", REPO, "--plain", *cache]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\r" not in out and "\u202e" not in out and "\x07" not in out
    assert "x\\x1b[2J\\x1b]0;owned\\x07\\rerror: fake line\\u202e:0:0" in out  # the id, visible
    assert "answer \\x1b[2J" in out  # the decoded text, visible
    assert main(["stats", REPO, "--plain", *cache]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "stop\\x1b[2J" in out


@pytest.mark.slow
def test_journals_list_escapes_what_a_server_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from aiohttp import web

    from tests.helpers import write_prompts, write_recipe
    from tests.support.hostile import Forward, json_body

    async def model_info(request: web.Request, forward: Forward) -> web.StreamResponse:
        status, body = await forward()
        names = {"model_path": f"evil{ESCAPES}", "served_model_name": f"evil{ESCAPES}"}
        return json_body({**json.loads(body), **names}, status)

    write_prompts(tmp_path, 2)
    with reference_server(tmp_path) as (server, _), HostileServer({"/model_info": model_info},
                                                                 worker=server.url) as hostile:  # fmt: skip
        recipe = write_recipe(tmp_path, endpoints=[hostile.url])
        assert main(["build", str(recipe), "--quiet", "--journal-dir", str(tmp_path / "j"),
                     "--cache-dir", str(tmp_path / "c")]) == 0  # fmt: skip
    capsys.readouterr()
    listing = ["journals", "list", "--journal-dir", str(tmp_path / "j"), "--cache-dir", str(tmp_path / "c")]
    assert main(listing) == 0
    out = capsys.readouterr().out
    assert "evil\\x1b[2J" in out and "\x1b" not in out and "\r" not in out and "\u202e" not in out


@pytest.mark.slow
def test_the_set_its_copies_and_the_slurm_scripts_are_the_users_only(tmp_path: Path) -> None:
    """Issue 22, finding 8: the cache, the outputs and the SLURM scripts were world-readable."""
    import os
    import stat

    from tests.helpers import write_prompts, write_recipe

    def mode(path: Path) -> int:
        return stat.S_IMODE(path.stat().st_mode)

    write_prompts(tmp_path, 2)
    old = os.umask(0o022)  # the usual one: the files would be world-readable
    try:
        with reference_server(tmp_path) as (server, _):
            recipe = write_recipe(tmp_path, endpoints=[server.url])
            common = ["--journal-dir", str(tmp_path / "j"), "--cache-dir", str(tmp_path / "c")]
            assert main(["build", str(recipe), "--quiet", "--output-dir", str(tmp_path / "o"), *common]) == 0
            assert main(["export", str(recipe), "--layout", "speculators", "--output", str(tmp_path / "x"),
                         "--quiet", *common]) == 0  # fmt: skip
        assert main(["slurm", str(recipe), "--shards", "2", "--job-dir", str(tmp_path / "job"), *common]) == 0
    finally:
        os.umask(old)
    (info,) = (tmp_path / "c").rglob("dataset_info.json")
    assert mode(info.parent) == 0o700  # the set's folder in the datasets cache: its files unreachable
    assert mode(tmp_path / "o") == 0o700 and mode(tmp_path / "o" / "t.parquet") == 0o600
    written = [p for p in (tmp_path / "x").rglob("*")]
    assert written and all(mode(p) == (0o700 if p.is_dir() else 0o600) for p in written), written
    assert mode(tmp_path / "x") == 0o700
    for name in ("shards.sbatch", "merge.sbatch", "logs"):
        assert mode(tmp_path / "job" / name) == 0o700, name
    assert mode(tmp_path / "job") == 0o700


def _hostile_rows(emulator: HubServer, token: str, **columns: list[Any]) -> None:
    """Replace the published rows of config ``haiku`` by one row with ``columns`` changed (its own
    Parquet file, and a card that declares no features: the file's schema is the set's)."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    row: dict[str, list[Any]] = {
        "id": ["a:0:0"], "source_id": ["a"], "turn": [0], "sample": [0], "input_ids": [[5, 6, 7]],
        "loss_mask": [[0, 1, 1]], "prompt_len": [1], "finish_reason": ["stop"], "sampling_seed": [1],
    }  # fmt: skip
    row.update(columns)
    buffer = io.BytesIO()
    pq.write_table(pa.table({k: v for k, v in row.items() if v != ["<drop>"]}), buffer)
    (parquet,) = [p for p in emulator.files(REPO) if p.startswith("haiku/") and p.endswith(".parquet")]
    _commit(token, {parquet: buffer.getvalue()})
    _card_with(token, {"configs": [{"config_name": "haiku", "data_files": [
        {"split": "train", "path": "haiku/train-*"}]}]})  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(
    ("columns", "refused"),
    [
        ({"prompt_len": ["<drop>"]}, "its column 'prompt_len' is missing, expected a integer"),
        ({"input_ids": [["5", "6"]]}, "its column 'input_ids' is of type list<item: string>"),
        ({"finish_reason": [7]}, "its column 'finish_reason' is of type int64, expected a string"),
    ],
)
def test_a_published_set_that_is_not_an_eagle3_raw_set_is_one_line(
    emulator: HubServer, token: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    columns: dict[str, list[Any]], refused: str,
) -> None:  # fmt: skip
    _publish(tmp_path / "r")
    _hostile_rows(emulator, token, **columns)
    for command in ("inspect", "stats"):
        err = _error(capsys, [command, REPO, "--cache-dir", str(tmp_path / f"c-{command}")])
        assert f"alice/eagle is not an eagle3_raw set: {refused}" in err, err
    with pytest.raises(HubError, match="is not an eagle3_raw set"):
        export(hub=REPO, layout="specforge", output_dir=tmp_path / "out", cache_dir=tmp_path / "c")


@pytest.mark.slow
def test_a_published_card_that_declares_a_column_its_files_lack_is_one_line(
    emulator: HubServer, token: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import datasets

    _publish(tmp_path / "r")
    rows = {"id": ["a:0:0"], "source_id": ["a"], "turn": [0], "sample": [0], "input_ids": [[5, 6]],
            "loss_mask": [[0, 1]], "finish_reason": ["stop"], "sampling_seed": [1]}  # fmt: skip
    datasets.Dataset.from_dict(rows).push_to_hub(REPO, "haiku", token=token)  # no prompt_len: nulls
    err = _error(capsys, ["inspect", REPO, "--cache-dir", str(tmp_path / "c")])
    assert "alice/eagle is not an eagle3_raw set: its column 'prompt_len' has null values" in err


@pytest.mark.slow
def test_inspect_shows_an_id_outside_the_vocabulary_as_such(
    emulator: HubServer, token: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _publish(tmp_path / "r")
    _hostile_rows(emulator, token, input_ids=[[5, -1, 2**31 - 1]])
    assert main(["inspect", REPO, "--plain", "--cache-dir", str(tmp_path / "c")]) == 0
    out = capsys.readouterr().out
    assert "⟦id -1: not in the vocabulary⟧" in out and "⟦id 2147483647: not in the vocabulary⟧" in out


@pytest.mark.slow
def test_corrupt_published_rows_are_one_line(
    emulator: HubServer, token: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _publish(tmp_path / "r")
    (parquet,) = [p for p in emulator.files(REPO) if p.startswith("haiku/") and p.endswith(".parquet")]
    _commit(token, {parquet: b"PAR1 this is not a parquet file PAR1"})
    err = _error(capsys, ["stats", REPO, "--cache-dir", str(tmp_path / "c")])
    assert "error: cannot load the published rows of alice/eagle: " in err
