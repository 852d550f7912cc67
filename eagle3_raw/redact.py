"""Keeping secrets out of what eagle3_raw writes: journals, manifests, recipes, cards, logs.

Names that look like secrets (``api_key``, ``--api-key``, ``HF_TOKEN``) are dropped from mappings;
their values are redacted in command lines and free text (``--api-key X``, ``--api-key=X``,
``--api-key -X``, ``api_key = X``, ``"api_key": "X"`` in a JSON-valued argument), as are URL
credentials, bearer tokens and keys recognizable by their form (``hf_...``, ``sk-...``,
``AKIA...``, ``ghp_...``, ``xoxb-...``).
"""

from __future__ import annotations

import re
import shlex
import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

REDACTED = "<redacted>"
_SECRET_WORDS = frozenset(
    {"key", "apikey", "token", "secret", "password", "passwd", "pwd", "credential", "credentials",
     "auth", "authorization", "cookie"}
)  # fmt: skip


def is_secret_name(name: str) -> bool:
    """True for names like ``api_key``, ``--admin-api-key``, ``HF_TOKEN``, ``ssl_keyfile_password``.

    Whole words only: ``tokenizer_path`` and ``max_total_num_tokens`` are not secrets.
    """
    words = re.split(r"[^a-z0-9]+", re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower())
    return any(word in _SECRET_WORDS for word in words)


def scrub(value: Any) -> Any:
    """``value`` without secrets: mapping keys named like secrets dropped; in strings and argument
    lists, values of secret flags (``--api-key X``, ``--api-key=X``), secret assignments
    (``HF_TOKEN=X``), URL credentials, bearer tokens and ``hf_...`` tokens redacted."""
    if isinstance(value, Mapping):
        return {k: scrub(v) for k, v in value.items() if not is_secret_name(str(k))}
    if isinstance(value, list | tuple):
        if all(isinstance(v, str) for v in value):
            return scrub_args(value)
        return [scrub(v) for v in value]
    return scrub_text(value) if isinstance(value, str) else value


def scrub_args(args: Sequence[str]) -> list[str]:
    """A command line as a list, with the value of every secret flag redacted."""
    result: list[str] = []
    for i, arg in enumerate(args):
        previous = args[i - 1] if i else ""
        # a secret flag's value is the next word, even one starting with "-"; a "--" word is a flag
        if previous.startswith("-") and "=" not in previous and is_secret_name(previous) and arg[:2] != "--":
            result.append(REDACTED)
        else:
            result.append(scrub_text(arg))
    return result


_QUOTED = r""""[^"]*"|'[^']*'"""
_VALUE = rf"""(?P<value>{_QUOTED}|(?!--)[^\s"']+)"""  # a "--" word is the next flag, not a value
_FLAG = re.compile(rf"(?P<name>--?[A-Za-z][\w-]*)(?P<sep>=|\s+){_VALUE}")
_ASSIGNMENT = re.compile(rf"\b(?P<name>[A-Za-z_][\w.-]*)(?P<sep>\s*=\s*){_VALUE}")
_JSON_PAIR = re.compile(rf"""(?P<name>{_QUOTED})(?P<sep>\s*:\s*)(?P<value>{_QUOTED}|[^\s,}}\]]+)""")
_TEXT_SECRETS = (
    (re.compile(r"(?P<scheme>[A-Za-z][\w+.-]*://)[^/\s@]+@"), rf"\g<scheme>{REDACTED}@"),
    (re.compile(r"(?i)\b(?P<scheme>bearer)\s+[\w.~+/=-]+"), rf"\g<scheme> {REDACTED}"),
    (re.compile(r"\bhf_[A-Za-z0-9]{16,}"), REDACTED),
    (re.compile(r"\bsk-[A-Za-z0-9_-]{16,}"), REDACTED),  # OpenAI, Anthropic and alike
    (re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), REDACTED),  # AWS access key ids
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{30,}"), REDACTED),  # GitHub
    (re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"), REDACTED),  # Slack
)


def scrub_text(text: str) -> str:
    """``text`` (e.g. a launch command) with secret flag values and credentials redacted."""
    for pattern in (_FLAG, _ASSIGNMENT, _JSON_PAIR):
        text = pattern.sub(_redact_match, text)
    for pattern, replacement in _TEXT_SECRETS:
        text = pattern.sub(replacement, text)
    return text


def _redact_match(match: re.Match[str]) -> str:
    if not is_secret_name(match["name"].strip("\"'")):
        return match[0]
    quote = match["value"][0] if match["value"][0] in "\"'" else ""
    return f"{match['name']}{match['sep']}{quote}{REDACTED}{quote}"


def public_url(url: str) -> str:
    """``url`` without user info, query and fragment (where credentials hide)."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    netloc += f":{parts.port}" if parts.port else ""
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


_PYTHON = re.compile(r"python[0-9.]*")
_PACKAGE_FILES = ("__main__", "__init__")
_PACKAGES = re.compile(r".*/(?:site|dist)-packages/(?P<module>[^ ]+)\.py")


def public_command(command: str) -> str:
    """``command`` (a server's launch command line) without the launching machine's install paths,
    secrets redacted (:func:`scrub_text`): an interpreter named by its path is ``python``; a script
    of a package (``/venv/.../eagle3_raw/reference/__main__.py``, what ``python -m`` puts in
    ``sys.argv[0]``) is ``python -m <module>``; another program named by its path is its file name,
    and so is every absolute path among the arguments (``--model-path /home/a/models/Qwen3-8B`` is
    ``--model-path Qwen3-8B``).
    """
    try:
        words = shlex.split(command)
    except ValueError:  # not a shell command line: nothing to take apart
        return scrub_text(command)
    if not words:
        return scrub_text(command)
    head: list[str] = []
    if _PYTHON.fullmatch(PurePosixPath(words[0]).name):
        head, words = ["python"], words[1:]
    if words and "/" in words[0] and words[0].endswith(".py"):
        module = _module_of(words[0])
        head = ["python", *(["-m", module] if module else [PurePosixPath(words[0]).name])]
        words = words[1:]
    elif not head and "/" in words[0]:
        head, words = [PurePosixPath(words[0]).name], words[1:]
    return scrub_text(shlex.join([*head, *map(_file_name, words)]))


def _file_name(word: str) -> str:
    """An absolute path argument (``/home/a/ledger.jsonl``, ``--ledger=/home/a/l.jsonl``) as its
    file name: the folders are the launching machine's."""
    flag, equals, value = word.partition("=") if word.startswith("-") else ("", "", word)
    if not value.startswith("/") or PurePosixPath(value).name == "":
        return word
    return f"{flag}{equals}{PurePosixPath(value).name}"


def _module_of(script: str) -> str | None:
    """The dotted module a script path is (its package folders up to the first without an
    ``__init__.py``, or what follows ``site-packages/``), None when it is none."""
    path = Path(script)
    packages: list[str] = []
    folder = path.parent
    while (folder / "__init__.py").is_file():
        packages.insert(0, folder.name)
        folder = folder.parent
    if packages:
        return ".".join([*packages, *([] if path.stem in _PACKAGE_FILES else [path.stem])])
    found = _PACKAGES.fullmatch(script)
    if found is None:
        return None
    dotted = found["module"].split("/")
    return ".".join(dotted[:-1] if dotted[-1] in _PACKAGE_FILES else dotted) or None
