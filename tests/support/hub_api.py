"""HTTP side of the Hub emulator: accounts and tokens, routing, and one handler per Hub endpoint.

Two aiohttp applications share one `HubState`:

- the *hub* app answers what huggingface.co answers (`/api/...`, `/{repo}/resolve/...`, the git-LFS
  batch API), with the Hub's status codes, `X-Error-Code`/`X-Error-Message` headers and JSON shapes;
- the *cdn* app stands for the storage the Hub redirects to (cdn-lfs / S3): LFS downloads and
  pre-signed LFS uploads. It listens on another port, so it is another origin: the clients drop the
  Authorization header when they follow a redirect there, exactly as they do in production.

Routing matches the raw (still percent-encoded) path, because the clients encode revisions such as
`refs/convert/parquet` as one segment.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import html
import json
import re
import threading
import time
import traceback
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import unquote

import yaml
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from .hub_store import (
    HEX40,
    NAME,
    SHA256,
    AddFile,
    AddLfsFile,
    Commit,
    CommitOp,
    DeleteFile,
    DeleteFolder,
    FileEntry,
    HubError,
    HubStore,
    Repo,
    ignored_by,
    tree_oid,
)

Role = Literal["read", "write"]
Origin = Literal["hub", "cdn"]
REPO_TYPES = {"models": "model", "datasets": "dataset", "spaces": "space"}
URL_PREFIXES = {"model": "", "dataset": "datasets/", "space": "spaces/"}
REGULAR_FILE_LIMIT = 10 * 1024 * 1024
YAML_BLOCK = re.compile(r"^(\s*---[\r\n]+)([\S\s]*?)([\r\n]+---(\r\n|\n|$))")
ANONYMOUS = "Invalid username or password."


@dataclass(frozen=True)
class Account:
    """A user and the organizations it can write to."""

    name: str
    orgs: tuple[str, ...] = ()

    def can_write(self, namespace: str) -> bool:
        return namespace == self.name or namespace in self.orgs


@dataclass(frozen=True)
class AccessToken:
    value: str
    account: Account
    role: Role
    name: str


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the emulator saw it. The Authorization value is never kept."""

    origin: Origin
    method: str
    path: str  # path and query, as sent (percent-encoded)
    headers: Mapping[str, str]  # case-insensitive
    body_size: int
    status: int
    user: str | None  # account of the token sent, if it was a known token


@dataclass
class HubState:
    """Everything both apps share. `endpoint`/`cdn_endpoint` are set once the sockets are bound."""

    store: HubStore = field(default_factory=HubStore)
    tokens: dict[str, AccessToken] = field(default_factory=dict)
    requests: list[RecordedRequest] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    secret: bytes = field(default_factory=lambda: uuid.uuid4().bytes)
    endpoint: str = ""
    cdn_endpoint: str = ""
    tree_page_size: int = 1000
    commits_page_size: int = 50
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, entry: RecordedRequest) -> None:
        with self.lock:
            self.requests.append(entry)

    def sign(self, resource: str, expires: int) -> str:
        return hmac.new(self.secret, f"{resource}:{expires}".encode(), hashlib.sha256).hexdigest()

    def signed_query(self, resource: str) -> str:
        expires = int(time.time()) + 3600
        return f"expires={expires}&signature={self.sign(resource, expires)}"

    def web_url(self, repo: Repo) -> str:
        return f"{self.endpoint}/{URL_PREFIXES[repo.repo_type]}{repo.repo_id}"


def iso(date: dt.datetime) -> str:
    return date.strftime("%Y-%m-%dT%H:%M:%S.") + f"{date.microsecond // 1000:03d}Z"


