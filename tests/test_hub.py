"""Publishing and reproducing (issue 5), against the Hub emulator with the real hub/datasets clients.

Every build goes to the reference server; rows are checked against what the Hub serves back, and
"no request sent" / "really regenerated" against the reference server's ledger.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import datasets
import orjson
import pytest
import yaml
from huggingface_hub import DatasetCard, HfApi

import eagle3_raw
from eagle3_raw import card as card_module
from eagle3_raw import hub, redact
from eagle3_raw.cli import hub as hub_cli
from eagle3_raw.cli import main as cli
from eagle3_raw.errors import HubError
from eagle3_raw.recipe import SGLANG_SAMPLING_DEFAULTS, load_recipe
from eagle3_raw.resources import builder_scripts_dir
from tests.helpers import generations, reference_server
from tests.support.pace import scaled

try:
    from tests.support.hub_server import HubServer, hub_server
    from tests.support.hub_server import hub as hub_fixture
except ModuleNotFoundError:  # `tests` is a package only when the repo root is on sys.path
    from support.hub_server import HubServer, hub_server  # type: ignore[no-redef]
    from support.hub_server import hub as hub_fixture  # type: ignore[no-redef]

emulator = hub_fixture
__all__ = ["emulator", "hub_server"]  # fixtures used by name

REPO = "alice/eagle"
SECRET = "sk-e3raw-do-not-publish-8d1f"


def _recipe(folder: Path, name: str = "haiku", source: str = "plain.jsonl", **sections: Any) -> Path:
    """A small greedy recipe in ``folder`` reading a copy of a demo prompt file."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(builder_scripts_dir() / "prompts" / source, folder / source)
    raw: dict[str, Any] = {
        "name": name,
        "license": "apache-2.0",
        "prompts": {"source": source, "id_column": "id", "limit": 3},
        "server": {"launch": "reference"},
        "sampling": {"max_new_tokens": 16, "temperature": 0},
    }
    for key, value in sections.items():
        raw[key] = {**raw[key], **value} if isinstance(raw.get(key), dict) else value
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _push(recipe: Path, tmp_path: Path, **kwargs: Any) -> hub.PushResult:
    options = {"journal_dir": tmp_path / "journals", "progress": "none"}
    return hub.push(str(recipe), kwargs.pop("repo", REPO), run_options=options, **kwargs)


def _load(repo: str, config: str, revision: str, token: str) -> datasets.Dataset:
    rows = datasets.load_dataset(repo, config, revision=revision, split="train", token=token)
    assert isinstance(rows, datasets.Dataset)
    return rows


def _cli(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="eagle3-raw")
    sub = parser.add_subparsers(dest="command", required=True)
    hub_cli.add_push(sub)
    hub_cli.add_reproduce(sub)
    args = parser.parse_args(argv)
    code: int = args.handler(args)
    return code


def _card(hub: HubServer, revision: str = "main") -> tuple[dict[str, Any], str]:
    text = hub.files(REPO, revision)["README.md"].decode()
    card = DatasetCard(text)
    meta = yaml.safe_load(text.split("---\n", 2)[1])
    return meta, card.text


@pytest.fixture()
def token(emulator: HubServer, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("HF_TOKEN", emulator.tokens.write)
    return emulator.tokens.write


# --- push -----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_push_then_load_by_tag_gives_back_the_rows_and_features(
    emulator: HubServer, token: str, tmp_path: Path
) -> None:
    recipe = _recipe(tmp_path / "r")
    result = _push(recipe, tmp_path, tag="v1")
    assert (result.repo_id, result.config, result.tag, result.rows, result.generated) == (
        REPO, "haiku", "v1", 3, True,
    )  # fmt: skip
    local = hub.build(load_recipe(recipe), run_options={"journal_dir": tmp_path / "journals"})
    assert not local.generated  # the cache: same rows as pushed
    published = _load(REPO, "haiku", "v1", token)
    assert published.features == local.dataset.features
    assert published.to_list() == local.dataset.to_list()

    files = emulator.files(REPO, "v1")
    assert {"recipes/haiku.yaml", "recipes/haiku.manifest.json", "recipes/haiku.lengths.svg",
            "recipes/haiku/prompts/plain.jsonl", "README.md"} <= set(files)  # fmt: skip
    assert files["recipes/haiku/prompts/plain.jsonl"] == (recipe.parent / "plain.jsonl").read_bytes()
    assert files["recipes/haiku.lengths.svg"].startswith(b"<svg")
    refs = HfApi(token=token).list_repo_refs(REPO, repo_type="dataset")
    assert {t.name: t.target_commit for t in refs.tags} == {"v1": result.commit}


