"""Every bound eagle3_raw puts on what it reads, in one place, with the checks that apply them.

A recipe, a template, a tokenizer folder or a server's reply can come from a stranger (a published
set being reproduced, a misbehaving server). None of them may make eagle3_raw use unbounded memory
or CPU: each bound below is crossed with a clear error naming what crossed it.

- Recipe files: at most :data:`RECIPE_BYTES`; their YAML, expanded (anchors and aliases followed),
  at most :data:`YAML_NODES` values (a "billion laughs" file of 600 bytes expands to 10^9).
- Numeric settings: :data:`RECIPE_MAXIMA`; shards: at most :data:`MAX_SHARDS` (a journal file or
  marker that names more, or an index not below its count, is ignored by ``status`` and ``merge``).
- Local files a recipe names: a chat template file at most :data:`TEMPLATE_BYTES` and a regular
  file (not ``/dev/zero``); a tokenizer folder at most :data:`TOKENIZER_FILES` files and
  :data:`TOKENIZER_BYTES` bytes, found within :data:`WALK_ENTRIES` entries (``/usr/lib`` is
  refused before any of it is read); a prompt source a regular file or a folder.
- Rendered prompts: :data:`PROMPT_CHARS` characters (:mod:`eagle3_raw.run.template_limits`).
- A stranger's published set (:mod:`eagle3_raw.hub.strangers`): the files of one config downloaded
  at most :data:`DOWNLOAD_FILES` files and :data:`DOWNLOAD_BYTES` bytes (sizes asked before any
  is fetched); a published JSON file (manifest, ``draft_vocab.json``) at most :data:`RECIPE_BYTES`;
  a dataset card at most :data:`CARD_BYTES`, its YAML at most :data:`YAML_NODES` values; a
  vocabulary size at most :data:`VOCAB_IDS` ids.
- Server replies: a ``/generate`` body at most :func:`response_cap` bytes (from ``max_new_tokens``
  and the prompt, never above :data:`RESPONSE_BYTES`), a side endpoint's :data:`SIDE_BODY_BYTES`;
  an error body is read up to :data:`ERROR_BODY_BYTES` and cut there.
"""

from __future__ import annotations

import datetime
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3_raw.errors import RecipeError
from eagle3_raw.printable import printable

if TYPE_CHECKING:
    from eagle3_raw.recipe import Recipe

RECIPE_BYTES = 1 << 20
YAML_NODES = 100_000
TEMPLATE_BYTES = 1 << 20
TOKENIZER_FILES = 512
TOKENIZER_BYTES = 2 << 30
WALK_ENTRIES = 20_000
PROMPT_CHARS = 16 << 20
RESPONSE_BYTES = 256 << 20
SIDE_BODY_BYTES = 16 << 20
ERROR_BODY_BYTES = 64 << 10
MAX_SHARDS = 1 << 16
"""The most shards a set is split into (``--shard i/N``); a journal file naming more is not read."""
DOWNLOAD_FILES = 4096
DOWNLOAD_BYTES = 4 << 30
CARD_BYTES = 4 << 20
VOCAB_IDS = 1 << 22
"""The largest vocabulary taken from a published file (4,194,304 ids; the largest models have about
260,000): a ``t2d`` array has one entry per id."""

REFERENCE_STARTUP_TIMEOUT = 300.0
"""Seconds a launched reference server may take to answer ``/health`` (``server.startup_timeout``;
the tests' launcher too): generous, since a loaded machine can take long just to start Python."""

#: Largest accepted value of each numeric recipe setting.
RECIPE_MAXIMA: Mapping[str, int] = {
    "server.max_in_flight": 4096,
    "server.max_retries": 100,
    "server.request_timeout": 7 * 24 * 3600,
    "server.connect_timeout": 3600,
    "server.wait_for_server": 7 * 24 * 3600,
    "server.startup_timeout": 7 * 24 * 3600,
    "sampling.max_new_tokens": 1 << 24,
    "sampling.samples_per_prompt": 1024,  # and below 4095: the journal packs a sample into 12 bits
}

_BYTES_PER_OUTPUT_ID = 256
"""Generous: the id in ``output_ids``, its text in ``text`` (JSON-escaped), per-token meta."""
_BYTES_PER_PROMPT_ID = 16
_BASE_BYTES = 1 << 20


