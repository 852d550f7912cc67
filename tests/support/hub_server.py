"""A Hub-compatible HTTP server for tests, driven by the real `huggingface_hub` and `datasets` clients.

Use it from pytest (the fixtures live here; import them into the test module or a conftest)::

    from tests.support.hub_server import HubServer, hub, hub_server

    def test_push(hub: HubServer) -> None:    # running, and this process's clients point at it
        HfApi(token=hub.tokens.write).create_repo("alice/x", repo_type="dataset")

Accounts: "alice" (member of org "team") and "bob". Tokens: `tokens.write` (alice, write),
`tokens.read` (alice, read-only), `tokens.bob` (bob, write). Every request is recorded in
`requests` (Authorization values redacted); `files()`, `stored_contents()` and `find_bytes()` expose
every byte ever stored, for leak checks. By hand: ``python -m tests.support.hub_server --port 8765``.

Pointing a client at the server -- what works:

- A subprocess with ``env=server.client_env(home)``: the most faithful, since `huggingface_hub` and
  `datasets` read `HF_ENDPOINT` (and HF_HOME, HF_HUB_OFFLINE, HF_HUB_DISABLE_XET, ...) when imported.
- In process, ``with server.pointed_at(home):`` (what the `hub` fixture does). Setting
  `os.environ["HF_ENDPOINT"]` after the import does nothing, and patching only
  `huggingface_hub.constants.ENDPOINT` is not enough: `hf_hub_download` builds URLs from
  `constants.HUGGINGFACE_CO_URL_TEMPLATE`; the module-level functions (`upload_file`, `create_repo`,
  used by `DatasetCard.push_to_hub`) are methods of `huggingface_hub.hf_api.api`, an `HfApi` created
  at import with the old endpoint; `utils._http._HUB_ORIGINS` decides which redirects keep the
  token; `datasets.config` has its own `HF_ENDPOINT`/`HUB_DATASETS_URL`, cache paths and offline
  flag; fsspec caches `HfFileSystem` instances. `pointed_at` patches all of them (verified: leaving
  the template or the `api` instance unpatched sends requests to huggingface.co) and also turns off
  the two side calls `datasets` makes to other hosts (download counts on S3, the datasets-server
  parquet export). `HfApi` objects created before entering keep their old endpoint.
- Uploads need `HF_HUB_DISABLE_XET=1` (both ways set it): files then go through the git-LFS batch
  API, which this server implements; it has no Xet storage.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import socket
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from .hub_api import AccessToken, Account, HubState, RecordedRequest, Role, make_app
from .hub_store import Repo

# Variables that would make a client use a real token or the real Hub.
_SCRUBBED_ENV = (
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "HF_OIDC_RESOURCE",
    "HF_OIDC_ID_TOKEN",
    "HF_HUB_OFFLINE",
    "HF_DATASETS_OFFLINE",
    "HUGGINGFACE_CO_STAGING",
    "HF_TOKEN_PATH",
    "HF_HUB_CACHE",
    "HUGGINGFACE_HUB_CACHE",
    "HF_XET_CACHE",
    "HF_MODULES_CACHE",
)


@dataclass(frozen=True)
class HubTokens:
    write: str  # alice, role write (alice can write to "alice/*" and "team/*")
    read: str  # alice, role read
    bob: str  # bob, role write (cannot write to alice's or team's repos)


def _token_value() -> str:
    return "hf_" + secrets.token_urlsafe(24).replace("-", "a").replace("_", "b")


def _listening_socket(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    return sock


class HubServer:
    """The emulator: a hub origin and a cdn origin on 127.0.0.1, served from a background thread."""

    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, cdn_port: int = 0, tokens: HubTokens | None = None
    ) -> None:
        self.state = HubState()
        self.tokens = tokens or HubTokens(_token_value(), _token_value(), _token_value())
        alice, bob = Account("alice", ("team",)), Account("bob")
        self.add_token(self.tokens.write, alice, "write", "alice-write")
        self.add_token(self.tokens.read, alice, "read", "alice-read")
        self.add_token(self.tokens.bob, bob, "write", "bob-write")
        self._host, self._ports = host, (port, cdn_port)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runners: list[web.AppRunner] = []

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> HubServer:
        hub_sock, cdn_sock = (_listening_socket(self._host, port) for port in self._ports)
        self.state.endpoint = f"http://{self._host}:{hub_sock.getsockname()[1]}"
        self.state.cdn_endpoint = f"http://{self._host}:{cdn_sock.getsockname()[1]}"
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="hub-emulator", daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._serve(hub_sock, cdn_sock), self._loop).result(timeout=30)
        return self

    async def _serve(self, hub_sock: socket.socket, cdn_sock: socket.socket) -> None:
        for origin, sock in (("hub", hub_sock), ("cdn", cdn_sock)):
            runner = web.AppRunner(make_app(self.state, origin), access_log=None)  # type: ignore[arg-type]
            await runner.setup()
            await web.SockSite(runner, sock).start()
            self._runners.append(runner)

    def stop(self) -> None:
        if self._loop is None or self._thread is None:
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()
        self._loop = self._thread = None

    async def _shutdown(self) -> None:
        for runner in self._runners:
            await runner.cleanup()
        self._runners.clear()

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- configuration -----------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        """What to use as `HF_ENDPOINT`, e.g. `http://127.0.0.1:40123`."""
        return self.state.endpoint

    @property
    def cdn_endpoint(self) -> str:
        return self.state.cdn_endpoint

    def add_token(self, value: str, account: Account, role: Role, name: str = "token") -> str:
        """Register another token (e.g. for a user in more orgs); returns its value."""
        self.state.tokens[value] = AccessToken(value, account, role, name)
        return value

    def create_repo(self, repo_id: str, repo_type: str = "dataset", private: bool = False) -> Repo:
        """Seed a repo directly (no HTTP), with the Hub's initial commit."""
        return self.state.store.create_repo(repo_type, repo_id, private)

    # -- inspection --------------------------------------------------------------------------

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every request received so far, in order (a copy)."""
        with self.state.lock:
            return list(self.state.requests)

    def clear_requests(self) -> None:
        with self.state.lock:
            self.state.requests.clear()

    @property
    def errors(self) -> list[str]:
        """Tracebacks of emulator bugs (answered with 501); should stay empty."""
        return list(self.state.errors)

    def files(self, repo_id: str, revision: str = "main", repo_type: str = "dataset") -> dict[str, bytes]:
        """Path -> content of a repo at a revision (branch, tag or commit id)."""
        store = self.state.store
        repo = store.get(repo_type, repo_id)
        if repo is None:
            raise KeyError(f"{repo_type} {repo_id} does not exist")
        commit = store.resolve(repo, revision)
        return {path: store.read(entry) for path, entry in commit.files.items()}

    def stored_contents(self) -> dict[str, bytes]:
        """Every content ever stored (all repos, all revisions, LFS objects), `blob:<oid>`/`lfs:<sha256>`."""
        return self.state.store.all_contents()

    def find_bytes(self, needle: bytes | str) -> list[str]:
        """Keys of stored contents, and commit messages, that contain `needle`."""
        raw = needle.encode() if isinstance(needle, str) else needle
        found = [key for key, data in self.stored_contents().items() if raw in data]
        with self.state.store.lock:
            for repo in self.state.store.repos.values():
                for commit in repo.commits.values():
                    if raw in f"{commit.title}\n{commit.message}".encode():
                        found.append(f"commit:{repo.repo_id}@{commit.oid}")
        return found

    # -- pointing clients at it --------------------------------------------------------------

    def client_env(self, home: Path | str, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """Environment for a subprocess whose `huggingface_hub`/`datasets` must talk to this server.

        Caches and the token file go under `home`; no real token leaks in; telemetry, download counts
        and Xet are off (uploads then go through the LFS batch API, like any non-Hub endpoint).
        """
        env = {k: v for k, v in (os.environ if base is None else base).items() if k not in _SCRUBBED_ENV}
        home = Path(home)
        no_proxy = ",".join(filter(None, [env.get("NO_PROXY", ""), "127.0.0.1", "localhost"]))
        env.update(
            {
                "HF_ENDPOINT": self.endpoint,
                "HF_HOME": str(home),
                "HF_DATASETS_CACHE": str(home / "datasets"),
                "HF_HUB_DISABLE_XET": "1",
                "HF_HUB_DISABLE_TELEMETRY": "1",
                "HF_UPDATE_DOWNLOAD_COUNTS": "0",
                "HF_HUB_DISABLE_PROGRESS_BARS": "1",
                "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
                "HF_HUB_DISABLE_UPDATE_CHECK": "1",
                "NO_PROXY": no_proxy,
                "no_proxy": no_proxy,
            }
        )
        return env

    @contextlib.contextmanager
    def pointed_at(self, home: Path | str) -> Iterator[HubServer]:
        """Point the already-imported `huggingface_hub` and `datasets` of this process at the server.

        Patches every value those libraries computed from the environment at import time (see
        `_client_patches`), scrubs token variables, and restores everything on exit.
        """
        home = Path(home)
        home.mkdir(parents=True, exist_ok=True)
        with _Patcher() as patcher:
            for target, name, value in _client_patches(self, home):
                patcher.setattr(target, name, value)
            for name in _SCRUBBED_ENV:
                patcher.delenv(name)
            for name, value in self.client_env(home, {}).items():
                patcher.setenv(name, value)
            _reset_client_caches()
            try:
                yield self
            finally:
                _reset_client_caches()


def _client_patches(server: HubServer, home: Path) -> list[tuple[Any, str, Any]]:
    """(object, attribute, value) for everything the clients derived from HF_* at import time."""
    import datasets.config as ds_config
    import huggingface_hub.constants as hf_constants
    import huggingface_hub.hf_api as hf_api
    import huggingface_hub.utils._http as hf_http

    endpoint, hub_home, ds_home = server.endpoint, home, home / "datasets"
    patches: list[tuple[Any, str, Any]] = [
        (hf_constants, "ENDPOINT", endpoint),
        (hf_constants, "HUGGINGFACE_CO_URL_TEMPLATE", endpoint + "/{repo_id}/resolve/{revision}/{filename}"),
        (hf_constants, "HF_URL_HOSTS", hf_constants.HF_URL_HOSTS | {"127.0.0.1"}),
        (hf_http, "_HUB_ORIGINS", hf_http._HUB_ORIGINS | {hf_http._url_origin(endpoint)}),
        (hf_api.api, "endpoint", endpoint),  # the instance behind `upload_file`, `create_repo`, ... functions
        (ds_config, "HF_ENDPOINT", endpoint),
        (ds_config, "HUB_DATASETS_URL", endpoint + "/datasets/{repo_id}/resolve/{revision}/{path}"),
        (ds_config, "HF_UPDATE_DOWNLOAD_COUNTS", False),  # else a HEAD to s3.amazonaws.com per load
        (ds_config, "USE_PARQUET_EXPORT", False),  # else a GET to datasets-server.<endpoint host>
    ]
    for name, value in {
        "HF_HUB_DISABLE_XET": True,
        "HF_HUB_DISABLE_TELEMETRY": True,
        "HF_HUB_OFFLINE": False,
        "HF_HOME": str(hub_home),
        "HF_HUB_CACHE": str(hub_home / "hub"),
        "HF_ASSETS_CACHE": str(hub_home / "assets"),
        "HF_XET_CACHE": str(hub_home / "xet"),
        "HF_TOKEN_PATH": str(hub_home / "token"),
        "HF_STORED_TOKENS_PATH": str(hub_home / "stored_tokens"),
        "AGENT_HARNESSES_PATH": str(hub_home / ".agent_harnesses.json"),
    }.items():
        patches.append((hf_constants, name, value))
    for name, value in {
        "HF_HUB_OFFLINE": False,
        "HF_DATASETS_OFFLINE": False,
        "HF_CACHE_HOME": str(hub_home),
        "HF_DATASETS_CACHE": ds_home,
        "HF_MODULES_CACHE": hub_home / "modules",
        "DOWNLOADED_DATASETS_PATH": ds_home / "downloads",
        "EXTRACTED_DATASETS_PATH": ds_home / "downloads" / "extracted",
    }.items():
        patches.append((ds_config, name, value))
    return patches


def _reset_client_caches() -> None:
    """Forget cached filesystems and HTTP connections tied to a previous endpoint."""
    from huggingface_hub import HfFileSystem
    from huggingface_hub.utils._http import close_session

    HfFileSystem.clear_instance_cache()
    close_session()


class _Patcher:
    """setattr/environ changes undone in reverse order on exit (like pytest's monkeypatch)."""

    _MISSING = object()

    def __init__(self) -> None:
        self._undo: list[tuple[str, Any, str, Any]] = []

    def __enter__(self) -> _Patcher:
        return self

    def __exit__(self, *exc: object) -> None:
        for kind, target, name, old in reversed(self._undo):
            if kind == "attr":
                setattr(target, name, old)
            elif old is self._MISSING:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old
        self._undo.clear()

    def setattr(self, target: Any, name: str, value: Any) -> None:
        self._undo.append(("attr", target, name, getattr(target, name)))
        setattr(target, name, value)

    def setenv(self, name: str, value: str) -> None:
        self._undo.append(("env", None, name, os.environ.get(name, self._MISSING)))
        os.environ[name] = value

    def delenv(self, name: str) -> None:
        self._undo.append(("env", None, name, os.environ.get(name, self._MISSING)))
        os.environ.pop(name, None)


# -- pytest fixtures -----------------------------------------------------------------------------


@pytest.fixture
def hub_server() -> Iterator[HubServer]:
    """A running emulator (fresh, empty). Fails the test if the emulator hit a bug."""
    with HubServer() as server:
        yield server
    assert not server.errors, "Hub emulator errors:\n" + "\n".join(server.errors)


@pytest.fixture
def hub(hub_server: HubServer, tmp_path: Path) -> Iterator[HubServer]:
    """`hub_server`, with this process's `huggingface_hub` and `datasets` pointed at it."""
    with hub_server.pointed_at(tmp_path / "hf-home"):
        yield hub_server


# -- manual use ----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Run the Hub emulator (tests.support.hub_server) on loopback."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--cdn-port", type=int, default=0, help="port of the LFS storage origin (0: any)")
    parser.add_argument("--write-token", help="value of alice's write token (default: random)")
    parser.add_argument("--read-token", help="value of alice's read-only token (default: random)")
    args = parser.parse_args(argv)
    tokens = HubTokens(args.write_token or _token_value(), args.read_token or _token_value(), _token_value())
    with HubServer(args.host, args.port, args.cdn_port, tokens) as server:
        print(f"HF_ENDPOINT={server.endpoint} HF_HUB_DISABLE_XET=1", flush=True)
        print(f"LFS storage at {server.cdn_endpoint}")
        print(f"alice write token: {tokens.write}\nalice read token:  {tokens.read}")
        print(f"bob write token:   {tokens.bob}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()


if __name__ == "__main__":
    main()
