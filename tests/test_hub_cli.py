"""First contact with the Hub (issue 14), against the Hub emulator with the real clients: names checked
before anything is uploaded, a bare repo name, the README's reproduce command, and looking at a
published set with ``inspect`` and ``stats``."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from huggingface_hub import HfApi

from eagle3_raw import hub
from eagle3_raw.cli.main import main
from eagle3_raw.errors import HubError
from eagle3_raw.resources import builder_scripts_dir
from tests.helpers import generations, reference_server

try:
    from tests.support.hub_server import HubServer, hub_server
    from tests.support.hub_server import hub as hub_fixture
except ModuleNotFoundError:  # `tests` is a package only when the repo root is on sys.path
    from support.hub_server import HubServer, hub_server  # type: ignore[no-redef]
    from support.hub_server import hub as hub_fixture  # type: ignore[no-redef]

emulator = hub_fixture
__all__ = ["emulator", "hub_server"]  # fixtures used by name

REPO = "alice/eagle"


@pytest.fixture()
def token(emulator: HubServer, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("HF_TOKEN", emulator.tokens.write)
    return emulator.tokens.write


def _recipe(folder: Path, **server: Any) -> Path:
    """Three greedy rows from a copy of a demo prompt file; the reference server unless ``server``."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(builder_scripts_dir() / "prompts" / "plain.jsonl", folder / "plain.jsonl")
    raw = {
        "name": "haiku",
        "prompts": {"source": "plain.jsonl", "id_column": "id", "limit": 3},
        "server": server or {"launch": "reference"},
        "sampling": {"max_new_tokens": 16, "temperature": 0},
    }
    path = folder / "haiku.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _options(tmp_path: Path) -> dict[str, Any]:
    return {"journal_dir": tmp_path / "journals", "progress": "none"}


@pytest.mark.parametrize(
    ("option", "value", "problem"),
    [
        ("tag", "v 1", "it contains ' '"),
        ("tag", "release..1", "it contains '..' or '@{'"),
        ("tag", "refs/tags/v1", "the Hub refuses names starting with 'refs/'"),
        ("tag", "v1.lock", "a part starts with '.' or ends with '.lock'"),
        ("tag", "-v1", "it is '@' or starts with '-'"),
        ("revision", "dev/", "it starts or ends with '/', or contains '//'"),
        ("revision", "a" * 40, "it looks like a commit id (40 hex digits)"),
        ("revision", "what?", "it contains '?'"),
    ],
)
def test_an_invalid_tag_or_branch_is_refused_before_anything_is_built_or_uploaded(
    emulator: HubServer, token: str, tmp_path: Path, option: str, value: str, problem: str
) -> None:
    with reference_server(tmp_path) as (server, ledger):
        recipe = _recipe(tmp_path / "r", endpoints=[server.url])
        with pytest.raises(HubError) as refused:
            hub.push(str(recipe), REPO, run_options=_options(tmp_path), **{option: value})
    kind = "branch" if option == "revision" else "tag"
    assert str(refused.value) == f"--{option} {value!r}: not a valid {kind} name: {problem}"
    assert generations(ledger) == []  # nothing built
    assert [r.method for r in emulator.requests if r.method != "GET"] == []  # nothing created or uploaded
    assert not HfApi(token=token).repo_exists(REPO, repo_type="dataset")


def test_the_hubs_own_message_is_shown_not_only_its_request_id(emulator: HubServer, token: str) -> None:
    api = HfApi(token=token)
    api.create_repo(REPO, repo_type="dataset")
    with pytest.raises(HubError) as refused, hub.hub_errors(REPO, "create a branch on"):
        api.create_branch(REPO, branch="refs/x", repo_type="dataset")  # what the checks above prevent
    assert (
        str(refused.value) == "cannot create a branch on alice/eagle: HTTP 400: Invalid branch name: 'refs/x'"
    )


@pytest.mark.slow
def test_a_bare_repo_name_goes_to_the_tokens_user(
    emulator: HubServer, token: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = _recipe(tmp_path / "r")
    argv = [
        "push",
        str(recipe),
        "--repo",
        "eagle",
        "--tag",
        "v1",
        "--quiet",
        "--journal-dir",
        str(tmp_path / "j"),
    ]
    assert main(argv) == 0
    assert "pushed            alice/eagle config haiku (3 rows, generated now)" in capsys.readouterr().out
    assert {t.name for t in HfApi(token=token).list_repo_refs(REPO, repo_type="dataset").tags} == {"v1"}


@pytest.mark.slow
def test_the_readme_reproduce_command_sends_every_request_to_the_given_server(
    emulator: HubServer, token: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pushed = hub.push(str(_recipe(tmp_path / "r")), REPO, tag="v1", run_options=_options(tmp_path))
    assert pushed.rows == 3  # built with `launch: reference`
    with reference_server(tmp_path) as (server, ledger):
        argv = ["reproduce", f"{REPO}@v1", "--quiet", "--strict", "--set", f"server.endpoints=[{server.url}]"]
        assert main(argv) == 0
        delivered = generations(ledger)
    out = capsys.readouterr().out
    assert len(delivered) == pushed.rows  # all of them here: no built-in server took a share
    assert "identical         3 of 3 (100.0%)" in out


@pytest.mark.slow
def test_inspect_and_stats_read_a_published_set(
    emulator: HubServer, token: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hub.push(str(_recipe(tmp_path / "r")), REPO, tag="v1", run_options=_options(tmp_path))
    capsys.readouterr()
    assert (
        main(["inspect", f"{REPO}@v1", "--index", "1", "--limit", "1", "--cache-dir", str(tmp_path / "c")])
        == 0
    )
    out = capsys.readouterr().out
    assert out.startswith("alice/eagle@v1 config haiku: 3 rows\n")
    assert "── row 1: " in out and "── row 0: " not in out
    assert "<|im_start|>user\n" in out and "⟦generated⟧" in out and "⟦/generated⟧" in out
    assert main(["stats", f"{REPO}@v1", "--cache-dir", str(tmp_path / "c")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("alice/eagle@v1 config haiku: 3 rows\n") and "generated tokens per row" in out
    assert main(["stats", f"{REPO}@v1", "--set", "sampling.temperature=1"]) == 1
    assert "--set applies to a recipe" in capsys.readouterr().err


def test_a_hub_that_does_not_answer_is_one_line(emulator: HubServer) -> None:
    with pytest.raises(HubError) as refused, hub.hub_errors(REPO, "read"):
        HfApi(endpoint="http://127.0.0.1:9").dataset_info(REPO)  # nothing listens on port 9
    assert str(refused.value).startswith("cannot read alice/eagle: the Hub did not answer (ConnectError: ")
