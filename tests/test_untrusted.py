"""Reproducing a stranger's set is safe (issue 13, findings 1-4 and 6), end to end.

A set is pushed to the Hub emulator, then its recipe is replaced by a hostile one, as anybody with
write access to a repo could; another user reproduces it with the real ``huggingface_hub`` and
``datasets`` clients. The attacker's server records every request it gets; an audit hook records
every file this process opens below the folder holding the victim's secrets; ``HOME`` and the
current folder are fresh, so anything written outside the journal and cache folders shows.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from huggingface_hub import CommitOperationAdd, HfApi

from eagle3_raw import hub
from eagle3_raw.errors import HubError, RecipeError
from eagle3_raw.resources import builder_scripts_dir, reference_model_dir
from tests.helpers import generations, reference_server
from tests.support.hostile import HostileServer
from tests.support.opened import opened_under

try:
    from tests.support.hub_server import HubServer, hub_server
    from tests.support.hub_server import hub as hub_fixture
except ModuleNotFoundError:  # `tests` is a package only when the repo root is on sys.path
    from support.hub_server import HubServer, hub_server  # type: ignore[no-redef]
    from support.hub_server import hub as hub_fixture  # type: ignore[no-redef]

emulator = hub_fixture
__all__ = ["emulator", "hub_server"]  # fixtures used by name

REPO = "alice/eagle"
SECRET = "aws_secret_access_key = wJalrXUtnFEMI-e3raw-victim"


@pytest.fixture()
def token(emulator: HubServer, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("HF_TOKEN", emulator.tokens.write)
    return emulator.tokens.write


@pytest.fixture()
def victim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh HOME with secrets in it and a fresh current folder; yields the secrets' folder."""
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    (home / ".aws").mkdir(parents=True)
    (home / ".aws" / "credentials").write_text(f"[default]\n{SECRET}\n")
    (home / "secret.jsonl").write_text(json.dumps({"prompt": SECRET}) + "\n")
    cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    yield home
    assert sorted(p.relative_to(home).as_posix() for p in home.rglob("*")) == [
        ".aws", ".aws/credentials", "secret.jsonl",
    ], "something was written in HOME"  # fmt: skip
    assert list(cwd.iterdir()) == [], "something was written in the current folder"