@pytest.mark.slow
def test_published_recipe_resolves_beside_itself_with_the_same_fingerprint(
    emulator: HubServer, token: str, tmp_path: Path
) -> None:
    fingerprint = load_recipe(_recipe(tmp_path / "r")).fingerprint  # (computed when first read)
    _push(tmp_path / "r" / "haiku.yaml", tmp_path)
    shutil.rmtree(tmp_path / "r")  # the original prompt file is gone: only the Hub's copy remains
    api = HfApi(token=token)
    commit = api.dataset_info(REPO).sha
    assert commit is not None
    server = ["server.endpoints=http://127.0.0.1:9"]  # reproducing always names a server of one's own
    fetched, manifest = hub.fetch_recipe(api, REPO, commit, "haiku", tmp_path / "download", server)
    assert fetched.prompts.source == "haiku/prompts/plain.jsonl"
    assert fetched.fingerprint == fingerprint == manifest["fingerprint"]


@pytest.mark.slow
def test_every_skip_reason_is_published_even_one_that_reads_like_a_secret_name(
    emulator: HubServer, token: str, tmp_path: Path
) -> None:
    recipe = _recipe(tmp_path / "r")
    prompts = tmp_path / "r" / "plain.jsonl"
    bad = {"id": "bad-role", "messages": [{"role": "token", "content": "x"}]}
    prompts.write_bytes(orjson.dumps(bad) + b"\n" + prompts.read_bytes())  # within the limit of 3
    _push(recipe, tmp_path)
    manifest = orjson.loads(emulator.files(REPO)["recipes/haiku.manifest.json"])
    skipped = manifest["counts"]["skipped"]
    assert sum(skipped.values()) == 1 and "unknown role 'token'" in next(iter(skipped)), skipped


@pytest.mark.slow
def test_manifest_records_server_tokenizer_versions_and_counts(
    emulator: HubServer, token: str, tmp_path: Path
) -> None:
    result = _push(_recipe(tmp_path / "r"), tmp_path)
    manifest = orjson.loads(emulator.files(REPO)["recipes/haiku.manifest.json"])
    rows = _load(REPO, "haiku", result.commit, token)
    assert manifest["fingerprint"] == result.fingerprint and manifest["name"] == "haiku"
    assert manifest["server"]["version"] and manifest["server"]["model_path"]
    assert "max_running_requests" in manifest["server"]["server_info"]  # null unless passed, as in SGLang
    assert (
        len(manifest["tokenizer"]["tokenizer_sha256"])
        == len(manifest["tokenizer"]["chat_template_sha256"])
        == 64
    )
    assert manifest["versions"]["eagle3_raw"] and manifest["versions"]["datasets"] == datasets.__version__
    assert manifest["request_params"] == {**SGLANG_SAMPLING_DEFAULTS, "temperature": 0, "max_new_tokens": 16}
    counts = manifest["counts"]
    assert counts["rows"] == len(rows) == 3
    assert counts["prompt_tokens"] == sum(rows["prompt_len"])
    assert counts["generated_tokens"] == sum(len(r["input_ids"]) - r["prompt_len"] for r in rows)
    assert sum(counts["finish_reasons"].values()) == 3 and counts["skipped"] == counts["failed"] == {}
    assert manifest["lengths"]["total"]["max"] == max(len(ids) for ids in rows["input_ids"])


@pytest.mark.slow
def test_card_metadata_parses_and_keeps_configs_and_dataset_info(
    emulator: HubServer, token: str, tmp_path: Path
) -> None:
    _push(_recipe(tmp_path / "r"), tmp_path, tag="v1")
    meta, body = _card(emulator, "v1")
    assert meta["license"] == "apache-2.0" and meta["task_categories"] == ["text-generation"]
    assert meta["size_categories"] == ["n<1K"]
    assert {"eagle3", "speculative-decoding", "sglang", "synthetic"} <= set(meta["tags"])
    assert [c["config_name"] for c in meta["configs"]] == ["haiku"]
    assert meta["dataset_info"]["config_name"] == "haiku"
    assert meta["dataset_info"]["splits"][0]["num_examples"] == 3
    assert "<!-- eagle3_raw:config:haiku:start -->" in body and "(recipes/haiku.lengths.svg)" in body
    assert "eagle3-raw reproduce alice/eagle@v1 --config haiku" in body
    assert "⟦generated⟧" in body
    info = HfApi(token=token).dataset_info(REPO, revision="v1")
    assert info.card_data is not None and info.card_data.license == "apache-2.0"


