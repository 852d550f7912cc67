"""Prompt sources: source rows -> conversations, streamed in canonical order.

:func:`iter_conversations` reads the recipe's ``prompts`` source and yields one item per source row
taken: a :class:`Conversation`, or a :class:`~eagle3_raw.errors.PromptFormatError` for a malformed
row (its ``row_id`` and ``index`` set), so the run records it and goes on in order.

Sources (``prompts.source``):

- A path that exists (relative to the recipe's folder) is local: a ``.jsonl``, ``.json`` or
  ``.parquet`` file, or a folder whose files with those extensions are read in sorted name order
  (subfolders and other files are ignored). ``subset``, ``split`` and ``revision`` do not apply.
  A ``.json`` file holds an array of rows or an object ``{"data": [rows]}``; a ``.json`` file that
  is not one JSON document is read as JSON Lines. Blank JSONL lines are not rows.
- Anything else must look like a Hub dataset id ``org/name`` and is loaded with
  ``datasets.load_dataset(source, subset, split=split, revision=revision)`` (downloaded and cached
  as Arrow by ``datasets`` before the first row comes out). Otherwise: :class:`SourceError`.

Without ``shuffle_seed``, local files are streamed: the first row comes out after reading one line
(JSONL) or one record batch (Parquet); only ``.json`` files are parsed whole. With
``shuffle_seed``, the row positions are permuted by sorting them on ``blake2b(seed:position)``
(stable across Python, numpy and ``datasets`` versions, and the same for a local copy and the Hub
copy of a set). That costs a pass over the source first: JSONL files are indexed by line offsets
(8 bytes per row), Parquet files are loaded into memory, Hub sets are indexed through their Arrow
cache. ``limit`` then takes the first ``limit`` source rows, malformed ones included, so a recipe
always means the same rows.

Formats (``prompts.format``): ``openai`` (``messages`` of ``{role, content, reasoning_content?,
tool_calls?, tool_call_id?, name?}`` plus a row-level ``tools``), ``sharegpt`` (``conversations`` of
``{from, value}``, ``from`` matched case-insensitively against :data:`SHAREGPT_ROLES`, optional
row-level ``system`` and ``tools``; a turn written as ``{role, content, ...}``, as SpecForge's
prepared data has it, is read as an ``openai`` message), ``prompt`` (a ``prompt`` string as one
user message, optional ``system``), and ``auto``: per row, the first of ``messages``,
``conversations``, ``prompt`` present with a non-null value. Normalization:

Messages are kept as a chat client would send them to the deployed server (the chat path, not
this module, normalizes them for the template: :mod:`eagle3_raw.sglang.chatpath`):

- Roles are ``system``, ``user``, ``assistant``, ``tool``. Content is a string or a non-empty list
  of ``{"type": "text", "text": ...}`` parts, kept as a list (other part types are errors);
  ``null`` content is allowed only on an assistant message with ``tool_calls`` and becomes ``""``.
- Keys with ``null`` values are absent (Arrow-backed sources fill missing struct fields with null).
  Other message keys are dropped.
- ``tools`` (a list, or a JSON string of one) hold ``{"type": "function", "function": {"name": ...,
  ...}}``; the shorthand ``{"name": ..., "parameters": ...}`` is accepted and wrapped into that form,
  the one chat templates are written for. An empty list means no tools.
- ``tool_calls`` hold ``{"type"?: "function", "id"?, "function": {"name", "arguments"}}``;
  ``arguments`` is an object or a JSON string of one, and is always passed on as a dict: what
  SGLang's chat path parses string arguments into before rendering. Arrow-backed sources unify
  struct fields across rows, so they should store ``arguments`` as JSON strings. A call's ``id`` is
  kept (some templates print it); without one, the chat path renders ``None``.

Ids: the ``id_column`` value (a non-empty string or an integer), else the first 16 hex digits of the
sha256 of the canonical JSON of the normalized ``{"messages", "tools"}`` (the same conversation has
the same id in every format). A row whose id was already taken by an earlier conversation is a
:class:`PromptFormatError` (``duplicate id``). A row that has no id yet (malformed, no id column)
is reported as ``#<index>``.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import re
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from eagle3_raw.errors import PromptFormatError, SourceError
from eagle3_raw.printable import printable
from eagle3_raw.recipe import PROMPT_SUFFIXES, prompt_source_files
from eagle3_raw.rows import PassOver
from eagle3_raw.source.datafiles import card_problem

if TYPE_CHECKING:
    import datasets
    import pyarrow as pa

    from eagle3_raw.recipe import PromptsConfig, Recipe

DATA_SUFFIXES = PROMPT_SUFFIXES
"""File extensions a local source may have."""

ROLES = frozenset({"system", "user", "assistant", "tool"})

SHAREGPT_ROLES: Mapping[str, str] = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "model": "assistant",
    "tool": "tool",
    "function": "tool",
    "observation": "tool",
    "ipython": "tool",
}
"""ShareGPT ``from`` values and the role each becomes."""

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_BATCH_ROWS = 256
_UTF8_BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True)
class Conversation:
    """One source row, normalized.

    ``index`` is the row's position in the source after shuffle and limit: the canonical order of
    the set. ``messages`` are OpenAI-style dicts (``role``, ``content`` always a string, optional
    ``reasoning_content``, ``tool_calls``, ``tool_call_id``, ``name``); ``tools`` is None or a
    non-empty tuple of ``{"type": "function", "function": {...}}``.
    """

    index: int
    source_id: str
    messages: tuple[Mapping[str, Any], ...]
    tools: tuple[Mapping[str, Any], ...] | None
    category: str | None = None
    """The ``prompts.category_column`` value (as a string; None without one): groups acceptance
    summaries, never shapes a row."""


CATEGORY_CHARS = 80
"""The longest category kept (a summary's group label)."""


def source_categories(recipe: Recipe, *, hub_revision: str | None = None) -> dict[str, str]:
    """Source id -> ``prompts.category_column`` value of every conversation that has one (empty
    without the column): what acceptance summaries group rows by. Reads the whole source."""
    if recipe.prompts.category_column is None:
        return {}
    return {
        item.source_id: item.category
        for item in iter_conversations(recipe, hub_revision=hub_revision)
        if isinstance(item, Conversation) and item.category is not None
    }


def iter_conversations(
    recipe: Recipe, *, hub_revision: str | None = None, passed: PassOver | None = None
) -> Iterator[Conversation | PromptFormatError]:
    """The conversations of ``recipe.prompts`` in canonical order, lazily (see the module docs),
    leaving out the rows ``passed`` names (a resume's done rows: never parsed, their ids still
    count for the duplicate check).

    Raises :class:`SourceError` at call time when the source as a whole cannot be opened (missing
    path, unknown extension, unreadable file, Hub dataset not found) or has a problem every row
    would have (see :func:`check_source`), and from the iterator when a file turns unreadable
    mid-way. A malformed row is yielded as a :class:`PromptFormatError` whose ``row_id`` and
    ``index`` say which row it is.
    """
    table = open_source(recipe, hub_revision=hub_revision)
    check_source(table, recipe.prompts)
    return _conversations(_taken(table, recipe.prompts, passed), recipe.prompts, passed)


def check_source(table: _Table, prompts: PromptsConfig) -> None:
    """SourceError for what would fail every row, before any is read: a columnar file (Parquet, a
    Hub dataset) without the format's column or the ``id_column``, a row-oriented file (JSON Lines,
    JSON) whose first row has no ``id_column``, a source with no rows at all."""
    for part in table.files if isinstance(table, _Files) else [table]:
        columns = part.columns()
        if columns is not None:
            _check_columns(part.label, columns, prompts)
    rows = iter(table.stream())
    first = next(rows, None)
    del rows  # closes the file it was reading
    if first is None:
        raise SourceError(f"prompt source {prompts.source}: holds no rows")
    column = prompts.id_column
    if column is not None and isinstance(first.data, Mapping) and column not in first.data:
        keys = ", ".join(map(str, first.data)) or "none"
        raise SourceError(
            f"prompt source {prompts.source}: prompts.id_column {column!r} is not in the first row "
            f"({first.where}; its fields: {keys})"
        )


def _check_columns(label: str, columns: Sequence[str], prompts: PromptsConfig) -> None:
    wanted = _FORMAT_COLUMNS[prompts.format]
    shown = ", ".join(columns) or "none"
    if not any(c in columns for c in wanted):
        need = " or ".join(map(repr, wanted))
        raise SourceError(
            f"prompt source {label}: no {need} column for format {prompts.format!r} (columns: {shown})"
        )
    for name in ("id_column", "category_column"):
        column = getattr(prompts, name)
        if column is not None and column not in columns:
            raise SourceError(
                f"prompt source {label}: no column {column!r} (prompts.{name}); columns: {shown}"
            )


_FORMAT_COLUMNS: Mapping[str, tuple[str, ...]] = {
    "auto": ("messages", "conversations", "prompt"),
    "openai": ("messages",),
    "sharegpt": ("conversations",),
    "prompt": ("prompt",),
}


# --- rows -> conversations -------------------------------------------------------------------


class _Raw:
    """A source row as read: its data (or an _Unreadable) and where it came from. A JSON Lines row
    is parsed on first use, so a row passed over costs no parsing."""

    __slots__ = ("_data", "_line", "where")

    def __init__(self, data: Any, where: str, *, line: bytes | None = None) -> None:
        self._data, self._line, self.where = data, line, where

    @property
    def data(self) -> Any:
        if self._line is not None:
            self._data, self._line = _parse_line(self._line), None
        return self._data


@dataclass(frozen=True)
class _Unreadable:
    reason: str


class _Malformed(Exception):
    """A row problem: ``field`` is the path inside the row (``messages[2].role``), or "" for the row."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}" if field else problem)
        self.field = field
        self.problem = problem


def _conversations(
    rows: Iterable[_Raw | None], prompts: PromptsConfig, passed: PassOver | None
) -> Iterator[Conversation | PromptFormatError]:
    seen: dict[str, int] = {}
    for index, raw in enumerate(rows):
        if raw is None or (passed is not None and passed.skips(index)):
            continue
        item = _convert(index, raw, prompts)
        if isinstance(item, Conversation):
            item = _check_unique(item, seen, raw.where, passed)
        yield item


def _check_unique(
    conv: Conversation, seen: dict[str, int], where: str, passed: PassOver | None
) -> Conversation | PromptFormatError:
    first = seen.setdefault(conv.source_id, conv.index)
    if first == conv.index and passed is not None:
        earlier = passed.first_with_id(conv.source_id)  # a row passed over is never in `seen`
        first = earlier if earlier is not None and earlier < conv.index else first
    if first == conv.index:
        return conv
    message = f"row {conv.source_id!r}: duplicate id, first seen at row {first} ({where})"
    return PromptFormatError(message, row_id=conv.source_id, index=conv.index)


def _convert(index: int, raw: _Raw, prompts: PromptsConfig) -> Conversation | PromptFormatError:
    given: str | None = None
    try:
        row = _as_row(raw.data)
        if prompts.id_column is not None:
            given = _column_id(row, prompts.id_column)
        messages, tools = parse_row(row, prompts.format)
        source_id = given if given is not None else content_id(messages, tools)
    except _Malformed as exc:
        label, row_id = (f"#{index}", f"#{index}") if given is None else (repr(given), given)
        sep = " " if exc.field else ": "
        return PromptFormatError(f"row {label}{sep}{exc} ({raw.where})", row_id=row_id, index=index)
    category = _category(row, prompts.category_column)
    return Conversation(index, source_id, tuple(messages), tuple(tools) if tools else None, category)


def _category(row: Mapping[str, Any], column: str | None) -> str | None:
    """A row's category: its ``column`` value as a short string (null or missing: None)."""
    value = row.get(column) if column is not None else None
    return None if value is None else printable(str(value), limit=CATEGORY_CHARS)


def _as_row(data: Any) -> Mapping[str, Any]:
    if isinstance(data, _Unreadable):
        raise _Malformed("", data.reason)
    if not isinstance(data, Mapping):
        raise _Malformed("", f"expected an object, got {_kind(data)}")
    return data


def _column_id(row: Mapping[str, Any], column: str) -> str:
    value = row.get(column)
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, str) and value:
        return value
    raise _Malformed(column, f"expected a non-empty string or an integer id, got {_shown(value)}")


