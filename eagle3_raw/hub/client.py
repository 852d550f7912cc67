"""Talking to the Hub: credentials, the client, repo names, and the Hub's errors as HubError.

The token goes only into the client (``Authorization`` headers); no message here contains it.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from http import HTTPStatus
from typing import TYPE_CHECKING

from eagle3_raw.errors import HubError
from eagle3_raw.recipe import is_hub_id

if TYPE_CHECKING:
    from huggingface_hub import HfApi

NO_CREDENTIALS = "no Hugging Face credentials: set HF_TOKEN or run `hf auth login`"
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")


def resolve_token(token: str | None = None) -> str:
    """``token``, else ``HF_TOKEN``, else the ``huggingface_hub`` login; HubError when there is none."""
    from huggingface_hub import get_token

    value = token or get_token()
    if not value:
        raise HubError(NO_CREDENTIALS)
    return value


def hub_api(token: str | None) -> HfApi:
    """A Hub client authenticated with ``token`` (anonymous when None)."""
    from huggingface_hub import HfApi

    return HfApi(token=token, library_name="eagle3_raw")


def check_repo_id(repo_id: str, *, bare_name: bool = False) -> None:
    """HubError unless ``repo_id`` looks like ``org/name`` (or a bare ``name`` with ``bare_name``:
    the Hub puts it in the token's own namespace)."""
    form = "org/name or name" if bare_name else "org/name"
    if "/" not in repo_id and bare_name and is_hub_id(repo_id):
        return
    if not _REPO_ID.fullmatch(repo_id) or not is_hub_id(repo_id):
        raise HubError(f"repo {repo_id!r}: expected {form} (letters, digits, '.', '_', '-'; no '--' or '..')")


def full_repo_id(api: HfApi, repo_id: str) -> str:
    """``repo_id``, with the token's user name in front of a bare ``name`` (where the Hub creates it)."""
    if "/" in repo_id:
        return repo_id
    with hub_errors(repo_id, "find the user of the token for"):
        user = api.whoami()["name"]
    return f"{user}/{repo_id}"


def check_ref_name(option: str, name: str | None, *, branch: bool = False) -> None:
    """HubError unless ``name`` can be a branch or tag on the Hub: git's ref-name rules (``git
    check-ref-format``) plus the Hub's own (no ``refs/`` prefix; a branch is not a commit id).
    Checked before anything is built or uploaded."""
    if name is None:
        return
    problem = _ref_problem(name) or (_branch_problem(name) if branch else None)
    if problem is not None:
        kind = "branch" if branch else "tag"
        raise HubError(f"{option} {name!r}: not a valid {kind} name: {problem}")


def _ref_problem(name: str) -> str | None:
    bad = sorted({c for c in name if c in _REF_FORBIDDEN or ord(c) < 0x20 or ord(c) == 0x7F})
    parts = name.split("/")
    checks = (
        (not name, "it is empty"),
        (bool(bad), f"it contains {', '.join(map(repr, bad))}"),
        (".." in name or "@{" in name, "it contains '..' or '@{'"),
        (name == "@" or name.startswith("-"), "it is '@' or starts with '-'"),
        ("" in parts, "it starts or ends with '/', or contains '//'"),
        (
            any(p.startswith(".") or p.endswith(".lock") for p in parts),
            "a part starts with '.' or ends with '.lock'",
        ),
        (name.endswith("."), "it ends with '.'"),
        (name.startswith("refs/"), "the Hub refuses names starting with 'refs/'"),
    )
    return next((problem for failed, problem in checks if failed), None)


def _branch_problem(name: str) -> str | None:
    return "it looks like a commit id (40 hex digits)" if _COMMIT.fullmatch(name) else None


_REF_FORBIDDEN = frozenset(" ~^:?*[\\")
_COMMIT = re.compile(r"[0-9a-f]{40}")


def parse_repo_ref(ref: str) -> tuple[str, str | None]:
    """``org/name[@revision]`` as ``(repo_id, revision or None)``."""
    repo_id, _, revision = ref.partition("@")
    check_repo_id(repo_id)
    return repo_id, revision or None


@contextlib.contextmanager
def hub_errors(repo_id: str, action: str) -> Iterator[None]:
    """Turn the Hub client's errors into a HubError that names ``repo_id`` and what failed."""
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    try:
        yield
    except OfflineModeIsEnabled as exc:
        raise HubError(f"cannot {action} {repo_id}: HF_HUB_OFFLINE is set") from exc
    except HfHubHTTPError as exc:
        raise HubError(_http_message(exc, repo_id, action)) from exc
    except _no_answer() as exc:  # no answer at all: DNS, refused, timed out
        problem = f"{type(exc).__name__}: {_one_line(str(exc))}" if str(exc) else type(exc).__name__
        raise HubError(f"cannot {action} {repo_id}: the Hub did not answer ({problem})") from exc


def _no_answer() -> tuple[type[Exception], ...]:
    """OSError and the HTTP client's connection-level errors (``huggingface_hub`` uses httpx, or
    its httpx2 fork)."""
    import importlib

    found: list[type[Exception]] = [OSError]
    for name in ("httpx", "httpx2"):
        with contextlib.suppress(ImportError):
            found.append(importlib.import_module(name).TransportError)
    return tuple(found)


def _http_message(exc: Exception, repo_id: str, action: str) -> str:
    from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

    code = status(exc)
    if isinstance(exc, RevisionNotFoundError):
        return f"cannot {action} {repo_id}: no such revision"
    if isinstance(exc, RepositoryNotFoundError):
        return (
            f"cannot {action} {repo_id}: no such dataset repo, or it is private and the credentials "
            "cannot read it"
        )
    if code == HTTPStatus.UNAUTHORIZED:
        return (
            f"cannot {action} {repo_id}: the Hub refused the credentials (HTTP 401); the token is "
            "invalid or expired: set HF_TOKEN or run `hf auth login`"
        )
    if code == HTTPStatus.FORBIDDEN:
        return (
            f"cannot {action} {repo_id}: the token has no write access to it (HTTP 403); use a token "
            f"with write permission on the {repo_id.split('/')[0]!r} namespace"
        )
    said = getattr(exc, "server_message", None) or ""
    detail = f"HTTP {code}: {_one_line(said)}" if code is not None and said else _first_line(exc)
    return f"cannot {action} {repo_id}: {detail}"


def _one_line(text: str) -> str:
    return " ".join(text.split())[:300]


def status(exc: BaseException | None) -> int | None:
    """The HTTP status of the response behind ``exc`` or the exceptions it was raised during."""
    while exc is not None:
        response = getattr(exc, "response", None)
        if response is not None:
            return int(response.status_code)
        exc = exc.__context__
    return None


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