@pytest.mark.slow
def test_a_second_recipe_leaves_the_first_ones_data_and_section(
    emulator: HubServer, token: str, tmp_path: Path
) -> None:
    first = _recipe(tmp_path / "a", "haiku", description="Haiku answers.")
    _push(first, tmp_path)
    _push(_recipe(tmp_path / "b", "chats", source="sharegpt.jsonl", turns="all"), tmp_path, tag="v2")
    meta, body = _card(emulator, "v2")
    assert {c["config_name"] for c in meta["configs"]} == {"haiku", "chats"}
    assert {i["config_name"] for i in meta["dataset_info"]} == {"haiku", "chats"}
    assert "Haiku answers." in body and body.count("eagle3_raw:config:chats:start") == 1
    assert len(_load(REPO, "haiku", "v2", token)) == 3 and len(_load(REPO, "chats", "v2", token)) > 0

    # pushing the first recipe again (a new description: same fingerprint) replaces only its section
    _push(_recipe(tmp_path / "a", "haiku", description="Haiku, second edition."), tmp_path, tag="v3")
    _, again = _card(emulator, "v3")
    assert again.count("<!-- eagle3_raw:config:haiku:start -->") == 1 and "Haiku answers." not in again
    chats = "<!-- eagle3_raw:config:chats:start -->"
    assert again.split(chats)[1].split("<!--")[0] == body.split(chats)[1].split("<!--")[0]


@pytest.mark.slow
def test_second_push_sends_no_generation_request_and_existing_tag_is_refused(
    emulator: HubServer, token: str, tmp_path: Path
) -> None:
    with reference_server(tmp_path) as (server, ledger):
        recipe = _recipe(tmp_path / "r", server={"launch": None, "endpoints": [server.url]})
        _push(recipe, tmp_path, tag="v1")
        sent = len(generations(ledger))
        assert sent == 3
        again = _push(recipe, tmp_path, tag="v2")
        assert not again.generated and len(generations(ledger)) == sent
    tags = {
        t.name: t.target_commit for t in HfApi(token=token).list_repo_refs(REPO, repo_type="dataset").tags
    }
    with pytest.raises(HubError, match="tag 'v1' already exists on alice/eagle"):
        _push(recipe, tmp_path, tag="v1", overrides={"server.endpoints": ["http://127.0.0.1:9"]})
    after = HfApi(token=token).list_repo_refs(REPO, repo_type="dataset").tags
    assert {t.name: t.target_commit for t in after} == tags  # never moved


@pytest.mark.slow
def test_push_to_a_new_branch_creates_it_from_main(emulator: HubServer, token: str, tmp_path: Path) -> None:
    api = HfApi(token=token)
    api.create_repo(REPO, repo_type="dataset")
    api.upload_file(path_or_fileobj=b"notes\n", path_in_repo="notes.txt", repo_id=REPO, repo_type="dataset")
    result = _push(_recipe(tmp_path / "r"), tmp_path, revision="dev", tag="dev-v1")
    assert result.branch == "dev"
    assert "notes.txt" in emulator.files(REPO, "dev")  # branched from main
    assert "recipes/haiku.yaml" not in emulator.files(REPO, "main")
    assert len(_load(REPO, "haiku", "dev-v1", token)) == 3


