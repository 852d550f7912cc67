"""Talking to the Hub: credentials, the client, repo names, and the Hub's errors as HubError.

The token goes only into the client (``Authorization`` headers); no message here contains it.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING

from eagle3_raw.errors import HubError

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


def check_repo_id(repo_id: str) -> None:
    """HubError unless ``repo_id`` looks like ``org/name``."""
    if not _REPO_ID.fullmatch(repo_id):
        raise HubError(f"repo {repo_id!r}: expected org/name (letters, digits, '.', '_', '-')")


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
    except OSError as exc:
        raise HubError(f"cannot {action} {repo_id}: {exc}") from exc


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
    if code == 401:
        return (
            f"cannot {action} {repo_id}: the Hub refused the credentials (HTTP 401); the token is "
            "invalid or expired: set HF_TOKEN or run `hf auth login`"
        )
    if code == 403:
        return (
            f"cannot {action} {repo_id}: the token has no write access to it (HTTP 403); use a token "
            f"with write permission on the {repo_id.split('/')[0]!r} namespace"
        )
    return f"cannot {action} {repo_id}: {_first_line(exc)}"


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
