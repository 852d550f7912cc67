"""In-memory, git-like storage behind the Hub emulator.

Object ids are real git ids: a regular file's ``oid`` is the git blob sha1 of its content, an LFS
file's ``oid`` is the blob sha1 of its LFS pointer, directories and commits hash like git trees and
commits. That is what ``huggingface_hub`` compares against (``git_hash`` for regular files, sha256
for LFS files), so "unchanged file" detection behaves as it does against huggingface.co.

Everything here is synchronous and guarded by one lock: handlers run on the server's event loop
thread while tests inspect the store from the main thread.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import hashlib
import re
import threading
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Literal

UploadMode = Literal["lfs", "regular"]

# Files above this size are always LFS (the Hub refuses larger regular files).
LFS_SIZE_THRESHOLD = 10 * 1024 * 1024
HEX40 = re.compile(r"[0-9a-f]{40}")
SHA256 = re.compile(r"[0-9a-f]{64}")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}")

# The start of the .gitattributes the Hub puts in every new repo's initial commit.
DEFAULT_GITATTRIBUTES = "".join(
    f"{pattern} filter=lfs diff=lfs merge=lfs -text\n"
    for pattern in (
        "*.7z",
        "*.arrow",
        "*.bin",
        "*.bz2",
        "*.ckpt",
        "*.ftz",
        "*.gz",
        "*.h5",
        "*.joblib",
        "*.lfs.*",
        "*.lz4",
        "*.mds",
        "*.mlmodel",
        "*.model",
        "*.msgpack",
        "*.npy",
        "*.npz",
        "*.onnx",
        "*.ot",
        "*.parquet",
        "*.pb",
        "*.pickle",
        "*.pkl",
        "*.pt",
        "*.pth",
        "*.rar",
        "*.safetensors",
        "saved_model/**/*",
        "*.tar.*",
        "*.tar",
        "*.tflite",
        "*.tgz",
        "*.wasm",
        "*.xz",
        "*.zip",
        "*.zst",
        "*tfevents*",
        "*.wav",
        "*.mp3",
        "*.jpg",
        "*.jpeg",
        "*.png",
        "*.webp",
        "*.mp4",
    )
)


class HubError(Exception):
    """An error the emulator answers with, shaped like the Hub's (status, message, X-Error-Code).

    `body` adds fields to the JSON body next to `error` (the 409 of repo creation carries `url`).
    """

    def __init__(
        self,
        status: int,
        message: str,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
        body: Mapping[str, object] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.headers = dict(headers or {})
        self.body = dict(body or {})


def revision_not_found(rev: str) -> HubError:
    return HubError(404, f"Invalid rev id: {rev}", "RevisionNotFound")


def git_object_id(kind: str, body: bytes) -> str:
    return hashlib.sha1(f"{kind} {len(body)}\0".encode() + body).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


@dataclass(frozen=True)
class FileEntry:
    """One file of a snapshot: git blob id, content size, and the sha256 when stored in LFS."""

    oid: str
    size: int
    lfs_sha256: str | None = None

    @property
    def pointer_size(self) -> int:
        return len(lfs_pointer(self.lfs_sha256 or "", self.size))

    @property
    def remote_oid(self) -> str:
        """The id `preupload` reports: sha256 for LFS files, the git blob id otherwise."""
        return self.lfs_sha256 or self.oid


@dataclass(frozen=True)
class Commit:
    oid: str
    parents: tuple[str, ...]
    files: Mapping[str, FileEntry]
    title: str
    message: str
    author: str
    date: dt.datetime
    tree_oid: str


@dataclass
class Repo:
    repo_type: str
    repo_id: str
    private: bool
    created_at: dt.datetime
    uid: str = field(default_factory=lambda: uuid.uuid4().hex[:24])
    commits: dict[str, Commit] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    lfs_oids: set[str] = field(default_factory=set)

    @property
    def namespace(self) -> str:
        return self.repo_id.split("/")[0]


@dataclass(frozen=True)
class AddFile:
    path: str
    content: bytes


@dataclass(frozen=True)
class AddLfsFile:
    path: str
    sha256: str
    size: int | None  # None for copies: the size is taken from the stored object


@dataclass(frozen=True)
class DeleteFile:
    path: str


@dataclass(frozen=True)
class DeleteFolder:
    path: str


CommitOp = AddFile | AddLfsFile | DeleteFile | DeleteFolder


def tree_oid(files: Mapping[str, FileEntry], prefix: str = "") -> str:
    """The git tree id of the directory `prefix` ("" for the root, else ending in "/")."""
    children: dict[str, tuple[str, str]] = {}
    subdirs: set[str] = set()
    for path, entry in files.items():
        if path.startswith(prefix):
            name, sep, _ = path[len(prefix) :].partition("/")
            if sep:
                subdirs.add(name)
            else:
                children[name] = ("100644", entry.oid)
    for name in subdirs:
        children[name] = ("40000", tree_oid(files, f"{prefix}{name}/"))
    ordered = sorted(children.items(), key=lambda kv: kv[0] + ("/" if kv[1][0] == "40000" else ""))
    body = b"".join(f"{mode} {name}".encode() + b"\0" + bytes.fromhex(oid) for name, (mode, oid) in ordered)
    return git_object_id("tree", body)


def check_path(path: str) -> str:
    """Reject paths the Hub refuses: absolute, empty segments, `.`/`..`, `.git/`."""
    parts = path.split("/")
    if not path or path.startswith("/") or any(p in ("", ".", "..") for p in parts) or parts[0] == ".git":
        raise HubError(400, f"Invalid path in repository: {path!r}")
    return path


def _pattern_matches(pattern: str, path: str) -> bool:
    """gitattributes/gitignore-style match (close enough for the patterns repos use)."""
    pattern = pattern.rstrip("/")
    if "/" not in pattern:
        return any(fnmatch.fnmatchcase(part, pattern) for part in path.split("/"))
    return fnmatch.fnmatchcase(path, pattern.lstrip("/")) or path.startswith(pattern.lstrip("/") + "/")


def lfs_by_attributes(gitattributes: str, path: str) -> bool:
    """Whether the last .gitattributes line matching `path` sets `filter=lfs`."""
    result = False
    for line in gitattributes.splitlines():
        fields = line.split()
        if fields and not fields[0].startswith("#") and _pattern_matches(fields[0], path):
            result = "filter=lfs" in fields[1:]
    return result


def ignored_by(gitignore: str, path: str) -> bool:
    result = False
    for line in gitignore.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            negate = line.startswith("!")
            if _pattern_matches(line.lstrip("!"), path):
                result = not negate
    return result


def looks_binary(sample: bytes) -> bool:
    if b"\0" in sample:
        return True
    try:
        sample.decode("utf-8")
    except UnicodeDecodeError as err:  # a multi-byte character cut at the end of the sample is fine
        return err.start < len(sample) - 3
    return False


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class HubStore:
    """Repos, their commits and refs, regular blobs and LFS objects."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.repos: dict[tuple[str, str], Repo] = {}
        self.blobs: dict[str, bytes] = {}
        self.lfs_objects: dict[str, bytes] = {}

    # -- repos -------------------------------------------------------------------------------

    def get(self, repo_type: str, repo_id: str) -> Repo | None:
        with self.lock:
            return self.repos.get((repo_type, repo_id.lower()))

    def create_repo(self, repo_type: str, repo_id: str, private: bool) -> Repo:
        """New repo with the Hub's initial commit (a default .gitattributes, author "system")."""
        with self.lock:
            repo = Repo(repo_type, repo_id, private, _utcnow())
            self.repos[(repo_type, repo_id.lower())] = repo
            self._commit(
                repo,
                None,
                [AddFile(".gitattributes", DEFAULT_GITATTRIBUTES.encode())],
                "initial commit",
                "",
                "system",
            )
            return repo

    def delete_repo(self, repo: Repo) -> None:
        with self.lock:
            self.repos.pop((repo.repo_type, repo.repo_id.lower()), None)

    # -- revisions ---------------------------------------------------------------------------

    def resolve(self, repo: Repo, rev: str) -> Commit:
        """Branch, tag, `refs/heads/x`, `refs/tags/x`, full commit id or a unique prefix (>= 7)."""
        with self.lock:
            oid = self._resolve_oid(repo, rev)
            if oid is None:
                raise revision_not_found(rev)
            return repo.commits[oid]

    def _resolve_oid(self, repo: Repo, rev: str) -> str | None:
        name = rev.removeprefix("refs/heads/")
        if name in repo.branches:
            return repo.branches[name]
        tag = rev.removeprefix("refs/tags/")
        if tag in repo.tags:
            return repo.tags[tag]
        if re.fullmatch(r"[0-9a-f]{7,40}", rev):
            matches = [oid for oid in repo.commits if oid.startswith(rev)]
            if len(matches) == 1:
                return matches[0]
        return None

    def history(self, repo: Repo, commit: Commit) -> Iterator[Commit]:
        """First-parent history, newest first."""
        current: Commit | None = commit
        while current is not None:
            yield current
            current = repo.commits[current.parents[0]] if current.parents else None

    def last_commit(self, repo: Repo, commit: Commit, path: str, is_dir: bool) -> Commit:
        """The newest commit in `commit`'s history that changed `path`."""

        def state(c: Commit) -> str | None:
            if is_dir:
                inside = any(p.startswith(path + "/") for p in c.files)
                return tree_oid(c.files, path + "/") if inside else None
            entry = c.files.get(path)
            return entry.oid if entry else None

        newest = commit
        for older in self.history(repo, commit):
            if state(older) != state(newest):
                return newest
            newest = older
        return newest

    # -- refs --------------------------------------------------------------------------------

    def create_branch(self, repo: Repo, branch: str, start: Commit | None) -> None:
        with self.lock:
            if branch in repo.branches:
                raise HubError(409, f"Reference already exists: refs/heads/{branch}")
            if start is None:  # emptyBranch: a root commit with no files
                start = self._new_commit(repo, (), {}, "Empty branch", "", "system")
            repo.branches[branch] = start.oid

    def delete_branch(self, repo: Repo, branch: str) -> None:
        with self.lock:
            if branch == "main":
                raise HubError(403, "Cannot delete the default branch")
            if repo.branches.pop(branch, None) is None:
                raise revision_not_found(branch)

    def create_tag(self, repo: Repo, tag: str, commit: Commit) -> None:
        with self.lock:
            if tag in repo.tags:
                raise HubError(409, f"Tag already exists: refs/tags/{tag}")
            repo.tags[tag] = commit.oid

    def delete_tag(self, repo: Repo, tag: str) -> None:
        with self.lock:
            if repo.tags.pop(tag, None) is None:
                raise revision_not_found(tag)

    # -- content -----------------------------------------------------------------------------

    def read(self, entry: FileEntry) -> bytes:
        with self.lock:
            return self.lfs_objects[entry.lfs_sha256] if entry.lfs_sha256 else self.blobs[entry.oid]

    def text_at(self, commit: Commit, path: str) -> str | None:
        entry = commit.files.get(path)
        return self.read(entry).decode("utf-8", "replace") if entry else None

    def add_lfs_object(self, repo: Repo, sha256: str, data: bytes) -> None:
        with self.lock:
            self.lfs_objects[sha256] = data
            repo.lfs_oids.add(sha256)

    def upload_mode(self, commit: Commit, path: str, size: int, sample: bytes) -> UploadMode:
        """What `preupload` answers: LFS by .gitattributes, by size, or for binary content."""
        attributes = self.text_at(commit, ".gitattributes") or ""
        if lfs_by_attributes(attributes, path) or size > LFS_SIZE_THRESHOLD or looks_binary(sample):
            return "lfs"
        return "regular"

    # -- commits -----------------------------------------------------------------------------

    def commit(
        self,
        repo: Repo,
        branch: str,
        ops: list[CommitOp],
        title: str,
        message: str,
        author: str,
        parent: str | None = None,
    ) -> Commit:
        """Apply `ops` on top of `branch`; `parent` (a commit id or prefix) must be its head."""
        with self.lock:
            if branch not in repo.branches:
                raise revision_not_found(branch)
            head = repo.branches[branch]
            if parent is not None and not head.startswith(parent):
                raise HubError(412, "A commit has happened since. Please refresh and try again.")
            return self._commit(repo, branch, ops, title, message, author)

    def _commit(
        self, repo: Repo, branch: str | None, ops: list[CommitOp], title: str, message: str, author: str
    ) -> Commit:
        head = repo.commits[repo.branches[branch]] if branch else None
        files = dict(head.files) if head else {}
        for op in ops:
            self._apply(repo, files, op)
        commit = self._new_commit(repo, (head.oid,) if head else (), files, title, message, author)
        repo.branches[branch or "main"] = commit.oid
        return commit

    def _apply(self, repo: Repo, files: dict[str, FileEntry], op: CommitOp) -> None:
        path = check_path(op.path.rstrip("/") if isinstance(op, DeleteFolder) else op.path)
        if isinstance(op, AddFile):
            oid = git_object_id("blob", op.content)
            self.blobs[oid] = op.content
            files[path] = FileEntry(oid, len(op.content))
        elif isinstance(op, AddLfsFile):
            files[path] = self._lfs_entry(repo, op)
        elif isinstance(op, DeleteFile):
            if files.pop(path, None) is None:
                raise HubError(
                    404, f"Cannot delete {path}: A file with this name doesn't exist", "EntryNotFound"
                )
        else:
            doomed = [p for p in files if p.startswith(path + "/")]
            if not doomed:
                raise HubError(
                    404, f"Cannot delete {path}: A folder with this name doesn't exist", "EntryNotFound"
                )
            for p in doomed:
                del files[p]

    def _lfs_entry(self, repo: Repo, op: AddLfsFile) -> FileEntry:
        data = self.lfs_objects.get(op.sha256) if op.sha256 in repo.lfs_oids else None
        if data is None or (op.size is not None and op.size != len(data)):
            raise HubError(
                400,
                f"Your push was rejected because an LFS pointer pointed to a file that does not exist"
                f" ({op.path}: sha256 {op.sha256})",
            )
        return FileEntry(git_object_id("blob", lfs_pointer(op.sha256, len(data))), len(data), op.sha256)

    def _new_commit(
        self,
        repo: Repo,
        parents: tuple[str, ...],
        files: dict[str, FileEntry],
        title: str,
        message: str,
        author: str,
    ) -> Commit:
        date = _utcnow()
        tree = tree_oid(files)
        stamp = f"{author} <{author}@users.noreply.huggingface.co> {int(date.timestamp())} +0000"
        body = f"tree {tree}\n" + "".join(f"parent {p}\n" for p in parents)
        body += f"author {stamp}\ncommitter {stamp}\n\n{title}\n\n{message}\n{uuid.uuid4().hex}"
        commit = Commit(
            git_object_id("commit", body.encode()), parents, files, title, message, author, date, tree
        )
        repo.commits[commit.oid] = commit
        return commit

    # -- inspection --------------------------------------------------------------------------

    def all_contents(self) -> dict[str, bytes]:
        """Every stored content, keyed `blob:<git oid>` or `lfs:<sha256>`."""
        with self.lock:
            out = {f"blob:{oid}": data for oid, data in self.blobs.items()}
            out.update({f"lfs:{sha}": data for sha, data in self.lfs_objects.items()})
            return out