def json_response(data: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.json_response(data, status=status, headers=dict(headers or {}))


def error_response(err: HubError) -> web.Response:
    """The Hub's error shape: JSON `{"error": ...}` plus `X-Error-Message` (and `X-Error-Code`)."""
    headers = {"X-Error-Message": err.message, **err.headers}
    if err.code:
        headers["X-Error-Code"] = err.code
    return json_response({"error": err.message, **err.body}, err.status, headers)


# -- one request ---------------------------------------------------------------------------------


@dataclass
class Call:
    """A routed request: the state, the aiohttp request, the decoded path groups and the caller."""

    state: HubState
    request: web.Request
    params: dict[str, str]
    token: AccessToken | None

    @property
    def store(self) -> HubStore:
        return self.state.store

    @property
    def repo_type(self) -> str:
        kind = self.params.get("type") or self.params.get("prefix") or "models"
        return REPO_TYPES[kind]

    async def json(self) -> Any:
        try:
            return json.loads(await self.request.read() or b"{}")
        except ValueError as err:
            raise HubError(400, f"Invalid JSON body: {err}") from err

    def flag(self, name: str) -> bool:
        return self.request.query.get(name, "").lower() in ("1", "true")

    def readable_repo(self) -> Repo:
        """The repo if the caller may read it; else the Hub's 401 (anonymous) or 404, RepoNotFound."""
        repo = self.store.get(self.repo_type, self.params["repo"])
        if repo is None or (repo.private and not self._member_of(repo.namespace)):
            if self.token is None:
                raise HubError(401, ANONYMOUS, "RepoNotFound")
            raise HubError(404, "Repository not found", "RepoNotFound")
        return repo

    def writable_repo(self) -> Repo:
        repo = self.readable_repo()
        self.require_write(repo.namespace, f"push to {self.repo_type} {repo.repo_id}")
        return repo

    def require_write(self, namespace: str, action: str) -> AccessToken:
        """401 without a token, 403 for a read token or a namespace the account cannot write."""
        if self.token is None:
            raise HubError(401, ANONYMOUS)
        if self.token.role != "write":
            raise HubError(
                403,
                f'You don\'t have the rights to {action}: this token has the "read" role, not "write"',
            )
        if not self.token.account.can_write(namespace):
            raise HubError(403, f"You don't have the rights to {action}")
        return self.token

    def _member_of(self, namespace: str) -> bool:
        return self.token is not None and self.token.account.can_write(namespace)

    def page(self, items: list[Any], size: int) -> web.Response:
        """One page of `items` and, if more remain, a `Link: <...>; rel="next"` header."""
        start = int(self.request.query.get("cursor") or 0)
        headers = {}
        if start + size < len(items):
            next_url = self.request.rel_url.update_query(cursor=str(start + size))
            headers["Link"] = f'<{self.state.endpoint}{next_url}>; rel="next"'
        return json_response(items[start : start + size], headers=headers)


Handler = Callable[[Call], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Route:
    methods: frozenset[str]
    pattern: re.Pattern[str]
    handler: Handler


def route(methods: str, pattern: str, handler: Handler) -> Route:
    return Route(frozenset(methods.split()), re.compile(pattern), handler)


def identify(state: HubState, request: web.Request) -> AccessToken | None:
    """The caller's token; an unknown one is the Hub's 401 'Invalid credentials'."""
    header = request.headers.get("Authorization")
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    token = state.tokens.get(value.strip()) if scheme.lower() == "bearer" else None
    if token is None:
        raise HubError(401, "Invalid credentials in Authorization header")
    return token


def make_dispatcher(
    state: HubState, routes: list[Route]
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def dispatch(request: web.Request) -> web.StreamResponse:
        path = request.rel_url.raw_path
        allowed = False
        for candidate in routes:
            match = candidate.pattern.fullmatch(path)
            if match and request.method in candidate.methods:
                params = {k: unquote(v) for k, v in match.groupdict().items() if v is not None}
                return await candidate.handler(Call(state, request, params, identify(state, request)))
            allowed = allowed or bool(match)
        if allowed:
            raise HubError(405, f"Method {request.method} not allowed")
        raise HubError(404, f"Not found: {path} (the emulator does not implement this endpoint)")

    return dispatch


def make_middleware(state: HubState, origin: Origin) -> Any:
    """Turn errors into Hub-shaped responses and record every request (Authorization redacted)."""

    @web.middleware
    async def middleware(request: web.Request, handler: Any) -> web.StreamResponse:
        body = await request.read()
        try:
            response: web.StreamResponse = await handler(request)
        except HubError as err:
            response = error_response(err)
        except Exception as exc:  # an emulator bug: 501 is not retried by the clients, so tests fail fast
            state.errors.append(traceback.format_exc())
            response = error_response(HubError(501, f"Hub emulator error: {exc!r}"))
        response.headers.setdefault(
            "X-Request-Id", request.headers.get("X-Amzn-Trace-Id") or uuid.uuid4().hex
        )
        state.record(_recorded(state, origin, request, len(body), response.status))
        return response

    return middleware


def _recorded(
    state: HubState, origin: Origin, request: web.Request, size: int, status: int
) -> RecordedRequest:
    """The request with every Authorization value replaced by `<scheme> <redacted>`."""
    headers: CIMultiDict[str] = CIMultiDict()
    user = None
    for name, value in request.headers.items():
        if name.lower() == "authorization":
            scheme, _, secret = value.partition(" ")
            token = state.tokens.get(secret.strip())
            user = token.account.name if token else None
            value = f"{scheme} <redacted>"
        headers.add(name, value)
    path = request.rel_url.raw_path_qs
    return RecordedRequest(origin, request.method, path, CIMultiDictProxy(headers), size, status, user)


# -- account -------------------------------------------------------------------------------------


async def whoami(call: Call) -> web.StreamResponse:
    """GET /api/whoami-v2: the token's user, its orgs and the token's role."""
    if call.token is None:
        raise HubError(401, ANONYMOUS)
    account = call.token.account
    orgs = [
        {
            "type": "org",
            "id": _uid(org),
            "name": org,
            "fullname": org,
            "roleInOrg": "write",
            "isEnterprise": False,
            "canPay": False,
            "avatarUrl": "",
        }
        for org in account.orgs
    ]
    return json_response(
        {
            "type": "user",
            "id": _uid(account.name),
            "name": account.name,
            "fullname": account.name.title(),
            "email": f"{account.name}@example.com",
            "emailVerified": True,
            "canPay": False,
            "isPro": False,
            "periodEnd": None,
            "avatarUrl": "",
            "orgs": orgs,
            "auth": {
                "type": "access_token",
                "accessToken": {
                    "displayName": call.token.name,
                    "role": call.token.role,
                    "createdAt": "2024-01-01T00:00:00.000Z",
                },
            },
        }
    )


def _uid(name: str) -> str:
    return hashlib.sha1(name.encode()).hexdigest()[:24]


async def validate_yaml(call: Call) -> web.StreamResponse:
    """POST /api/validate-yaml: the README's YAML front matter must parse to a mapping."""
    payload = await call.json()
    try:
        card_metadata(payload.get("content", ""), strict=True)
    except (yaml.YAMLError, ValueError) as err:
        message = f"Invalid YAML metadata: {err}"
        return json_response(
            {"errors": [{"message": message}], "warnings": []}, 400, {"X-Error-Message": "Invalid"}
        )
    return json_response({"errors": [], "warnings": []})


def card_metadata(text: str | None, strict: bool = False) -> dict[str, Any] | None:
    match = YAML_BLOCK.match(text or "")
    if match is None:
        return None
    try:
        data = yaml.safe_load(match.group(2))
    except yaml.YAMLError:
        if strict:
            raise
        return None
    if data is not None and not isinstance(data, dict):
        if strict:
            raise ValueError("the metadata must be a mapping")
        return None
    return data


# -- repos ---------------------------------------------------------------------------------------


async def create_repo(call: Call) -> web.StreamResponse:
    """POST /api/repos/create: 401 anonymous, 403 foreign namespace or read token, 409 if it exists."""
    payload = await call.json()
    repo_type, name = payload.get("type") or "model", str(payload.get("name", ""))
    if repo_type not in URL_PREFIXES:
        raise HubError(400, f"Invalid repo type: {repo_type}")
    if call.token is None:
        raise HubError(401, ANONYMOUS)
    namespace = payload.get("organization") or call.token.account.name
    call.require_write(namespace, f'create a {repo_type} under the namespace "{namespace}"')
    if not NAME.fullmatch(name) or "--" in name or ".." in name or name.endswith((".git", ".")):
        raise HubError(400, f"Invalid repo name: {name!r}")
    repo_id = f"{namespace}/{name}"
    existing = call.store.get(repo_type, repo_id)
    if existing is not None:
        raise HubError(
            409, f"You already created this {repo_type} repo", body={"url": call.state.web_url(existing)}
        )
    private = payload.get("visibility", "private" if payload.get("private") else "public") == "private"
    repo = call.store.create_repo(repo_type, repo_id, private)
    return json_response({"url": call.state.web_url(repo), "name": repo.repo_id, "id": repo.uid})


async def delete_repo(call: Call) -> web.StreamResponse:
    """DELETE /api/repos/delete."""
    payload = await call.json()
    repo_type = payload.get("type") or "model"
    namespace = payload.get("organization") or (call.token.account.name if call.token else "")
    repo_id = f"{namespace}/{payload.get('name')}"
    call.params.update(repo=repo_id, type=f"{repo_type}s")
    call.store.delete_repo(call.writable_repo())
    return json_response({})


async def update_settings(call: Call) -> web.StreamResponse:
    """PUT /api/{type}s/{repo}/settings: visibility (`private` or `visibility`)."""
    repo, payload = call.writable_repo(), await call.json()
    if "private" in payload:
        repo.private = bool(payload["private"])
    if "visibility" in payload:
        repo.private = payload["visibility"] == "private"
    return json_response({"private": repo.private})


async def repo_info(call: Call) -> web.StreamResponse:
    """GET /api/{type}s/{repo}[/revision/{rev}]: sha, siblings (with `blobs=true` sizes/LFS), cardData."""
    repo = call.readable_repo()
    commit = call.store.resolve(repo, call.params.get("rev", "main"))
    info = _repo_info_json(call, repo, commit, call.flag("blobs"))
    expand = call.request.query.getall("expand", []) + call.request.query.getall("expand[]", [])
    if expand:
        info = {k: v for k, v in info.items() if k in {"_id", "id", *expand}}
    return json_response(info)


def _repo_info_json(call: Call, repo: Repo, commit: Commit, blobs: bool) -> dict[str, Any]:
    card = card_metadata(call.store.text_at(commit, "README.md"))
    info: dict[str, Any] = {
        "_id": repo.uid,
        "id": repo.repo_id,
        "author": repo.namespace,
        "sha": commit.oid,
        "lastModified": iso(commit.date),
        "createdAt": iso(repo.created_at),
        "private": repo.private,
        "gated": False,
        "disabled": False,
        "downloads": 0,
        "likes": 0,
        "tags": _tags(card),
        "siblings": [_sibling(path, entry, blobs) for path, entry in sorted(commit.files.items())],
        "usedStorage": sum(entry.size for entry in commit.files.values()),
    }
    if repo.repo_type == "model":
        info["modelId"] = repo.repo_id
    if card is not None:
        info["cardData"] = card
    if repo.repo_type == "dataset" and card is not None:
        info["description"] = card.get("pretty_name")
    return info


def _sibling(path: str, entry: FileEntry, blobs: bool) -> dict[str, Any]:
    if not blobs:
        return {"rfilename": path}
    out: dict[str, Any] = {"rfilename": path, "size": entry.size, "blobId": entry.oid}
    if entry.lfs_sha256:
        out["lfs"] = {"sha256": entry.lfs_sha256, "size": entry.size, "pointerSize": entry.pointer_size}
    return out


def _tags(card: dict[str, Any] | None) -> list[str]:
    card = card or {}
    tags = [str(tag) for tag in card.get("tags") or []]
    for key in ("license", "language", "task_categories", "task_ids", "size_categories", "multilinguality"):
        values = card.get(key)
        for value in values if isinstance(values, list) else [values] if values else []:
            tags.append(f"{key}:{value}")
    return [*tags, "region:us"]


# -- listing -------------------------------------------------------------------------------------


def list_tree(commit: Commit, directory: str, recursive: bool) -> list[tuple[str, FileEntry | None]]:
    """(path, entry) pairs under `directory`, directories as (path, None), sorted by path."""
    prefix = f"{directory}/" if directory else ""
    if directory and not any(path.startswith(prefix) for path in commit.files):
        raise HubError(404, f"Entry not found: {directory}", "EntryNotFound")
    found: dict[str, FileEntry | None] = {}
    for path, entry in commit.files.items():
        if path.startswith(prefix):
            parts = path[len(prefix) :].split("/")
            depth = len(parts) if recursive else 1
            for i in range(1, min(depth, len(parts) - 1) + 1):
                found[prefix + "/".join(parts[:i])] = None
            if recursive or len(parts) == 1:
                found[path] = entry
    return sorted(found.items())


def entry_json(
    call: Call, repo: Repo, commit: Commit, path: str, entry: FileEntry | None, expand: bool
) -> dict[str, Any]:
    """A tree / paths-info item: `{"type", "oid", "size", "path"}`, `lfs` for LFS files."""
    if entry is None:
        out: dict[str, Any] = {
            "type": "directory",
            "oid": tree_oid(commit.files, path + "/"),
            "size": 0,
            "path": path,
        }
    else:
        out = {"type": "file", "oid": entry.oid, "size": entry.size, "path": path}
        if entry.lfs_sha256:
            out["lfs"] = {"oid": entry.lfs_sha256, "size": entry.size, "pointerSize": entry.pointer_size}
    if expand:
        last = call.store.last_commit(repo, commit, path, entry is None)
        out["lastCommit"] = {"id": last.oid, "title": last.title, "date": iso(last.date)}
        if entry is not None:
            out["securityFileStatus"] = {
                "status": "safe",
                "avScan": {"virusFound": False, "virusNames": None},
                "pickleImportScan": None,
            }
    return out


async def tree(call: Call) -> web.StreamResponse:
    """GET /api/{type}s/{repo}/tree/{rev}[/{path}]?recursive=&expand=: paginated with a Link header."""
    repo = call.readable_repo()
    commit = call.store.resolve(repo, call.params["rev"])
    expand = call.flag("expand")
    items = list_tree(commit, call.params.get("path", "").strip("/"), call.flag("recursive"))
    entries = [entry_json(call, repo, commit, path, entry, expand) for path, entry in items]
    return call.page(entries, 50 if expand else call.state.tree_page_size)


async def paths_info(call: Call) -> web.StreamResponse:
    """POST /api/{type}s/{repo}/paths-info/{rev} (form or JSON `paths`, `expand`): missing paths skipped."""
    repo = call.readable_repo()
    commit = call.store.resolve(repo, call.params["rev"])
    paths, expand = await _paths_payload(call)
    out = []
    for path in dict.fromkeys(p.strip("/") for p in paths):
        is_dir = any(p.startswith(path + "/") for p in commit.files)
        if path in commit.files or is_dir:
            out.append(entry_json(call, repo, commit, path, commit.files.get(path), expand))
    return json_response(out)


async def _paths_payload(call: Call) -> tuple[list[str], bool]:
    if call.request.content_type == "application/json":
        payload = await call.json()
        return list(payload.get("paths", [])), bool(payload.get("expand"))
    form = await call.request.post()
    expand = str(form.get("expand", "false")).lower() in ("1", "true")
    return [str(p) for p in form.getall("paths", [])], expand


async def refs(call: Call) -> web.StreamResponse:
    """GET /api/{type}s/{repo}/refs[?include_prs=1]: branches, converts, tags (and pullRequests)."""
    repo = call.readable_repo()

    def refs_of(kind: str, names: dict[str, str]) -> list[dict[str, str]]:
        return [
            {"name": n, "ref": f"refs/{kind}/{n}", "targetCommit": oid} for n, oid in sorted(names.items())
        ]

    out: dict[str, Any] = {
        "branches": refs_of("heads", repo.branches),
        "converts": [],
        "tags": refs_of("tags", repo.tags),
    }
    if call.flag("include_prs"):
        out["pullRequests"] = []
    return json_response(out)


async def commits(call: Call) -> web.StreamResponse:
    """GET /api/{type}s/{repo}/commits/{rev}: first-parent history, newest first, paginated."""
    repo = call.readable_repo()
    commit = call.store.resolve(repo, call.params["rev"])
    formatted = "formatted" in call.request.query.getall("expand[]", [])
    items = []
    for c in call.store.history(repo, commit):
        item: dict[str, Any] = {
            "id": c.oid,
            "title": c.title,
            "message": c.message,
            "authors": [{"user": c.author, "avatar": None}],
            "date": iso(c.date),
        }
        if formatted:
            item["formatted"] = {"title": html.escape(c.title), "message": html.escape(c.message)}
        items.append(item)
    return call.page(items, call.state.commits_page_size)


# -- refs ----------------------------------------------------------------------------------------


async def create_branch(call: Call) -> web.StreamResponse:
    """POST /api/{type}s/{repo}/branch/{branch} `{startingPoint?, emptyBranch?}`: 409 if it exists."""
    repo, payload = call.writable_repo(), await call.json()
    branch = call.params["branch"]
    if not branch or HEX40.fullmatch(branch) or branch.startswith("refs/") or " " in branch:
        raise HubError(400, f"Invalid branch name: {branch!r}")
    start = (
        None
        if payload.get("emptyBranch")
        else call.store.resolve(repo, payload.get("startingPoint") or "main")
    )
    call.store.create_branch(repo, branch, start)
    return json_response({})


async def delete_branch(call: Call) -> web.StreamResponse:
    """DELETE /api/{type}s/{repo}/branch/{branch}."""
    call.store.delete_branch(call.writable_repo(), call.params["branch"])
    return json_response({})


async def create_tag(call: Call) -> web.StreamResponse:
    """POST /api/{type}s/{repo}/tag/{rev} `{tag, message?}`: 404 for an unknown rev, 409 if the tag exists."""
    repo, payload = call.writable_repo(), await call.json()
    tag = str(payload.get("tag", ""))
    if not tag or " " in tag or tag.startswith("refs/"):
        raise HubError(400, f"Invalid tag name: {tag!r}")
    call.store.create_tag(repo, tag, call.store.resolve(repo, call.params["rev"]))
    return json_response({})


async def delete_tag(call: Call) -> web.StreamResponse:
    """DELETE /api/{type}s/{repo}/tag/{tag}."""
    call.store.delete_tag(call.writable_repo(), call.params["tag"])
    return json_response({})


# -- uploads -------------------------------------------------------------------------------------


def _branch(call: Call, repo: Repo) -> str:
    """The branch a write targets: 404 RevisionNotFound if missing, 400 for a tag or a commit id."""
    if call.flag("create_pr"):
        raise HubError(400, "create_pr is not supported by the Hub emulator")
    rev = call.params["rev"].removeprefix("refs/heads/")
    if rev not in repo.branches:
        call.store.resolve(repo, rev)  # raises RevisionNotFound for unknown revisions
        raise HubError(400, f"Invalid rev id: {rev} is not a branch, commits can only be made to branches")
    return rev


async def preupload(call: Call) -> web.StreamResponse:
    """POST /api/{type}s/{repo}/preupload/{rev}: `uploadMode` lfs/regular, `shouldIgnore`, current `oid`."""
    repo = call.writable_repo()
    commit = call.store.resolve(repo, _branch(call, repo))
    payload = await call.json()
    gitignore = payload.get("gitIgnore") or call.store.text_at(commit, ".gitignore") or ""
    files = []
    for item in payload.get("files", []):
        path, size = str(item["path"]), int(item["size"])
        sample = base64.b64decode(item.get("sample", ""))
        out: dict[str, Any] = {
            "path": path,
            "uploadMode": call.store.upload_mode(commit, path, size, sample),
            "shouldIgnore": ignored_by(gitignore, path),
        }
        if path in commit.files:
            out["oid"] = commit.files[path].remote_oid
        files.append(out)
    return json_response({"files": files, "commitOid": commit.oid})


async def commit(call: Call) -> web.StreamResponse:
    """POST /api/{type}s/{repo}/commit/{rev}: NDJSON header + file/lfsFile/deletedFile/deletedFolder lines."""
    repo = call.writable_repo()
    branch = _branch(call, repo)
    header, ops = parse_commit_payload(await call.request.read())
    summary = str(header.get("summary") or "").strip()
    if not summary:
        raise HubError(400, "Commit summary is required")
    assert call.token is not None  # writable_repo checked it
    new = call.store.commit(
        repo,
        branch,
        ops,
        summary,
        str(header.get("description") or ""),
        call.token.account.name,
        header.get("parentCommit"),
    )
    url = f"{call.state.web_url(repo)}/commit/{new.oid}"
    return json_response(
        {"success": True, "commitOid": new.oid, "commitUrl": url, "hookOutput": "", "pullRequestUrl": None}
    )


def parse_commit_payload(body: bytes) -> tuple[dict[str, Any], list[CommitOp]]:
    try:
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
    except ValueError as err:
        raise HubError(400, f"Invalid NDJSON payload: {err}") from err
    if not lines or lines[0].get("key") != "header":
        raise HubError(400, "The first line of a commit payload must be its header")
    return dict(lines[0].get("value") or {}), [_commit_op(line) for line in lines[1:]]


def _commit_op(line: dict[str, Any]) -> CommitOp:
    key, value = line.get("key"), line.get("value") or {}
    path = str(value.get("path", ""))
    if key == "file":
        raw = str(value.get("content", ""))
        content = base64.b64decode(raw) if value.get("encoding") == "base64" else raw.encode()
        if len(content) > REGULAR_FILE_LIMIT:
            raise HubError(400, f"Your push was rejected because {path} is larger than 10 MiB: use LFS")
        return AddFile(path, content)
    if key == "lfsFile":
        if value.get("algo", "sha256") != "sha256" or not SHA256.fullmatch(str(value.get("oid", ""))):
            raise HubError(400, f"Invalid LFS oid for {path}")
        size = value.get("size")
        return AddLfsFile(path, str(value["oid"]), int(size) if size is not None else None)
    if key == "deletedFile":
        return DeleteFile(path)
    if key == "deletedFolder":
        return DeleteFolder(path)
    raise HubError(400, f"Unknown commit operation: {key!r}")


# -- git-lfs batch API ---------------------------------------------------------------------------


async def lfs_batch(call: Call) -> web.StreamResponse:
    """POST /{prefix}{repo}.git/info/lfs/objects/batch: basic transfer, pre-signed PUT + verify actions."""
    repo = call.writable_repo()
    payload = await call.json()
    if payload.get("operation") != "upload":
        raise HubError(422, "The Hub emulator only implements the LFS 'upload' operation")
    objects = [_lfs_object(call, repo, obj) for obj in payload.get("objects", [])]
    body = {"transfer": "basic", "objects": objects, "hash_algo": "sha256"}
    return web.json_response(body, content_type="application/vnd.git-lfs+json")


def _lfs_object(call: Call, repo: Repo, obj: dict[str, Any]) -> dict[str, Any]:
    oid, size = str(obj.get("oid", "")), obj.get("size")
    if not SHA256.fullmatch(oid) or not isinstance(size, int) or size < 0:
        return {
            "oid": oid,
            "size": size if isinstance(size, int) else 0,
            "error": {"code": 422, "message": "Invalid object: expected a sha256 oid and a size"},
        }
    stored = call.store.lfs_objects.get(oid)
    if oid in repo.lfs_oids and stored is not None and len(stored) == size:
        return {"oid": oid, "size": size}  # already uploaded: no actions
    resource = f"PUT:{repo.repo_type}/{repo.repo_id}:{oid}:{size}"
    upload = (
        f"{call.state.cdn_endpoint}/lfs-upload/{repo.repo_type}/{repo.repo_id}/{oid}?size={size}&"
        + call.state.signed_query(resource)
    )
    verify = f"{call.state.web_url(repo)}.git/info/lfs/objects/verify"
    expires = iso(dt.datetime.now(dt.UTC) + dt.timedelta(hours=1))
    return {
        "oid": oid,
        "size": size,
        "authenticated": True,
        "actions": {"upload": {"href": upload, "expires_at": expires}, "verify": {"href": verify}},
    }


async def lfs_verify(call: Call) -> web.StreamResponse:
    """POST /{prefix}{repo}.git/info/lfs/objects/verify `{oid, size}`: 404 unless uploaded to this repo."""
    repo, payload = call.writable_repo(), await call.json()
    oid = str(payload.get("oid", ""))
    stored = call.store.lfs_objects.get(oid)
    if oid not in repo.lfs_oids or stored is None or len(stored) != payload.get("size"):
        raise HubError(404, f"LFS object {oid} was not uploaded")
    return json_response({"success": True})


# -- downloads -----------------------------------------------------------------------------------


async def resolve(call: Call) -> web.StreamResponse:
    """HEAD/GET /{prefix}{repo}/resolve/{rev}/{path}.

    Regular files: 200 with the bytes (Range honoured), `ETag` = git blob id, `X-Repo-Commit`.
    LFS files: 302 to a signed CDN url with `X-Linked-Etag` (sha256) and `X-Linked-Size`.
    Missing file: 404 EntryNotFound, still with `X-Repo-Commit` (the client caches the miss).
    """
    repo = call.readable_repo()
    commit = call.store.resolve(repo, call.params["rev"])
    path = call.params["path"]
    entry = commit.files.get(path)
    headers = {"X-Repo-Commit": commit.oid, "Accept-Ranges": "bytes", "Vary": "Origin, Accept"}
    if entry is None:
        raise HubError(404, "Entry not found", "EntryNotFound", headers)
    if entry.lfs_sha256:
        sha = entry.lfs_sha256
        location = f"{call.state.cdn_endpoint}/lfs/{sha}?" + call.state.signed_query(f"GET:{sha}")
        headers.update(
            {
                "Location": location,
                "ETag": f'"{entry.oid}"',
                "X-Linked-Etag": f'"{sha}"',
                "X-Linked-Size": str(entry.size),
            }
        )
        return web.Response(status=302, headers=headers)
    headers["ETag"] = f'"{entry.oid}"'
    return ranged(call.request, call.store.read(entry), headers)


def ranged(request: web.Request, data: bytes, headers: dict[str, str]) -> web.Response:
    """200 with `data`, or 206 for a single `Range: bytes=a-b|a-|-n`, or 416."""
    text = _is_text(data)
    headers["Content-Type"] = "text/plain; charset=utf-8" if text else "application/octet-stream"
    spec = request.headers.get("Range")
    if not spec:
        return web.Response(body=data, headers=headers)
    match = re.fullmatch(r"\s*bytes=(\d*)-(\d*)\s*", spec)
    if match is None or match.groups() == ("", ""):
        raise HubError(400, f"Unsupported Range header: {spec}")
    start, end = _byte_range(match.group(1), match.group(2), len(data))
    if start >= len(data) or start > end:
        raise HubError(
            416, "Requested Range Not Satisfiable", headers={"Content-Range": f"bytes */{len(data)}"}
        )
    headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
    return web.Response(status=206, body=data[start : end + 1], headers=headers)


def _byte_range(first: str, last: str, size: int) -> tuple[int, int]:
    if not first:
        return max(size - int(last), 0), size - 1
    return int(first), min(int(last), size - 1) if last else size - 1


def _is_text(data: bytes) -> bool:
    try:
        data[:4096].decode("utf-8")
    except UnicodeDecodeError:
        return False
    return b"\0" not in data[:4096]


# -- CDN -----------------------------------------------------------------------------------------


def _check_signature(call: Call, resource: str) -> None:
    query = call.request.query
    expires = int(query.get("expires") or 0)
    expected = call.state.sign(resource, expires)
    if expires < time.time() or not hmac.compare_digest(expected, query.get("signature", "")):
        raise HubError(403, "AccessDenied: Request has expired or its signature does not match")


async def cdn_download(call: Call) -> web.StreamResponse:
    """HEAD/GET /lfs/{sha256}?expires=&signature=: the LFS object, Range honoured (no auth needed)."""
    sha = call.params["sha"]
    _check_signature(call, f"GET:{sha}")
    data = call.store.lfs_objects.get(sha)
    if data is None:
        raise HubError(404, "NoSuchKey")
    return ranged(call.request, data, {"ETag": f'"{sha}"', "Accept-Ranges": "bytes"})


async def cdn_upload(call: Call) -> web.StreamResponse:
    """PUT /lfs-upload/{type}/{repo}/{sha256}?size=&expires=&signature=: a pre-signed basic LFS upload."""
    sha, size = call.params["sha"], int(call.request.query.get("size") or -1)
    repo_type, repo_id = call.params["kind"], call.params["repo"]
    _check_signature(call, f"PUT:{repo_type}/{repo_id}:{sha}:{size}")
    data = await call.request.read()
    if len(data) != size or hashlib.sha256(data).hexdigest() != sha:
        raise HubError(400, "BadDigest: the uploaded content does not match the announced sha256 and size")
    repo = call.store.get(repo_type, repo_id)
    if repo is None:
        raise HubError(404, "NoSuchBucket")
    call.store.add_lfs_object(repo, sha, data)
    return web.Response(headers={"ETag": f'"{hashlib.md5(data).hexdigest()}"'})


# -- apps ----------------------------------------------------------------------------------------

API = r"/api/(?P<type>models|datasets|spaces)/(?P<repo>[^/]+/[^/]+)"
GIT = r"/(?:(?P<prefix>datasets|spaces)/)?(?P<repo>[^/]+/[^/]+?)\.git/info/lfs/objects"

HUB_ROUTES = [
    route("GET", r"/api/whoami-v2", whoami),
    route("POST", r"/api/validate-yaml", validate_yaml),
    route("POST", r"/api/repos/create", create_repo),
    route("DELETE", r"/api/repos/delete", delete_repo),
    route("GET", API + r"(?:/revision/(?P<rev>[^/]+))?", repo_info),
    route("PUT", API + r"/settings", update_settings),
    route("GET", API + r"/tree/(?P<rev>[^/]+)(?:/(?P<path>.*))?", tree),
    route("POST", API + r"/paths-info/(?P<rev>[^/]+)", paths_info),
    route("GET", API + r"/refs", refs),
    route("GET", API + r"/commits/(?P<rev>[^/]+)", commits),
    route("POST", API + r"/branch/(?P<branch>[^/]+)", create_branch),
    route("DELETE", API + r"/branch/(?P<branch>[^/]+)", delete_branch),
    route("POST", API + r"/tag/(?P<rev>[^/]+)", create_tag),
    route("DELETE", API + r"/tag/(?P<tag>[^/]+)", delete_tag),
    route("POST", API + r"/preupload/(?P<rev>[^/]+)", preupload),
    route("POST", API + r"/commit/(?P<rev>[^/]+)", commit),
    route("POST", GIT + r"/batch", lfs_batch),
    route("POST", GIT + r"/verify", lfs_verify),
    route(
        "GET HEAD",
        r"/(?:(?P<prefix>datasets|spaces)/)?(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)",
        resolve,
    ),
]

CDN_ROUTES = [
    route("GET HEAD", r"/lfs/(?P<sha>[0-9a-f]{64})", cdn_download),
    route(
        "PUT",
        r"/lfs-upload/(?P<kind>model|dataset|space)/(?P<repo>[^/]+/[^/]+)/(?P<sha>[0-9a-f]{64})",
        cdn_upload,
    ),
]


def make_app(state: HubState, origin: Origin) -> web.Application:
    """The hub or the cdn application; every path goes through the raw-path dispatcher."""
    app = web.Application(middlewares=[make_middleware(state, origin)], client_max_size=1024**3)
    dispatch = make_dispatcher(state, HUB_ROUTES if origin == "hub" else CDN_ROUTES)
    app.router.add_route("*", "/{tail:.*}", dispatch)
    return app