def content_id(messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None) -> str:
    """The content-hash id: sha256 of the canonical JSON of ``{"messages", "tools"}``, 16 hex digits."""
    try:
        payload = orjson.dumps({"messages": messages, "tools": tools}, option=orjson.OPT_SORT_KEYS)
    except TypeError as exc:
        raise _Malformed("", f"holds a value that is not JSON data ({exc})") from exc
    return hashlib.sha256(payload).hexdigest()[:16]


# --- formats ---------------------------------------------------------------------------------

_Parsed = tuple[list[dict[str, Any]], list[dict[str, Any]] | None]


def parse_row(row: Mapping[str, Any], fmt: str) -> _Parsed:
    """``(messages, tools)`` of one row in format ``fmt`` (``auto`` detects it from the row's keys)."""
    if fmt == "auto":
        fmt = _detect(row)
    if fmt == "openai":
        return _openai_messages(row), parse_tools(row.get("tools"))
    if fmt == "sharegpt":
        return _sharegpt_messages(row), parse_tools(row.get("tools"))
    return _prompt_messages(row), None


def _detect(row: Mapping[str, Any]) -> str:
    for key, fmt in (("messages", "openai"), ("conversations", "sharegpt"), ("prompt", "prompt")):
        if row.get(key) is not None:
            return fmt
    raise _Malformed("messages", "missing: expected a 'messages', 'conversations' or 'prompt' field")


