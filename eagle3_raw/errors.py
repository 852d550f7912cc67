"""The exception hierarchy of eagle3_raw.

Its three branches are what a run does with an error:

- :class:`RetryableError`: transient; the request is tried again (with backoff, on any healthy
  endpoint) until the retry budget is spent.
- :class:`RowError`: this one row is recorded (as skipped or failed, with the reason) and the run
  goes on. Nothing already generated is lost.
- :class:`FatalError`: the run stops. Raised before any data is generated wherever possible
  (bad recipe, unreachable server, tokenizer mismatch); during a run, the journal is flushed first.

Ctrl-C and SIGTERM raise :class:`Interrupted`, a :class:`KeyboardInterrupt` (outside the tree).
"""

from __future__ import annotations


class Eagle3RawError(Exception):
    """Base class of every error eagle3_raw raises on purpose."""


# --- retry -----------------------------------------------------------------------------------


class RetryableError(Eagle3RawError):
    """A transient failure of one request: try it again."""

    def __init__(self, message: str, *, url: str = "") -> None:
        super().__init__(message)
        self.url = url


class ConnectError(RetryableError):
    """The endpoint could not be reached, or dropped the connection mid-response."""


class RequestTimeout(RetryableError):
    """No complete response within the request timeout."""


class ServerBusy(RetryableError):
    """The server could not take the request now: HTTP 5xx, 429, or a 400 "Duplicate request ID"
    (a previous attempt with that rid still running; the retry has a new rid)."""

    def __init__(self, message: str, *, url: str = "", status: int = 503) -> None:
        super().__init__(message, url=url)
        self.status = status


class GenerationAborted(RetryableError):
    """HTTP 200 whose ``finish_reason`` is ``abort``: the output is partial and never a row."""


class InvalidResponse(RetryableError):
    """A response that fails a check (shape, ``completion_tokens``, vocabulary, echoed prompt)."""


# --- record and skip -------------------------------------------------------------------------


class RowError(Eagle3RawError):
    """One prompt row cannot become a row of the set. The run records it and goes on."""

    kind = "failed"

    def __init__(self, message: str, *, row_id: str = "", index: int = -1) -> None:
        super().__init__(message)
        self.row_id = row_id
        self.index = index

    @property
    def reason(self) -> str:
        """The message, as written to the summary and the failures file."""
        return str(self)


class PromptFormatError(RowError):
    """A malformed source row: missing messages, unknown role, non-string content, bad tools."""

    kind = "skipped"


class PromptTooLong(RowError):
    """The rendered prompt does not fit the server's input limit; it is never sent."""

    kind = "skipped"


class RequestRejected(RowError):
    """The server refused the request for good (HTTP 400 or another non-retryable 4xx), or answered
    for a prompt other than the one sent (``prompt_tokens`` differs: the server truncated it)."""

    def __init__(self, message: str, *, row_id: str = "", status: int = 400, url: str = "") -> None:
        super().__init__(message, row_id=row_id)
        self.status = status
        self.url = url


class RetriesExhausted(RowError):
    """Every attempt failed with a retryable error; the last one is the cause."""


# --- stop ------------------------------------------------------------------------------------


class FatalError(Eagle3RawError):
    """The run cannot go on."""


class RecipeError(FatalError):
    """A recipe field has a bad value. The message names the field, the value and what is allowed."""

    def __init__(self, field: str, value: object, allowed: str) -> None:
        super().__init__(f"recipe field {field!r}: got {value!r}; {allowed}")
        self.field = field
        self.value = value
        self.allowed = allowed


class RecipeFileError(RecipeError):
    """The recipe file itself cannot be used: missing, not UTF-8, not YAML, not a mapping."""

    def __init__(self, path: str, problem: str) -> None:
        FatalError.__init__(self, f"recipe file {path}: {problem}")
        self.field = "recipe"
        self.value = path
        self.allowed = problem


class SourceError(FatalError):
    """The prompt source as a whole cannot be read (missing file, unknown format, no such dataset)."""


class ServerUnreachable(FatalError):
    """No endpoint answered (or none within the wait deadline). The message names the URL(s)."""


class ServerMismatch(FatalError):
    """The server does not match the recipe or the journal (tokenizer, model, version)."""


class AuthError(FatalError):
    """The server refused our credentials (HTTP 401/403)."""


class EndpointNotFound(ServerMismatch):
    """The server answered, but has no such route (HTTP 404, or 405 for this method): not the
    server the run needs, though a reachable one."""

    def __init__(self, message: str, *, url: str, status: int) -> None:
        super().__init__(message)
        self.url = url
        self.status = status


class Redirected(ServerMismatch):
    """The server answered with a redirect (3xx). eagle3_raw never follows one: the requests,
    and the API key with them, would go to a server that was never checked."""


class JournalError(FatalError):
    """The journal cannot be written or read. What it already holds stays readable."""


class JournalFull(JournalError):
    """The journal's disk has had no space for longer than the run waits (``--disk-wait``); what the
    run held in memory is kept in the spill folder the message names."""


class LocalFileError(FatalError):
    """A file or folder of this machine cannot be read or written (an ``OSError`` no earlier check
    turned into a more precise error); the message names it and says why."""


class MissingExtra(FatalError):
    """What was asked needs an optional dependency that is not installed; the message names the
    extra that brings it (``pip install 'eagle3_raw[plot]'``)."""


class HubError(FatalError):
    """A push to or a read from the Hub failed (credentials, permissions, missing repo)."""


class Interrupted(KeyboardInterrupt):
    """The run was stopped (Ctrl-C, SIGTERM); the journal holds everything finished.

    A :class:`KeyboardInterrupt`, not an :class:`Exception`: ``except Exception`` around a build in
    a caller's program does not swallow the user's Ctrl-C."""


class ExportError(FatalError):
    """An export that cannot be made as asked (a bad option, a size, an id outside the vocabulary)."""