def _publish(folder: Path, **recipe: Any) -> str:
    """Push a small set as alice (config ``haiku``, built with the reference server); its commit."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(builder_scripts_dir() / "prompts" / "plain.jsonl", folder / "plain.jsonl")
    raw: dict[str, Any] = {
        "name": "haiku",
        "prompts": {"source": "plain.jsonl", "id_column": "id", "limit": 3},
        "server": {"launch": "reference"},
        "sampling": {"max_new_tokens": 16, "temperature": 0},
        **recipe,
    }
    (folder / "haiku.yaml").write_text(yaml.safe_dump(raw))
    options = {"journal_dir": folder / "journals", "progress": "none"}
    return hub.push(str(folder / "haiku.yaml"), REPO, run_options=options).commit


def _tamper(token: str, changes: dict[str, Any], files: dict[str, bytes] | None = None) -> str:
    """Replace the published recipe by a hostile one (``changes`` merged into its sections)."""
    api = HfApi(token=token)
    path = api.hf_hub_download(REPO, "recipes/haiku.yaml", repo_type="dataset")
    recipe = yaml.safe_load(Path(path).read_text())
    for key, value in changes.items():
        recipe[key] = {**recipe[key], **value} if isinstance(value, dict) and key != "server" else value
    operations = [CommitOperationAdd("recipes/haiku.yaml", yaml.safe_dump(recipe).encode())]
    operations += [CommitOperationAdd(name, data) for name, data in (files or {}).items()]
    info = api.create_commit(REPO, operations=operations, repo_type="dataset", commit_message="hostile")
    return str(info.oid)


def _reproduce(tmp_path: Path, plan: list[str] | None = None, **kwargs: Any) -> hub.Comparison:
    work = tmp_path / "work"
    kwargs.setdefault("run_options", {"progress": "none"})
    return hub.reproduce(REPO, work_dir=work, announce=(plan if plan is not None else []).append, **kwargs)


# --- finding 1 and 4: the server, the key, the launcher ---------------------------------------------


@pytest.mark.slow
def test_the_published_server_key_and_launcher_are_never_used(
    emulator: HubServer, token: str, tmp_path: Path, victim: Path
) -> None:
    _publish(tmp_path / "r")
    with HostileServer() as attacker:
        hostile = {
            "endpoints": [attacker.url], "api_key_env": "HF_TOKEN", "launch": "reference",
            "launch_args": ["--ledger", "~/.bashrc", "--host", "0.0.0.0"], "max_in_flight": 2_000_000,
        }  # fmt: skip
        _tamper(token, {"server": hostile})
        with reference_server(tmp_path) as (server, ledger), HostileServer(worker=server.url) as mine:
            plan: list[str] = []
            result = _reproduce(tmp_path, plan, overrides=[f"server.endpoints={mine.url}"])
        assert attacker.requests == []  # not one request, so not one header with the Hub token
    assert result.full_agreement and len(generations(ledger)) == 3
    assert mine.requests and not any("Authorization" in r.headers for r in mine.requests)
    assert f"requests to       {mine.url} (your --set server.endpoints); API key: none" in plan[0]
    assert attacker.url not in plan[0]
    assert emulator.tokens.write.encode() not in b"".join(
        p.read_bytes() for p in (tmp_path / "work").rglob("*") if p.is_file()
    )


@pytest.mark.slow
def test_the_built_in_server_is_used_only_when_asked_for(
    emulator: HubServer, token: str, tmp_path: Path, victim: Path
) -> None:
    _publish(tmp_path / "r")
    with HostileServer() as attacker:
        _tamper(token, {"server": {"endpoints": [attacker.url], "launch": None}})
        with pytest.raises(HubError, match="reproduce sends requests only to a server you name"):
            _reproduce(tmp_path)
        plan: list[str] = []
        result = _reproduce(tmp_path, plan, reference_server=True)
        assert attacker.requests == []
    assert result.full_agreement
    assert "the built-in reference server, started on 127.0.0.1 for the run (--reference-server)" in plan[0]


def test_a_recipe_file_that_asks_the_launcher_for_more_than_it_documents_is_refused(tmp_path: Path) -> None:
    """Finding 4 for any recipe (not only published ones): launch_args is an allowlist."""
    for args, refused in [
        (["--ledger", "~/.bashrc"], "--ledger is not allowed in a recipe: it writes a file"),
        (
            ["--host", "0.0.0.0"],
            "--host is not allowed in a recipe: the launched server listens on 127.0.0.1",
        ),
        (["--api-key", "k"], "--api-key is not allowed in a recipe: its key comes from server.api_key_env"),
        (["--led", "x"], "'--led' is not a serve-reference option a recipe may give"),
        (["--slots"], "--slots needs a value after it"),
    ]:
        raw = {"name": "t", "prompts": {"source": "p.jsonl"}, "sampling": {"max_new_tokens": 8},
               "server": {"launch": "reference", "launch_args": args}}  # fmt: skip
        with pytest.raises(RecipeError, match=refused):
            hub.build(raw, run_options={"journal_dir": tmp_path / "j"})
    assert not (tmp_path / "j").exists()  # refused before anything ran


# --- finding 2: local files ------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        ("model", "chat_template", "~/.aws/credentials"),
        ("model", "chat_template", "../../../../../../../../../../etc/passwd"),
        ("model", "chat_template", "HOME/.aws/credentials"),  # absolute, filled in below
        ("prompts", "source", "HOME/secret.jsonl"),
        ("prompts", "source", "../../../../../../../../../../../../HOME/secret.jsonl"),
        ("model", "tokenizer", "/usr/lib"),
        ("model", "tokenizer", "~"),
    ],
)
def test_a_published_path_outside_the_download_is_refused_and_never_read(
    emulator: HubServer, token: str, tmp_path: Path, victim: Path, section: str, key: str, value: str
) -> None:
    value = value.replace("HOME", str(victim).lstrip("/") if value.startswith("..") else str(victim))
    _publish(tmp_path / "r")
    _tamper(token, {section: {key: value}})
    with reference_server(tmp_path) as (server, ledger), opened_under(victim) as opened:
        with pytest.raises(
            RecipeError, match=rf"'{section}\.{key}'.*refused: a published recipe names files"
        ):
            _reproduce(tmp_path, overrides=[f"server.endpoints={server.url}"])
        assert generations(ledger) == []
    assert opened == []


@pytest.mark.slow
def test_a_link_out_of_the_download_is_refused(
    emulator: HubServer, token: str, tmp_path: Path, victim: Path
) -> None:
    """A link planted in the work folder (shared machines): the path resolves out, so it is refused."""
    _publish(tmp_path / "r")
    _tamper(token, {"model": {"chat_template": "haiku/template.jinja"}})
    planted = tmp_path / "work" / "hub" / "recipes" / "haiku" / "template.jinja"
    planted.parent.mkdir(parents=True)
    planted.symlink_to(victim / ".aws" / "credentials")
    with opened_under(victim) as opened, pytest.raises(RecipeError, match="a link that leads out"):
        _reproduce(tmp_path, reference_server=True)
    assert opened == []


@pytest.mark.slow
def test_a_link_inside_a_published_prompt_folder_is_refused(
    emulator: HubServer, token: str, tmp_path: Path, victim: Path
) -> None:
    _publish(tmp_path / "r")
    _tamper(token, {"prompts": {"source": "haiku/prompts"}})
    planted = tmp_path / "work" / "hub" / "recipes" / "haiku" / "prompts"
    planted.mkdir(parents=True)
    (planted / "zz.jsonl").symlink_to(victim / "secret.jsonl")
    with opened_under(victim) as opened, pytest.raises(RecipeError, match=r"prompts/zz\.jsonl.*leads out"):
        _reproduce(tmp_path, reference_server=True)
    assert opened == []


@pytest.mark.slow
def test_a_hub_id_that_is_also_a_folder_here_is_refused(
    emulator: HubServer, token: str, tmp_path: Path, victim: Path
) -> None:
    """``datasets`` and ``transformers`` look for a Hub id in the current folder first."""
    _publish(tmp_path / "r")
    _tamper(token, {"prompts": {"source": "data/private"}})
    private = Path.cwd() / "data" / "private"
    private.mkdir(parents=True)
    (private / "rows.jsonl").write_text(json.dumps({"prompt": SECRET}) + "\n")
    try:
        with (
            opened_under(private) as opened,
            pytest.raises(RecipeError, match="a path in your current folder"),
        ):
            _reproduce(tmp_path, reference_server=True)
        assert opened == []
    finally:
        shutil.rmtree(Path.cwd() / "data")


@pytest.mark.slow
def test_the_users_own_paths_are_theirs_to_give(emulator: HubServer, token: str, tmp_path: Path) -> None:
    _publish(tmp_path / "r")
    mine = tmp_path / "mine"
    shutil.copytree(reference_model_dir(), mine)
    result = _reproduce(tmp_path, reference_server=True, overrides=[f"model.tokenizer={mine}"])
    assert result.full_agreement  # the same files, read from where the user said


# --- finding 3: code ---------------------------------------------------------------------------------


def _evil_tokenizer(marker: Path) -> dict[str, bytes]:
    """A tokenizer folder inside the published repo whose Python code leaves ``marker`` when run."""
    files = {f"recipes/haiku/tok/{p.name}": p.read_bytes() for p in reference_model_dir().iterdir()}
    config = json.loads(files["recipes/haiku/tok/tokenizer_config.json"])
    config.update(
        auto_map={"AutoTokenizer": [None, "tokenization_evil.EvilTokenizer"]}, tokenizer_class="EvilTokenizer"
    )
    files["recipes/haiku/tok/tokenizer_config.json"] = json.dumps(config).encode()
    files["recipes/haiku/tok/tokenization_evil.py"] = (
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n"
        "from transformers import PreTrainedTokenizerFast\n\n\n"
        "class EvilTokenizer(PreTrainedTokenizerFast):\n    pass\n"
    ).encode()
    return files


@pytest.mark.slow
def test_published_remote_code_runs_only_with_the_flag_and_a_commit(
    emulator: HubServer, token: str, tmp_path: Path
) -> None:
    marker = tmp_path / "code-ran"
    _publish(tmp_path / "r")
    model = {"tokenizer": "haiku/tok", "trust_remote_code": True}
    commit = _tamper(token, {"model": model}, _evil_tokenizer(marker))
    with pytest.raises(RecipeError, match="refused unless you pass --trust-remote-code"):
        _reproduce(tmp_path, reference_server=True)
    assert not marker.exists()
    with pytest.raises(RecipeError, match="--trust-remote-code needs the code pinned to a commit"):
        _reproduce(tmp_path, reference_server=True, trust_remote_code=True)
    assert not marker.exists()
    plan: list[str] = []
    work = tmp_path / "pinned"
    hub.reproduce(
        f"{REPO}@{commit}", work_dir=work, announce=plan.append, reference_server=True,
        trust_remote_code=True, run_options={"progress": "none"},
    )  # fmt: skip
    assert marker.exists()  # allowed, pinned, and said first:
    assert "RUNS the tokenizer's Python code: haiku/tok/tokenization_evil.py sha256" in plan[0]


@pytest.mark.slow
def test_a_published_hub_tokenizer_with_remote_code_needs_a_commit_revision(
    emulator: HubServer, token: str, tmp_path: Path
) -> None:
    _publish(tmp_path / "r")
    _tamper(token, {"model": {"tokenizer": "mallory/tok", "revision": "main", "trust_remote_code": True}})
    with pytest.raises(RecipeError, match=r"model\.revision set to a 40-hex commit"):
        _reproduce(tmp_path, reference_server=True, trust_remote_code=True)


# --- finding 6: what push publishes -----------------------------------------------------------------


@pytest.mark.slow
def test_push_publishes_no_url_credentials(emulator: HubServer, token: str, tmp_path: Path) -> None:
    with reference_server(tmp_path) as (server, _):
        url = server.url.replace("http://", "http://alice:pw-e3raw-5b2e@")
        _publish(tmp_path / "r", server={"endpoints": [url]})
    assert emulator.find_bytes("pw-e3raw-5b2e") == []
    rows = hub.reproduce(REPO, work_dir=tmp_path / "w", reference_server=True, announce=[].append,
                         run_options={"progress": "none"})  # fmt: skip
    assert rows.full_agreement


@pytest.mark.parametrize("outside", ["template", "prompts"])
def test_push_refuses_a_file_outside_the_recipes_folder(
    emulator: HubServer, token: str, tmp_path: Path, victim: Path, outside: str
) -> None:
    folder = tmp_path / "r"
    folder.mkdir()
    if outside == "template":
        shutil.copy(reference_model_dir() / "tokenizer_config.json", tmp_path / "x.json")
        (tmp_path / "t.jinja").write_text("{{ messages[0].content }}")
        changes: dict[str, Any] = {"model": {"chat_template": "../t.jinja"}}
        field = "model.chat_template"
    else:
        changes = {"prompts": {"source": str(victim / "secret.jsonl")}}
        field = "prompts.source"
    with pytest.raises(
        HubError, match=rf"{field} .* is outside the recipe's folder .*push uploads only files"
    ):
        _publish(folder, **changes)
    assert emulator.find_bytes(SECRET) == [] and emulator.find_bytes("messages[0].content") == []


@pytest.mark.slow
def test_the_plan_is_printed_before_anything_is_generated(
    emulator: HubServer, token: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _publish(tmp_path / "r")
    seen: list[tuple[str, int]] = []
    with reference_server(tmp_path) as (server, ledger):
        hub.reproduce(
            REPO, work_dir=tmp_path / "w", overrides=[f"server.endpoints={server.url}"],
            announce=lambda text: seen.append((text, len(generations(ledger)))),
            run_options={"progress": "none"},
        )  # fmt: skip
        assert len(generations(ledger)) == 3
    ((plan, sent_before),) = seen
    assert sent_before == 0
    for line in (
        "requests to",
        "prompts           haiku/prompts/plain.jsonl (in the download)",
        "tokenizer         the reference model's",
        "code              none (trust_remote_code is false)",
    ):
        assert line in plan, line  # fmt: skip
    hub.reproduce(REPO, work_dir=tmp_path / "w2", reference_server=True, run_options={"progress": "none"})
    assert "reproducing       alice/eagle@" in capsys.readouterr().err  # by default, on standard error


@pytest.mark.slow
def test_push_publishes_no_local_path_of_the_tokenizer(
    emulator: HubServer, token: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokenizer = tmp_path / "private" / "models" / "qwen-ish"
    shutil.copytree(reference_model_dir(), tokenizer)
    _publish(tmp_path / "r", model={"tokenizer": str(tokenizer)})
    assert emulator.find_bytes(str(tmp_path)) == []  # not in the recipe, the manifest or the card
    published = yaml.safe_load(emulator.files(REPO)["recipes/haiku.yaml"])
    assert published["model"]["tokenizer"] == "haiku/tokenizer/qwen-ish"
    assert "`haiku/tokenizer/qwen-ish`" in emulator.files(REPO)["README.md"].decode()
    mine = tmp_path / "mine"
    shutil.copytree(reference_model_dir(), mine)
    result = _reproduce(tmp_path, reference_server=True, overrides=[f"model.tokenizer={mine}"])
    assert result.full_agreement  # the same tokenizer, by content, wherever it lives
