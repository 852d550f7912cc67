"""The Hub emulator, driven by the real `huggingface_hub` and `datasets` clients (no client mocks)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from datasets import Dataset, load_dataset
from datasets.exceptions import DatasetNotFoundError
from huggingface_hub import (
    CommitInfo,
    CommitOperationAdd,
    CommitOperationCopy,
    CommitOperationDelete,
    DatasetCard,
    HfApi,
    HfFileSystem,
    RepoFile,
    hf_hub_download,
    snapshot_download,
)
from huggingface_hub.errors import (
    BadRequestError,
    EntryNotFoundError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils.sha import git_hash

from tests.support.pace import scaled

try:
    from tests.support.hub_server import HubServer, hub, hub_server
except ModuleNotFoundError:  # `tests` is a package only when the repo root is on sys.path
    from support.hub_server import HubServer, hub, hub_server  # type: ignore[no-redef]  # noqa: F401

REPO = "alice/emu"
Operation = CommitOperationAdd | CommitOperationCopy | CommitOperationDelete


def _api(hub: HubServer, token: str | bool | None = None) -> HfApi:
    return HfApi(token=hub.tokens.write if token is None else token)


def _upload(api: HfApi, path: str, data: bytes, **kwargs: str) -> CommitInfo:
    return api.upload_file(
        path_or_fileobj=data, path_in_repo=path, repo_id=REPO, repo_type="dataset", **kwargs
    )


def _files(api: HfApi, revision: str = "main") -> dict[str, RepoFile]:
    tree = api.list_repo_tree(REPO, repo_type="dataset", recursive=True, revision=revision)
    return {entry.path: entry for entry in tree if isinstance(entry, RepoFile)}


def _status(err: pytest.ExceptionInfo[HfHubHTTPError]) -> int:
    return err.value.response.status_code


def test_upload_list_and_download_by_branch_tag_and_commit(hub: HubServer, tmp_path: Path) -> None:
    api = _api(hub)
    api.create_repo(REPO, repo_type="dataset", private=True)
    api.create_repo(REPO, repo_type="dataset", exist_ok=True)
    small, big = b"rows: 3\n", os.urandom(64 * 1024)
    _upload(api, "notes.txt", small)
    tagged = _upload(api, "data/shard.bin", big)
    api.create_tag(REPO, tag="v1", repo_type="dataset")
    _upload(api, "notes.txt", b"later\n")

    files = _files(api, "v1")
    assert set(files) == {".gitattributes", "notes.txt", "data/shard.bin"}
    assert files["data/shard.bin"].lfs is not None
    assert files["data/shard.bin"].lfs.sha256 == hashlib.sha256(big).hexdigest()
    assert files["notes.txt"].lfs is None and files["notes.txt"].blob_id == git_hash(small)
    assert api.list_repo_files(REPO, repo_type="dataset", revision="v1") == sorted(files)
    refs = api.list_repo_refs(REPO, repo_type="dataset")
    assert [b.name for b in refs.branches] == ["main"]
    assert {t.name: t.target_commit for t in refs.tags} == {"v1": tagged.oid}

    for revision in ("v1", tagged.oid, "main"):

        def fetch(name: str, rev: str = revision) -> bytes:
            path = hf_hub_download(
                REPO, name, repo_type="dataset", revision=rev, token=hub.tokens.write, cache_dir=tmp_path
            )
            return Path(path).read_bytes()

        assert fetch("data/shard.bin") == big
        assert fetch("notes.txt") == (b"later\n" if revision == "main" else small)
    snapshot = Path(
        snapshot_download(
            REPO, repo_type="dataset", revision="v1", cache_dir=tmp_path / "snap", token=hub.tokens.write
        )
    )
    assert (snapshot / "data" / "shard.bin").read_bytes() == big and (
        snapshot / "notes.txt"
    ).read_bytes() == small
    cdn = [r for r in hub.requests if r.origin == "cdn"]
    assert {r.method for r in cdn} == {"PUT", "GET"}
    assert not any("authorization" in r.headers for r in cdn), "the token must not follow the redirect"


def test_upload_modes_follow_gitattributes_size_and_content(hub: HubServer) -> None:
    api = _api(hub)
    api.create_repo(REPO, repo_type="dataset")
    ops: list[Operation] = [
        CommitOperationAdd("plain.txt", b"text\n"),
        CommitOperationAdd("looks_text.parquet", b"text, but *.parquet is LFS in .gitattributes\n"),
        CommitOperationAdd("blob.dat", b"\x00\x01binary"),
    ]
    api.create_commit(REPO, operations=ops, commit_message="modes", repo_type="dataset")
    lfs = {path: entry.lfs is not None for path, entry in _files(api).items()}
    assert lfs == {".gitattributes": False, "plain.txt": False, "looks_text.parquet": True, "blob.dat": True}


def test_commit_operations_copy_delete_and_skip_unchanged(hub: HubServer, tmp_path: Path) -> None:
    api = _api(hub)
    api.create_repo(REPO, repo_type="dataset")
    folder = tmp_path / "folder"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_text("a\n")
    (folder / "sub" / "b.txt").write_text("b\n")
    (folder / "sub" / "c.parquet").write_bytes(b"PAR1 not really")
    api.upload_folder(folder_path=folder, repo_id=REPO, repo_type="dataset")
    ops: list[Operation] = [
        CommitOperationCopy("sub/c.parquet", "copy.parquet"),
        CommitOperationCopy("a.txt", "a2.txt"),
        CommitOperationDelete("sub/"),
    ]
    api.create_commit(REPO, operations=ops, commit_message="reshape", repo_type="dataset")
    files = hub.files(REPO)
    assert set(files) == {".gitattributes", "a.txt", "a2.txt", "copy.parquet"}
    assert files["copy.parquet"] == b"PAR1 not really" and files["a2.txt"] == b"a\n"
    before = len(api.list_repo_commits(REPO, repo_type="dataset"))
    _upload(api, "a.txt", b"a\n")
    assert len(api.list_repo_commits(REPO, repo_type="dataset")) == before  # unchanged: no empty commit


def test_revision_and_entry_errors_match_the_hub(hub: HubServer) -> None:
    api = _api(hub)
    api.create_repo(REPO, repo_type="dataset")
    first = _upload(api, "f.txt", b"1")
    with pytest.raises(RevisionNotFoundError):
        _upload(api, "g.txt", b"2", revision="dev")
    api.create_branch(REPO, branch="dev", repo_type="dataset")
    api.create_branch(REPO, branch="dev", repo_type="dataset", exist_ok=True)
    with pytest.raises(HfHubHTTPError) as conflict:
        api.create_branch(REPO, branch="dev", repo_type="dataset")
    assert _status(conflict) == 409
    _upload(api, "g.txt", b"2", revision="dev")
    assert "g.txt" in hub.files(REPO, "dev") and "g.txt" not in hub.files(REPO, "main")

    with pytest.raises(RevisionNotFoundError):
        api.dataset_info(REPO, revision="nope")
    with pytest.raises(EntryNotFoundError):
        hf_hub_download(REPO, "missing.txt", repo_type="dataset", token=hub.tokens.write)
    with pytest.raises(EntryNotFoundError, match="A file with this name doesn't exist"):
        api.delete_file("missing.txt", REPO, repo_type="dataset")
    api.create_tag(REPO, tag="v1", repo_type="dataset", revision=first.oid)
    with pytest.raises(BadRequestError):  # commits go to branches only
        _upload(api, "h.txt", b"3", revision="v1")
    api.delete_tag(REPO, tag="v1", repo_type="dataset")
    with pytest.raises(RevisionNotFoundError):
        api.delete_tag(REPO, tag="v1", repo_type="dataset")
    _upload(api, "i.txt", b"4")
    with pytest.raises(HfHubHTTPError) as stale:  # main moved on since `first`
        _upload(api, "j.txt", b"5", parent_commit=first.oid)
    assert _status(stale) == 412


def test_paths_info_commits_pagination_and_filesystem(hub: HubServer) -> None:
    api = _api(hub)
    api.create_repo(REPO, repo_type="dataset")
    _upload(api, "notes.txt", b"n\n", commit_message="Upload notes")
    big = os.urandom(5000)
    _upload(api, "data/shard.bin", big, commit_message="Upload shard")
    hub.state.tree_page_size = 2  # every listing below spans several pages

    infos = api.get_paths_info(REPO, ["data", "notes.txt", "missing"], repo_type="dataset", expand=True)
    last = {i.path: i.last_commit.title for i in infos if i.last_commit}
    assert last == {"data": "Upload shard", "notes.txt": "Upload notes"}
    titles = [c.title for c in api.list_repo_commits(REPO, repo_type="dataset")]
    assert titles == ["Upload shard", "Upload notes", "initial commit"]
    fs = HfFileSystem(token=hub.tokens.write)
    root = f"datasets/{REPO}"
    assert fs.ls(root, detail=False) == [f"{root}/.gitattributes", f"{root}/data", f"{root}/notes.txt"]
    assert fs.glob(f"{root}@main/**/*.bin") == [f"{root}@main/data/shard.bin"]
    with fs.open(f"{root}/data/shard.bin", "rb", block_size=1024) as f:
        f.seek(3000)
        assert f.read(100) == big[3000:3100]
    assert fs.cat_file(f"{root}/notes.txt") == b"n\n"
    assert any("cursor=" in r.path for r in hub.requests if "/tree/" in r.path)
    assert any("range" in r.headers for r in hub.requests if r.origin == "cdn")


def test_push_to_hub_keeps_configs_and_loads_by_tag(hub: HubServer) -> None:
    token = hub.tokens.write
    config_a = Dataset.from_dict({"id": ["x", "y"], "input_ids": [[1, 2], [3]]})
    config_b = Dataset.from_dict({"text": ["only b"]})
    config_a.push_to_hub(REPO, config_name="a", private=True, token=token)
    _api(hub).create_tag(REPO, tag="v1", repo_type="dataset")
    config_b.push_to_hub(REPO, config_name="b", token=token)
    config_b.push_to_hub(REPO, config_name="c", revision="dev", token=token)  # creates the branch first
    with pytest.raises(
        DatasetNotFoundError
    ):  # private (and not cached yet: datasets falls back to its cache)
        load_dataset(REPO, "a", revision="v1", split="train", token=False)

    at_tag = load_dataset(REPO, "a", revision="v1", split="train", token=token)
    assert at_tag.to_dict() == config_a.to_dict() and at_tag.features == config_a.features
    assert load_dataset(REPO, "a", split="train", token=token).to_dict() == config_a.to_dict()
    assert load_dataset(REPO, "b", split="train", token=token).to_dict() == config_b.to_dict()
    assert load_dataset(REPO, "c", revision="dev", split="train", token=token).to_dict() == config_b.to_dict()
    card = DatasetCard.load(REPO, token=token)
    assert {c["config_name"] for c in card.data.configs} == {"a", "b"}
    assert {i["config_name"] for i in card.data.dataset_info} == {"a", "b"}
    shards = [entry for path, entry in _files(_api(hub)).items() if path.endswith(".parquet")]
    assert len(shards) == 2 and all(shard.lfs is not None for shard in shards)


def test_dataset_card_roundtrip_and_card_data(hub: HubServer) -> None:
    api = _api(hub)
    api.create_repo(REPO, repo_type="dataset")
    DatasetCard("---\nlicense: mit\ntags:\n- eagle3\n---\n# Card\n").push_to_hub(REPO, token=hub.tokens.write)
    card = DatasetCard.load(REPO, token=hub.tokens.write)
    assert card.data.license == "mit" and card.text.strip() == "# Card"
    info = api.dataset_info(REPO)
    assert info.card_data is not None and info.card_data.license == "mit"
    assert {"eagle3", "license:mit"} <= set(info.tags or [])
    with pytest.raises(ValueError, match=r"Invalid metadata in README\.md"):  # the Hub's /api/validate-yaml
        _upload(api, "README.md", b"---\nlicense: [unclosed\n---\n")


def test_auth_errors_match_the_hub(hub: HubServer) -> None:
    alice, bob, reader = _api(hub), _api(hub, hub.tokens.bob), _api(hub, hub.tokens.read)
    anonymous = _api(hub, False)
    assert reader.whoami()["auth"]["accessToken"]["role"] == "read"
    assert [org["name"] for org in alice.whoami()["orgs"]] == ["team"]
    with pytest.raises(HfHubHTTPError, match="Invalid credentials in Authorization header"):
        _api(hub, "hf_not_a_token").dataset_info(REPO)
    for api, status in ((anonymous, 401), (bob, 403), (reader, 403)):
        with pytest.raises(HfHubHTTPError) as denied:
            api.create_repo(REPO, repo_type="dataset")
        assert _status(denied) == status
    alice.create_repo("team/secret", repo_type="dataset", private=True)  # an org alice belongs to
    alice.create_repo(REPO, repo_type="dataset")
    for api in (anonymous, bob):
        with pytest.raises(RepositoryNotFoundError):
            api.dataset_info("team/secret")
    for api, status in ((anonymous, 401), (bob, 403), (reader, 403)):
        with pytest.raises(HfHubHTTPError) as denied:
            _upload(api, "x.txt", b"x")
        assert _status(denied) == status
    rows = Dataset.from_dict({"x": [1]})
    with pytest.raises(HfHubHTTPError) as no_token:
        rows.push_to_hub("alice/new", token=None)
    assert _status(no_token) == 401
    with pytest.raises(HfHubHTTPError, match='under the namespace "alice"') as foreign:
        rows.push_to_hub("alice/new", token=hub.tokens.bob)
    assert _status(foreign) == 403


def test_requests_are_recorded_and_contents_exposed_without_tokens(hub: HubServer) -> None:
    Dataset.from_dict({"x": [1, 2]}).push_to_hub(REPO, token=hub.tokens.write)
    tokens = (hub.tokens.write, hub.tokens.read, hub.tokens.bob)
    assert all(hub.find_bytes(token) == [] for token in tokens)
    assert any(key.startswith("lfs:") for key in hub.stored_contents())
    seen = [r for r in hub.requests if "authorization" in r.headers]
    assert seen and all(r.headers["authorization"] == "Bearer <redacted>" and r.user == "alice" for r in seen)
    assert not any(token in value for r in hub.requests for value in r.headers.values() for token in tokens)
    commit = next(r for r in hub.requests if r.method == "POST" and "/commit/" in r.path)
    assert commit.body_size > 0 and commit.status == 200
    _upload(_api(hub), "leak.txt", f"oops {hub.tokens.read}".encode())
    assert len(hub.find_bytes(hub.tokens.read)) == 1  # the check does find a leak


@pytest.mark.slow
def test_client_env_points_a_subprocess_at_the_server(hub_server: HubServer, tmp_path: Path) -> None:
    script = textwrap.dedent("""
        import sys
        from datasets import Dataset, load_dataset
        from huggingface_hub import HfApi
        token = sys.argv[1]
        Dataset.from_dict({"x": [1, 2, 3]}).push_to_hub("alice/sub", config_name="c", token=token)
        HfApi(token=token).create_tag("alice/sub", tag="v1", repo_type="dataset")
        assert load_dataset("alice/sub", "c", revision="v1", split="train", token=token)["x"] == [1, 2, 3]
    """)
    env = hub_server.client_env(tmp_path / "hf-home")
    command = [sys.executable, "-c", script, hub_server.tokens.write]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=scaled(120))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "configs:" in hub_server.files("alice/sub", "v1")["README.md"].decode()
    assert {r.origin for r in hub_server.requests} == {"hub", "cdn"}