@pytest.mark.slow
def test_card_write_retries_when_another_commit_lands_meanwhile(
    emulator: HubServer, token: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    update_card = card_module.update_card

    def racing(readme: str, section: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:  # someone else commits between our read and our write
            HfApi(token=token).upload_file(
                path_or_fileobj=b"theirs\n", path_in_repo="other.txt", repo_id=REPO, repo_type="dataset"
            )
        return update_card(readme, section)

    monkeypatch.setattr(card_module, "update_card", racing)
    _push(_recipe(tmp_path / "r"), tmp_path, tag="v1")
    assert len(calls) == 2
    files = emulator.files(REPO, "v1")
    assert files["other.txt"] == b"theirs\n" and b"eagle3_raw:config:haiku:start" in files["README.md"]


@pytest.mark.slow
def test_private_push_is_not_readable_anonymously(
    emulator: HubServer, token: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _push(_recipe(tmp_path / "r"), tmp_path, private=True, tag="v1")
    assert HfApi(token=token).dataset_info(REPO).private
    monkeypatch.delenv("HF_TOKEN")
    with pytest.raises(HubError, match="cannot read alice/eagle: no such dataset repo, or it is private"):
        hub.reproduce(f"{REPO}@v1")


@pytest.mark.slow
def test_cli_push_prints_where_it_went(
    emulator: HubServer, token: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = _recipe(tmp_path / "r")
    argv = [
        "push",
        str(recipe),
        "--repo",
        REPO,
        "--tag",
        "v1",
        "--quiet",
        "--journal-dir",
        str(tmp_path / "j"),
    ]
    assert _cli([*argv, "--set", "sampling.max_new_tokens=8"]) == 0
    out = capsys.readouterr().out
    assert "pushed            alice/eagle config haiku (3 rows, generated now)" in out
    assert "revision='v1'" in out
    rows = _load(REPO, "haiku", "v1", token)
    assert max(len(r["input_ids"]) - r["prompt_len"] for r in rows) <= 8


@pytest.mark.slow
def test_hub_prompt_source_is_listed_in_source_datasets_and_not_uploaded(
    emulator: HubServer, token: str, tmp_path: Path
) -> None:
    prompts = [{"id": f"p{i}", "prompt": f"Write a haiku about the number {i}."} for i in range(4)]
    datasets.Dataset.from_list(prompts).push_to_hub("alice/prompts", token=token)
    recipe = _recipe(tmp_path / "r", prompts={"source": "alice/prompts", "revision": "main"})
    _push(recipe, tmp_path, tag="v1")
    meta, body = _card(emulator, "v1")
    assert meta["source_datasets"] == ["alice/prompts"]
    assert "`alice/prompts` (Hub dataset, split `train`, revision `main`)" in body
    files = emulator.files(REPO, "v1")
    assert not any(path.startswith("recipes/haiku/prompts/") for path in files)
    assert yaml.safe_load(files["recipes/haiku.yaml"])["prompts"]["source"] == "alice/prompts"
    assert orjson.loads(files["recipes/haiku.manifest.json"])["prompt_source"] == "hub"


@pytest.mark.slow
def test_push_and_reproduce_in_a_fresh_process(hub_server: HubServer, tmp_path: Path) -> None:
    """The most faithful client setup: HF_ENDPOINT read at import, nothing patched in process."""
    script = (
        "import argparse, sys\n"
        "from eagle3_raw.cli import hub as hub_cli\n"
        "parser = argparse.ArgumentParser()\n"
        "sub = parser.add_subparsers(required=True)\n"
        "hub_cli.add_push(sub), hub_cli.add_reproduce(sub)\n"
        "args = parser.parse_args(sys.argv[1:])\n"
        "sys.exit(args.handler(args))\n"
    )
    env = hub_server.client_env(tmp_path / "home")
    env.update(HF_TOKEN=hub_server.tokens.write, EAGLE3_RAW_JOURNAL_DIR=str(tmp_path / "journals"))
    recipe = _recipe(tmp_path / "r")
    for argv in (["push", str(recipe), "--repo", REPO, "--tag", "v1", "--quiet"],
                 ["reproduce", f"{REPO}@v1", "--quiet", "--strict", "--reference-server"]):  # fmt: skip
        done = subprocess.run(
            [sys.executable, "-c", script, *argv],
            env=env,
            capture_output=True,
            text=True,
            timeout=scaled(120),
        )
        assert done.returncode == 0, done.stderr[-3000:]
    assert "verdict           full agreement" in done.stdout
    assert hub_server.find_bytes(hub_server.tokens.write) == []
    assert hub_server.tokens.write not in done.stdout + done.stderr


@pytest.mark.slow
def test_a_forced_merge_is_never_loaded_or_published_as_the_whole_set(
    emulator: HubServer, token: str, tmp_path: Path
) -> None:
    """``merge --force`` with a shard missing caches a set marked partial under its own config id.
    Only a push that asks for it publishes that set, saying so on the card and in the manifest; a
    later ``load``, ``load_dataset`` and plain ``push`` each give the whole set (the missing shard
    generated first), never the partial one."""
    recipe = _recipe(tmp_path / "r", prompts={"limit": 4})
    journals, cache = tmp_path / "journals", tmp_path / "cache"
    places = ["--journal-dir", str(journals), "--cache-dir", str(cache)]
    assert cli.main(["build", str(recipe), "--shard", "1/2", "--quiet", *places]) == 0
    assert cli.main(["merge", str(recipe), "--force", *places]) == 0
    options = {"journal_dir": journals, "progress": "none"}
    partial = hub.push(str(recipe), REPO, cache_dir=cache, run_options=options, partial=True)
    manifest = orjson.loads(emulator.files(REPO)["recipes/haiku.manifest.json"])
    _, text = _card(emulator)
    assert partial.rows == 2 and manifest["partial"] == "of 2: missing [0]"
    assert manifest["config_id"].endswith("-partial") and "**Partial set**" in text
    whole = eagle3_raw.load(str(recipe), cache_dir=str(cache), journal_dir=journals, progress="none")
    loaded = datasets.load_dataset(
        "eagle3_raw", recipe=str(recipe), split="train", cache_dir=str(cache), journal_dir=journals,
        progress="none",
    )  # fmt: skip
    assert len(whole) == len(loaded) == 4 and whole["id"] == loaded["id"]
    pushed = hub.push(str(recipe), REPO, cache_dir=cache, run_options=options)
    manifest = orjson.loads(emulator.files(REPO)["recipes/haiku.manifest.json"])
    _, text = _card(emulator)
    assert pushed.rows == 4 and manifest["partial"] is None and "Partial set" not in text
    assert not manifest["config_id"].endswith("-partial")


# --- credentials and secrets -------------------------------------------------------------------------


def test_no_credentials_is_an_error_before_anything_is_built(emulator: HubServer, tmp_path: Path) -> None:
    recipe = _recipe(tmp_path / "r", server={"launch": None, "endpoints": ["http://127.0.0.1:9"]})
    with pytest.raises(HubError, match=r"no Hugging Face credentials: set HF_TOKEN or run `hf auth login`"):
        _push(recipe, tmp_path)
    assert emulator.requests == []


@pytest.mark.parametrize(
    ("who", "status"), [("bob", "HTTP 403"), ("read", "HTTP 403"), ("bogus", "HTTP 401")]
)  # fmt: skip
def test_a_repo_you_cannot_write_is_a_clear_error(
    emulator: HubServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, who: str, status: str
) -> None:
    tokens = {"bob": emulator.tokens.bob, "read": emulator.tokens.read, "bogus": "hf_not_a_valid_token_123"}
    monkeypatch.setenv("HF_TOKEN", tokens[who])
    recipe = _recipe(tmp_path / "r", server={"launch": None, "endpoints": ["http://127.0.0.1:9"]})
    with pytest.raises(HubError, match=rf"cannot create or write alice/eagle: .*\({status}\)") as error:
        _push(recipe, tmp_path)
    assert tokens[who] not in str(error.value)
    assert not any("/commit/" in r.path for r in emulator.requests)


@pytest.mark.parametrize("who", ["bob", "read"])
def test_an_existing_repo_you_cannot_write_is_refused_before_any_generation(
    emulator: HubServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, who: str
) -> None:
    HfApi(token=emulator.tokens.write).create_repo(REPO, repo_type="dataset")
    refs_before = HfApi(token=emulator.tokens.write).list_repo_refs(REPO, repo_type="dataset")
    monkeypatch.setenv("HF_TOKEN", {"bob": emulator.tokens.bob, "read": emulator.tokens.read}[who])
    with reference_server(tmp_path) as (server, ledger):
        recipe = _recipe(tmp_path / "r", server={"launch": None, "endpoints": [server.url]})
        with pytest.raises(HubError, match=r"alice/eagle: the token has no write access to it \(HTTP 403\)"):
            _push(recipe, tmp_path)
        assert generations(ledger) == []
    assert HfApi(token=emulator.tokens.write).list_repo_refs(REPO, repo_type="dataset") == refs_before
    assert not any("/commit/" in r.path for r in emulator.requests)


@pytest.mark.slow
def test_the_write_check_leaves_no_branch_behind(emulator: HubServer, token: str, tmp_path: Path) -> None:
    HfApi(token=token).create_repo(REPO, repo_type="dataset")
    _push(_recipe(tmp_path / "r"), tmp_path)
    branches = HfApi(token=token).list_repo_refs(REPO, repo_type="dataset").branches
    assert [b.name for b in branches] == ["main"]


@pytest.mark.slow
def test_no_token_or_server_key_reaches_the_hub_or_the_log(
    emulator: HubServer,
    token: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("E3RAW_TEST_KEY", SECRET)
    server = {"launch": "reference", "api_key_env": "E3RAW_TEST_KEY"}  # the key reaches it by its environment
    print(_push(_recipe(tmp_path / "r", server=server), tmp_path, tag="v1").render())
    assert emulator.find_bytes(SECRET) == [] and emulator.find_bytes(token) == []
    output = caplog.text + "".join(capsys.readouterr())
    assert token not in output and SECRET not in output
    files = emulator.files(REPO, "v1")
    manifest = orjson.loads(files["recipes/haiku.manifest.json"])
    assert "api_key" not in manifest["server"]["server_info"]
    assert "--api-key-env" in manifest["server"]["server_info"]["launch_command"]
    published = yaml.safe_load(files["recipes/haiku.yaml"])
    assert published["server"]["launch_args"] == []
    assert published["server"]["api_key_env"] == "E3RAW_TEST_KEY"


@pytest.mark.slow
def test_a_published_set_names_no_host_and_no_install_path(
    emulator: HubServer, token: str, tmp_path: Path
) -> None:
    """Issue 21, finding 9: rows carried ``meta.endpoint`` (a cluster's host name), the published
    recipe its endpoints, the manifest's ``launch_command`` the local install path."""
    install = str(Path(eagle3_raw.__file__).resolve().parent.parent)  # this checkout (or site-packages)
    with reference_server(tmp_path) as (server, _):
        port = server.url.rsplit(":", 1)[1]
        hosts = [f"http://localhost:{port}", server.url]  # two names of one server: two endpoints
        recipe = _recipe(tmp_path / "r", server={"launch": None, "endpoints": hosts}, prompts={"limit": 8})
        _push(recipe, tmp_path, tag="v1")
    rows = _load(REPO, "haiku", "v1", token)
    assert len(rows) == 8 and {meta["endpoint"] for meta in rows["meta"]} <= {"0", "1"}
    files = emulator.files(REPO, "v1")
    published = yaml.safe_load(files["recipes/haiku.yaml"])
    assert published["server"]["endpoints"] == ["http://127.0.0.1:30000", "http://127.0.0.1:30001"]
    launch = orjson.loads(files["recipes/haiku.manifest.json"])["server"]["server_info"]["launch_command"]
    assert launch.startswith("python -m eagle3_raw.reference --host 127.0.0.1"), launch
    for needle in (f"localhost:{port}", f"127.0.0.1:{port}", install, sys.prefix, str(tmp_path)):
        assert emulator.find_bytes(needle) == [], needle
    assert load_recipe(recipe).fingerprint == published_fingerprint(files, tmp_path / "download")


def published_fingerprint(files: dict[str, bytes], folder: Path) -> str:
    """The fingerprint of the published recipe, loaded from a copy of the repo's files."""
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    return load_recipe(folder / "recipes" / "haiku.yaml").fingerprint


@pytest.mark.slow
def test_a_secret_in_the_recipe_text_is_refused(
    emulator: HubServer, token: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe = _recipe(tmp_path / "r", description=f"built with token {token[:3]} {token}")
    with pytest.raises(HubError, match=r"refusing to upload recipes/haiku\.yaml: it contains a credential"):
        _push(recipe, tmp_path)
    assert emulator.find_bytes(token) == []


# --- reproduce ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_reproduce_regenerates_and_reports_full_agreement(
    emulator: HubServer, token: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pushed = _push(_recipe(tmp_path / "r", turns="all"), tmp_path, tag="v1")
    with reference_server(tmp_path) as (server, ledger):
        argv = ["reproduce", f"{REPO}@v1", "--quiet", "--strict", "--set", "server.launch=null",
                "--set", f"server.endpoints={server.url}"]  # fmt: skip
        assert _cli(argv) == 0
        regenerated = len(generations(ledger))
    out = capsys.readouterr().out
    assert regenerated == pushed.rows  # really regenerated, although this machine has it cached
    assert f"identical         {pushed.rows} of {pushed.rows} (100.0%)" in out
    assert "verdict           full agreement" in out


@pytest.mark.slow
def test_reproduce_with_several_configs_needs_one_named(
    emulator: HubServer, token: str, tmp_path: Path
) -> None:
    _push(_recipe(tmp_path / "a", "haiku"), tmp_path)
    _push(_recipe(tmp_path / "b", "chats", source="sharegpt.jsonl"), tmp_path)
    with pytest.raises(HubError, match=r"several configs \(chats, haiku\); choose one with --config"):
        hub.reproduce(REPO)
    with pytest.raises(HubError, match="has no config 'nope'; it has: chats, haiku"):
        hub.reproduce(REPO, config="nope")
    result = hub.reproduce(REPO, config="chats", run_options={"progress": "none"}, reference_server=True)
    assert result.full_agreement and result.config == "chats"


@pytest.mark.slow
def test_reproduce_with_a_changed_recipe_says_so(emulator: HubServer, token: str, tmp_path: Path) -> None:
    _push(_recipe(tmp_path / "r"), tmp_path)
    result = hub.reproduce(
        REPO, overrides=["sampling.max_new_tokens=4"], run_options={"progress": "none"}, reference_server=True
    )
    assert not result.full_agreement and result.published_fingerprint != result.rebuilt_fingerprint
    assert result.common == 3 and result.identical == 0
    assert {d.part for d in result.differences} == {"generated"}
    assert "DIFFERENT recipe" in result.render()


# --- pieces without the Hub -----------------------------------------------------------------------


def test_secret_names_are_whole_words() -> None:
    secret = ["api_key", "--api-key", "--admin-api-key", "HF_TOKEN", "ssl_keyfile_password", "apiKey", "auth"]
    public = [
        "tokenizer_path",
        "max_total_num_tokens",
        "skip_tokenizer_init",
        "keyfile",
        "monkey",
        "kv_cache",
    ]
    assert all(map(redact.is_secret_name, secret))
    assert not any(map(redact.is_secret_name, public))


def test_scrub_drops_secret_keys_and_redacts_command_lines() -> None:
    info = {
        "api_key": "s1", "admin_api_key": None, "tokenizer_path": "/m", "max_total_num_tokens": 9,
        "launch_command": "python -m sglang.launch_server --model /m --api-key s2 --admin-api-key=s3 "
                          "--tokenizer-path /t HF_TOKEN=s4 --url https://u:s5@h/x "
                          "--header 'Authorization: Bearer s6'",
        "nested": [{"hf_token": "s7", "ok": ["--api-key", "s8", "--port", "1"]}],
    }  # fmt: skip
    clean = redact.scrub(info)
    text = orjson.dumps(clean).decode()
    assert not any(f"s{i}" in text.replace("sglang", "") for i in range(1, 9)), text
    assert set(clean) == {"tokenizer_path", "max_total_num_tokens", "launch_command", "nested"}
    assert "--tokenizer-path /t" in clean["launch_command"] and "--model /m" in clean["launch_command"]
    assert clean["nested"] == [{"ok": ["--api-key", "<redacted>", "--port", "1"]}]
    assert redact.scrub_text("log in with hf_abcdefghijklmnopqrstu") == "log in with <redacted>"


def test_public_url_drops_credentials() -> None:
    assert redact.public_url("http://user:pw@gpu-1:30000/v1?key=x#y") == "http://gpu-1:30000/v1"
    assert redact.public_url("http://[::1]:8000") == "http://[::1]:8000"


def test_published_recipe_ships_a_prompt_folder_and_template_and_keeps_the_fingerprint(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "data" / "prompts"
    folder.mkdir(parents=True)
    for name in ("plain.jsonl", "sharegpt.jsonl"):
        shutil.copy(builder_scripts_dir() / "prompts" / name, folder / name)
    (folder / ".DS_Store").write_bytes(b"junk")
    (folder / "linked.jsonl").symlink_to(builder_scripts_dir() / "prompts" / "openai.jsonl")
    (tmp_path / "data" / "template.jinja").write_text("{{ messages }}")
    raw = {
        "name": "mix", "prompts": {"source": "prompts"}, "model": {"chat_template": "template.jinja"},
        "server": {"endpoints": ["http://u:p@h:1"]}, "sampling": {"max_new_tokens": 4},
    }  # fmt: skip
    (tmp_path / "data" / "mix.yaml").write_text(yaml.safe_dump(raw))
    recipe = load_recipe(tmp_path / "data" / "mix.yaml")
    published = hub.publish_recipe(recipe)  # checks the fingerprint itself; raises if it would change
    assert sorted(published.files) == [
        "recipes/mix/chat_template/template.jinja",
        "recipes/mix/prompts/prompts/linked.jsonl",
        "recipes/mix/prompts/prompts/plain.jsonl",
        "recipes/mix/prompts/prompts/sharegpt.jsonl",
    ]
    assert published.data["prompts"]["source"] == "mix/prompts/prompts"
    assert published.data["model"]["chat_template"] == "mix/chat_template/template.jinja"
    assert published.data["server"]["endpoints"] == ["http://127.0.0.1:30000"]  # a stand-in, not h
    assert published.prompt_source == "local"


def test_published_recipe_of_a_linked_prompt_file_keeps_its_name(tmp_path: Path) -> None:
    (tmp_path / "current.jsonl").symlink_to(builder_scripts_dir() / "prompts" / "plain.jsonl")
    raw = {"name": "l", "prompts": {"source": "current.jsonl"}, "server": {"endpoints": ["http://h:1"]},
           "sampling": {"max_new_tokens": 4}}  # fmt: skip
    (tmp_path / "l.yaml").write_text(yaml.safe_dump(raw))
    published = hub.publish_recipe(load_recipe(tmp_path / "l.yaml"))  # same fingerprint, or HubError
    assert list(published.files) == ["recipes/l/prompts/current.jsonl"]


def test_published_recipe_of_a_hub_source_ships_no_files(tmp_path: Path) -> None:
    raw = {"name": "h", "prompts": {"source": "org/prompts", "revision": "v1"},
           "server": {"endpoints": ["http://h:1"]}, "sampling": {"max_new_tokens": 4}}  # fmt: skip
    published = hub.publish_recipe(load_recipe(raw))
    assert published.files == {} and published.prompt_source == "hub"
    assert published.data["prompts"]["source"] == "org/prompts"


def test_compare_matches_rows_by_id_and_finds_the_first_difference() -> None:
    def rows(items: dict[str, list[int]]) -> datasets.Dataset:
        return datasets.Dataset.from_dict(
            {"id": list(items), "input_ids": list(items.values()), "prompt_len": [2] * len(items)}
        )

    published = rows({"a": [1, 2, 3], "b": [1, 2, 3, 4], "c": [5, 6, 7], "gone": [1]})
    rebuilt = rows({"c": [5, 6, 7], "b": [1, 2, 9, 4], "a": [1, 2, 3], "new": [2]})
    result = hub.Comparison(REPO, "x", "abc", "f", "f", **hub.compare(published, rebuilt))
    assert (result.published_rows, result.rebuilt_rows, result.common, result.identical) == (4, 4, 3, 2)
    assert result.only_published == ("gone",) and result.only_rebuilt == ("new",)
    assert result.differences == (hub.RowDifference("b", 2, "generated", 4, 4, (3, 4), (9, 4)),)
    assert result.identical_share == 0.5 and not result.full_agreement
    assert "only published    1: gone" in result.render()
    same = hub.Comparison(REPO, "x", "abc", "f", "f", **hub.compare(published, published))
    assert same.full_agreement and same.identical_share == 1.0


def test_repo_refs_and_config_choice() -> None:
    assert hub.parse_repo_ref("org/name@v1") == ("org/name", "v1")
    assert hub.parse_repo_ref("org/name") == ("org/name", None)
    with pytest.raises(HubError, match="expected org/name"):
        hub.parse_repo_ref("just-a-name")
    assert hub.choose_config("o/n", ["only"], None) == "only"
    with pytest.raises(HubError, match="has no eagle3_raw recipe"):
        hub.choose_config("o/n", [], None)