def response_cap(max_new_tokens: object, prompt_len: int) -> int:
    """The largest ``/generate`` body accepted for a request with these ids (bytes)."""
    new = max_new_tokens if isinstance(max_new_tokens, int) and max_new_tokens > 0 else 128
    return min(RESPONSE_BYTES, _BASE_BYTES + new * _BYTES_PER_OUTPUT_ID + prompt_len * _BYTES_PER_PROMPT_ID)


# --- recipes ------------------------------------------------------------------------------------


def check_recipe_file(path: Path) -> None:
    """RecipeError unless ``path`` is a regular file of at most :data:`RECIPE_BYTES`."""
    check_regular_file("recipe", path, RECIPE_BYTES)


def check_yaml_size(data: Any, what: str, budget: int = YAML_NODES) -> None:
    """RecipeError when ``data``, with every alias expanded, has more than ``budget`` values.

    PyYAML shares the object behind an alias, so loading a "billion laughs" file is cheap; walking
    it (fingerprinting, validating, dumping) is not. This walk stops at the budget, also for data
    that contains itself.
    """
    stack, seen = [data], 0
    while stack:
        value = stack.pop()
        seen += 1
        if seen > budget:
            raise RecipeError(
                what, "<not shown>",
                f"expands to more than {budget:,} values (YAML anchors and aliases included); a recipe "
                "is a few dozen",
            )  # fmt: skip
        if isinstance(value, Mapping):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list | tuple):
            stack.extend(value)


INT64_MAX = 2**63 - 1


def check_plain_values(data: Any, where: str = "") -> None:
    """RecipeError naming the field for a value that is not plain data: text, a number (an integer
    within 64 bits), a date, true/false, null, a list, or a mapping with text keys. YAML can also
    give bytes (``!!binary``), sets and integer keys, which nothing downstream (the fingerprint, a
    request, the journal) can hold. Run after :func:`check_yaml_size` (the walk is bounded by it)."""
    stack: list[tuple[str, Any]] = [(where, data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, Mapping):
            for key, item in value.items():
                if not isinstance(key, str):
                    _not_plain(path or "recipe", printable(repr(key), limit=40),
                               f"text keys, not {type(key).__name__}: quote the key")  # fmt: skip
                stack.append((f"{path}.{key}" if path else key, item))
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", item) for i, item in enumerate(value))
        elif isinstance(value, bool) or value is None or isinstance(value, str | float | datetime.date):
            continue  # a date: YAML reads 2026-12-01 as one (model.render_date takes it)
        elif isinstance(value, int):
            if abs(value) > INT64_MAX:
                _not_plain(path, value, "an integer within 64 bits")
        else:
            _not_plain(path, type(value).__name__, f"plain data, not a {type(value).__name__}")


def _not_plain(path: str, value: Any, problem: str) -> None:
    huge = isinstance(value, int) and value.bit_length() > 100  # str() of one may itself fail
    shown = f"<an integer of {value.bit_length():,} bits>" if huge else value
    raise RecipeError(path or "recipe", shown, f"expected {problem}")


def check_numbers(recipe: Recipe) -> None:
    """RecipeError for a numeric setting above its :data:`RECIPE_MAXIMA` entry."""
    values = {
        **{f"server.{k}": getattr(recipe.server, k) for k in (
            "max_in_flight", "max_retries", "request_timeout", "connect_timeout", "wait_for_server",
            "startup_timeout")},
        "sampling.max_new_tokens": recipe.sampling.params.get("max_new_tokens"),
        "sampling.samples_per_prompt": recipe.sampling.samples_per_prompt,
    }  # fmt: skip
    for dotted, value in values.items():
        maximum = RECIPE_MAXIMA[dotted]
        if isinstance(value, int | float) and value > maximum:
            raise RecipeError(dotted, value, f"expected at most {maximum:,}")


def check_regular_file(field: str, path: Path, limit: int) -> None:
    """RecipeError unless ``path`` is a regular file of at most ``limit`` bytes."""
    try:
        info = path.stat()
    except OSError as exc:
        raise RecipeError(field, str(path), f"cannot read it ({exc.strerror or exc})") from exc
    if not stat.S_ISREG(info.st_mode):
        raise RecipeError(field, str(path), "expected a regular file (not a device, a pipe or a folder)")
    if info.st_size > limit:
        raise RecipeError(field, str(path), f"is {info.st_size:,} bytes; at most {limit:,} are read")