def _turn_list(row: Mapping[str, Any], key: str) -> list[Any]:
    value = row.get(key)
    if value is None:
        raise _Malformed(key, "missing")
    if not isinstance(value, list):
        raise _Malformed(key, f"expected a list of messages, got {_kind(value)}")
    if not value:
        raise _Malformed(key, "empty conversation")
    return value


def _openai_messages(row: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [_openai_message(f"messages[{i}]", m) for i, m in enumerate(_turn_list(row, "messages"))]


def _openai_message(where: str, message: Any) -> dict[str, Any]:
    if not isinstance(message, Mapping):
        raise _Malformed(where, f"expected an object, got {_kind(message)}")
    role = message.get("role")
    if not isinstance(role, str):
        raise _Malformed(f"{where}.role", f"expected a role string, got {_shown(role)}")
    if role not in ROLES:
        raise _Malformed(f"{where}.role", f"unknown role {role!r}; allowed: {', '.join(sorted(ROLES))}")
    tool_calls = _tool_calls(where, role, message.get("tool_calls"))
    content = _content(f"{where}.content", message.get("content"), may_be_null=bool(tool_calls))
    result: dict[str, Any] = {"role": role, "content": content}
    for key in ("reasoning_content", "tool_call_id", "name"):
        if message.get(key) is not None:
            result[key] = _string(f"{where}.{key}", message[key])
    if tool_calls:
        result["tool_calls"] = tool_calls
    return result


def _content(where: str, value: Any, *, may_be_null: bool) -> str | list[dict[str, str]]:
    """A message's content as a chat client sends it: a string, or its list of text parts (the chat
    path decides how a template sees them: joined, or as a list)."""
    if isinstance(value, str):
        return value
    if value is None and may_be_null:
        return ""
    if isinstance(value, list) and value:
        return [_text_part(f"{where}[{i}]", part) for i, part in enumerate(value)]
    raise _Malformed(where, f"expected a string or a list of text parts, got {_shown(value)}")


def _text_part(where: str, part: Any) -> dict[str, str]:
    if not isinstance(part, Mapping) or part.get("type") != "text":
        shown = part.get("type") if isinstance(part, Mapping) else _kind(part)
        raise _Malformed(where, f"expected a {{'type': 'text', 'text': ...}} part, got {shown!r}")
    return {"type": "text", "text": _string(f"{where}.text", part.get("text"))}


def _string(where: str, value: Any) -> str:
    if not isinstance(value, str):
        raise _Malformed(where, f"expected a string, got {_shown(value)}")
    return value


def _sharegpt_messages(row: Mapping[str, Any]) -> list[dict[str, Any]]:
    turns = [_sharegpt_turn(f"conversations[{i}]", t) for i, t in enumerate(_turn_list(row, "conversations"))]
    return _with_system(row, turns)


def _sharegpt_turn(where: str, turn: Any) -> dict[str, Any]:
    if not isinstance(turn, Mapping):
        raise _Malformed(where, f"expected an object, got {_kind(turn)}")
    if "from" not in turn and "role" in turn:  # {role, content}: how SpecForge writes conversations
        return _openai_message(where, turn)
    speaker = turn.get("from")
    if not isinstance(speaker, str):
        raise _Malformed(f"{where}.from", f"expected a role string, got {_shown(speaker)}")
    if speaker.lower() not in SHAREGPT_ROLES:
        raise _Malformed(f"{where}.from", f"unknown role {speaker!r}; allowed: {', '.join(SHAREGPT_ROLES)}")
    return {"role": SHAREGPT_ROLES[speaker.lower()], "content": _string(f"{where}.value", turn.get("value"))}


def _prompt_messages(row: Mapping[str, Any]) -> list[dict[str, Any]]:
    prompt = row.get("prompt")
    if prompt is None:
        raise _Malformed("prompt", "missing")
    if not isinstance(prompt, str) or not prompt:
        raise _Malformed("prompt", f"expected a non-empty string, got {_shown(prompt)}")
    return _with_system(row, [{"role": "user", "content": prompt}])


def _with_system(row: Mapping[str, Any], messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` after the row-level ``system`` string, unless they start with a system message."""
    system = row.get("system")
    if system is None or system == "" or messages[0]["role"] == "system":
        return messages
    return [{"role": "system", "content": _string("system", system)}, *messages]


# --- tools and tool calls ------------------------------------------------------------------------


def parse_tools(value: Any) -> list[dict[str, Any]] | None:
    """Row-level tool definitions, normalized to ``{"type": "function", "function": {...}}``."""
    if isinstance(value, str):
        value = _json_value("tools", value)
    if value is None or value == []:
        return None
    if not isinstance(value, list):
        raise _Malformed("tools", f"expected a list of tool definitions, got {_kind(value)}")
    return [_tool(f"tools[{i}]", tool) for i, tool in enumerate(value)]


def _tool(where: str, tool: Any) -> dict[str, Any]:
    if not isinstance(tool, Mapping):
        raise _Malformed(where, f"expected an object, got {_kind(tool)}")
    if tool.get("type") not in (None, "function"):
        raise _Malformed(f"{where}.type", f"expected 'function', got {_shown(tool.get('type'))}")
    if tool.get("function") is None and "name" in tool:
        shorthand = {k: v for k, v in tool.items() if k not in ("type", "function")}
        return {"type": "function", "function": _function(where, shorthand)}
    return {"type": "function", "function": _function(f"{where}.function", tool.get("function"))}


def _function(where: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise _Malformed(where, f"expected {{'name': ..., 'parameters': ...}}, got {_shown(value)}")
    function = {k: v for k, v in value.items() if v is not None}
    if not isinstance(function.get("name"), str) or not function["name"]:
        raise _Malformed(f"{where}.name", f"expected a non-empty string, got {_shown(function.get('name'))}")
    if not isinstance(function.get("parameters", {}), Mapping):
        raise _Malformed(
            f"{where}.parameters", f"expected a JSON schema object, got {_kind(function['parameters'])}"
        )
    return function


def _tool_calls(where: str, role: str, value: Any) -> list[dict[str, Any]]:
    if value is None or value == []:
        return []
    if role != "assistant":
        raise _Malformed(f"{where}.tool_calls", f"only assistant messages have tool calls, not {role!r}")
    if not isinstance(value, list):
        raise _Malformed(f"{where}.tool_calls", f"expected a list, got {_kind(value)}")
    return [_tool_call(f"{where}.tool_calls[{i}]", call) for i, call in enumerate(value)]


def _tool_call(where: str, call: Any) -> dict[str, Any]:
    if not isinstance(call, Mapping) or not isinstance(call.get("function"), Mapping):
        raise _Malformed(where, "expected {'type': 'function', 'function': {'name': ..., 'arguments': ...}}")
    if call.get("type") not in (None, "function"):
        raise _Malformed(f"{where}.type", f"expected 'function', got {_shown(call.get('type'))}")
    function = call["function"]
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise _Malformed(f"{where}.function.name", f"expected a non-empty string, got {_shown(name)}")
    arguments = _arguments(f"{where}.function.arguments", function.get("arguments"))
    result: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": arguments}}
    if isinstance(call.get("id"), str):
        result["id"] = call["id"]
    return result


def _arguments(where: str, value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        value = _json_value(where, value)
    if not isinstance(value, dict):
        raise _Malformed(where, f"expected an object or a JSON string of one, got {_kind(value)}")
    return value


def _json_value(where: str, text: str) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise _Malformed(where, f"not valid JSON ({exc})") from exc


def _kind(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", type(None): "null", bool: "a boolean"}
    return names.get(type(value), type(value).__name__)


def _shown(value: Any) -> str:
    return "null" if value is None else f"{_kind(value)} {value!r}"[:120]


# --- taking rows: order, shuffle, limit ------------------------------------------------------


class _Table(Protocol):
    """A source as a sequence of rows: streamed in order, or counted and read by position."""

    label: str

    def stream(self) -> Iterator[_Raw]: ...

    def count(self) -> int: ...

    def at(self, position: int) -> _Raw: ...

    def columns(self) -> Sequence[str] | None:
        """The columns every row has (columnar sources), None when rows may differ."""


def count_source_rows(recipe: Recipe) -> int | None:
    """How many source rows a run goes through (after ``limit``), when that is cheap: local JSON
    Lines (lines counted, not parsed) and Parquet (metadata). None for JSON files, which would be
    parsed a second time, and Hub datasets."""
    path = recipe.resolve_path(recipe.prompts.source)
    if not path.exists():
        return None
    files = _data_files(path)
    if any(f.name.endswith(".json") for f in files):
        return None
    count = sum(
        _ParquetFile(f, f.name).count() if f.name.endswith(".parquet") else _count_lines(f) for f in files
    )
    limit = recipe.prompts.limit
    return count if limit is None else min(count, limit)


def _taken(table: _Table, prompts: PromptsConfig, passed: PassOver | None = None) -> Iterator[_Raw | None]:
    """The rows in canonical order; None for a shuffled row ``passed`` names (not read at all)."""
    if prompts.shuffle_seed is None:
        return itertools.islice(table.stream(), prompts.limit)
    order = shuffled_positions(table.count(), prompts.shuffle_seed)[: prompts.limit]
    skips = passed.skips if passed is not None else lambda _: False
    return (None if skips(k) else table.at(position) for k, position in enumerate(order))


def shuffled_positions(count: int, seed: int) -> list[int]:
    """A permutation of ``range(count)`` that depends only on ``seed`` (and ``count``)."""
    prefix = f"{seed}:".encode()

    def key(position: int) -> bytes:
        return hashlib.blake2b(prefix + str(position).encode(), digest_size=8).digest()

    return sorted(range(count), key=key)


# --- opening a source ------------------------------------------------------------------------


def open_source(recipe: Recipe, *, hub_revision: str | None = None) -> _Table:
    """The recipe's prompt source, opened (local path if it exists, else a Hub dataset id, at
    ``hub_revision`` when given: the commit the run resolved, else ``prompts.revision``)."""
    prompts = recipe.prompts
    path = recipe.resolve_path(prompts.source)
    if path.exists():
        return _Files([_open_file(f, f.name) for f in _data_files(path)])
    if is_hub_source(recipe):
        return _open_hub(prompts, hub_revision or prompts.revision)
    raise SourceError(
        f"prompt source {prompts.source!r}: no such file or folder ({path}), "
        "and not a Hub dataset id of the form org/name"
    )


def is_hub_source(recipe: Recipe) -> bool:
    """Whether ``prompts.source`` names a Hub dataset (it is not a local path and looks like org/name)."""
    source = recipe.prompts.source
    if recipe.resolve_path(source).exists():
        return False
    return bool(_HUB_ID.match(source)) and not source.endswith(DATA_SUFFIXES)


def resolve_hub_commit(prompts: PromptsConfig) -> str:
    """The commit ``prompts.revision`` (or the default branch) of the Hub dataset is at now;
    SourceError when the Hub cannot say."""
    from huggingface_hub import HfApi

    try:
        info = HfApi().dataset_info(prompts.source, revision=prompts.revision)
    except Exception as exc:  # offline, no such repo or revision, HTTP errors: all mean "cannot tell"
        at = f" at {prompts.revision!r}" if prompts.revision else ""
        raise SourceError(
            f"prompt source {prompts.source}{at}: cannot resolve its commit ({type(exc).__name__}: {exc})"
        ) from exc
    if not info.sha:
        raise SourceError(f"prompt source {prompts.source}: the Hub did not say which commit it is at")
    return str(info.sha)


def _data_files(path: Path) -> list[Path]:
    if path.is_file() and not path.name.endswith(DATA_SUFFIXES):
        raise SourceError(f"prompt source {path}: unknown file type; expected {', '.join(DATA_SUFFIXES)}")
    files = prompt_source_files(path)
    if not files:
        raise SourceError(f"prompt source {path}: folder holds no {', '.join(DATA_SUFFIXES)} files")
    return files


def _open_file(path: Path, name: str) -> _Table:
    if path.name.endswith(".parquet"):
        return _ParquetFile(path, name)
    if path.name.endswith(".json"):
        return _open_json(path, name)
    _check_readable(path)
    return _JsonlFile(path, name)


def _check_readable(path: Path) -> None:
    try:
        with path.open("rb"):
            pass
    except OSError as exc:
        raise SourceError(f"prompt source {path}: cannot read it ({exc})") from exc


class _Files:
    """Several files as one table, in the given order."""

    def __init__(self, files: Sequence[_Table]) -> None:
        self.files = files
        self.label = ", ".join(f.label for f in files)
        self._starts: list[int] | None = None

    def columns(self) -> Sequence[str] | None:
        return None  # each file has its own

    def stream(self) -> Iterator[_Raw]:
        return itertools.chain.from_iterable(f.stream() for f in self.files)

    def count(self) -> int:
        return self._offsets()[-1]

    def at(self, position: int) -> _Raw:
        starts = self._offsets()
        file = bisect_right(starts, position) - 1
        return self.files[file].at(position - starts[file])

    def _offsets(self) -> list[int]:
        if self._starts is None:
            self._starts = [0, *itertools.accumulate(f.count() for f in self.files)]
        return self._starts


class _JsonlFile:
    """A JSON Lines file: streamed line by line; indexed by line offsets for random access."""

    def __init__(self, path: Path, name: str) -> None:
        self.path, self.name, self.label = path, name, str(path)
        self._offsets: list[int] | None = None

    def columns(self) -> Sequence[str] | None:
        return None

    def stream(self) -> Iterator[_Raw]:
        with _reading(self.path), self.path.open("rb") as handle:
            for number, line in enumerate(handle, start=1):
                if line.strip():
                    yield _Raw(None, f"{self.name} line {number}", line=line)

    def count(self) -> int:
        return len(self._index())

    def at(self, position: int) -> _Raw:
        offset = self._index()[position]
        with _reading(self.path), self.path.open("rb") as handle:
            handle.seek(offset)
            return _Raw(_parse_line(handle.readline()), f"{self.name} row {position}")

    def _index(self) -> list[int]:
        if self._offsets is None:
            self._offsets = _line_offsets(self.path)
        return self._offsets


def _count_lines(path: Path) -> int:
    """The non-blank lines of ``path``, counted without keeping their offsets."""
    with _reading(path), path.open("rb") as handle:
        return sum(1 for line in handle if line.strip())


def _line_offsets(path: Path) -> list[int]:
    """Byte offsets of the non-blank lines of ``path``."""
    offsets, offset = [], 0
    with _reading(path), path.open("rb") as handle:
        for line in handle:
            if line.strip():
                offsets.append(offset)
            offset += len(line)
    return offsets


def _parse_line(line: bytes) -> Any:
    try:
        return orjson.loads(line.removeprefix(_UTF8_BOM))
    except orjson.JSONDecodeError as exc:
        return _Unreadable(f"not valid JSON ({exc})")


@contextlib.contextmanager
def _reading(path: Path) -> Iterator[None]:
    """Turns an OSError while reading a source file into a SourceError naming the file."""
    try:
        yield
    except OSError as exc:
        raise SourceError(f"prompt source {path}: cannot read it ({exc})") from exc


class _RowList:
    """Rows already in memory (a parsed ``.json`` file)."""

    def __init__(self, rows: list[Any], name: str, label: str) -> None:
        self.rows, self.name, self.label = rows, name, label

    def columns(self) -> Sequence[str] | None:
        return None

    def stream(self) -> Iterator[_Raw]:
        return (self.at(position) for position in range(len(self.rows)))

    def count(self) -> int:
        return len(self.rows)

    def at(self, position: int) -> _Raw:
        return _Raw(self.rows[position], f"{self.name} row {position}")


def _open_json(path: Path, name: str) -> _Table:
    with _reading(path):
        text = path.read_bytes()
    try:
        data = orjson.loads(text.removeprefix(_UTF8_BOM))
    except orjson.JSONDecodeError:
        return _JsonlFile(path, name)
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        data = data["data"]
    if not isinstance(data, list):
        raise SourceError(f'prompt source {path}: expected a JSON array of rows or {{"data": [rows]}}')
    return _RowList(data, name, str(path))


class _ParquetFile:
    """A Parquet file: streamed by record batches; loaded whole for random access."""

    def __init__(self, path: Path, name: str) -> None:
        self.path, self.name, self.label = path, name, str(path)
        self._table: pa.Table | None = None
        self._rows, self._columns = self._metadata()

    def _metadata(self) -> tuple[int, list[str]]:
        import pyarrow.parquet as pq

        with _arrow_errors(self.path):
            file = pq.ParquetFile(self.path)
            return int(file.metadata.num_rows), list(file.schema_arrow.names)

    def columns(self) -> Sequence[str] | None:
        return self._columns

    def stream(self) -> Iterator[_Raw]:
        import pyarrow.parquet as pq

        position = 0
        with _arrow_errors(self.path):
            for batch in pq.ParquetFile(self.path).iter_batches(batch_size=_BATCH_ROWS):
                for row in batch.to_pylist():
                    yield _Raw(row, f"{self.name} row {position}")
                    position += 1

    def count(self) -> int:
        return self._rows

    def at(self, position: int) -> _Raw:
        if self._table is None:
            import pyarrow.parquet as pq

            with _arrow_errors(self.path):
                self._table = pq.read_table(self.path)
        return _Raw(self._table.slice(position, 1).to_pylist()[0], f"{self.name} row {position}")


@contextlib.contextmanager
def _arrow_errors(path: Path) -> Iterator[None]:
    """Turns an OSError or Arrow error on a Parquet file into a SourceError naming the file."""
    import pyarrow as pa

    try:
        yield
    except (OSError, pa.ArrowException) as exc:
        raise SourceError(f"prompt source {path}: cannot read it as Parquet ({exc})") from exc


# --- Hub datasets ------------------------------------------------------------------------------


class _HubTable:
    """A split of a Hub dataset, as loaded (and cached as Arrow) by ``datasets``."""

    def __init__(self, dataset: datasets.Dataset, label: str) -> None:
        self.dataset, self.label = dataset, label

    def columns(self) -> Sequence[str] | None:
        return list(self.dataset.column_names)

    def stream(self) -> Iterator[_Raw]:
        for position, row in enumerate(self.dataset):
            yield _Raw(row, f"{self.label} row {position}")

    def count(self) -> int:
        return len(self.dataset)

    def at(self, position: int) -> _Raw:
        return _Raw(self.dataset[position], f"{self.label} row {position}")


def _check_card(repo_id: str, revision: str | None, label: str) -> None:
    """SourceError when the dataset's card makes ``datasets`` read files outside the repo (a URL,
    a local path): :mod:`eagle3_raw.source.datafiles`."""
    from huggingface_hub import HfApi, get_token
    from huggingface_hub.errors import OfflineModeIsEnabled, RepositoryNotFoundError, RevisionNotFoundError

    try:
        problem = card_problem(HfApi(token=get_token()), repo_id, revision)
    except (OfflineModeIsEnabled, RepositoryNotFoundError, RevisionNotFoundError):
        return  # offline, datasets reads only its cache (checked when fetched); load_dataset says the rest
    except Exception as exc:  # no answer, HTTP errors: the card cannot be checked
        cause = printable(" ".join(f"{type(exc).__name__}: {exc}".split()), limit=300)
        raise SourceError(f"prompt source {label}: cannot read its dataset card ({cause})") from exc
    if problem is not None:
        raise SourceError(f"prompt source {label}: {problem}")


def _open_hub(prompts: PromptsConfig, revision: str | None) -> _HubTable:
    import datasets

    label = f"{prompts.source}{f'/{prompts.subset}' if prompts.subset else ''}[{prompts.split}]"
    _check_card(prompts.source, revision, label)
    try:
        dataset = datasets.load_dataset(
            prompts.source, prompts.subset, split=prompts.split, revision=revision
        )
    except Exception as exc:  # any failure here means the source as a whole is unusable
        revision = f" at revision {revision!r}" if revision else ""
        message = (
            f"prompt source {label}{revision}: cannot load the Hub dataset ({type(exc).__name__}: {exc})"
        )
        raise SourceError(message) from exc
    if not isinstance(dataset, datasets.Dataset):
        raise SourceError(f"prompt source {label}: expected one split, got {type(dataset).__name__}")
    return _HubTable(dataset, label)
