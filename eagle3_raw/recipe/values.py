"""The rules of the recipe fields that a kind alone does not cover (a field's ``convert`` or
``check`` in :mod:`eagle3_raw.recipe.schema`): names, dates, URLs, which server a recipe launches,
the launch sections (SGLang's, vLLM's) and sampling parameters, the mixture, the rollout parsers,
the export sizes.

Each rule gets the value as the recipe gives it (MISSING when absent) and the :class:`At` of its
field (its path, the fields of its section read before it), and returns the field's value or raises
a :class:`RecipeError` naming the field, the value and what is allowed.
"""

from __future__ import annotations

import contextlib
import datetime
import re
import urllib.parse
from collections.abc import Mapping
from typing import Any

from eagle3_raw.errors import RecipeError
from eagle3_raw.recipe.fields import MISSING, did_you_mean, is_int, is_number
from eagle3_raw.recipe.parsing import At, read_section
from eagle3_raw.recipe.sampling import check_min_new_tokens, checked_params
from eagle3_raw.sglang.launch import check_sglang_launch
from eagle3_raw.vllm.launch import check_vllm_launch

MAX_MIXTURE = 64
"""The most components a sampling mixture may have."""

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")


def _given(value: Any) -> Any:
    """``value``, or None when the recipe does not give it."""
    return None if value is MISSING else value


def check_name(name: str, at: At) -> None:
    """A recipe name is letters, digits, ``_``, ``.`` and ``-`` (it names files and Hub sets)."""
    if not _NAME_RE.fullmatch(name):
        raise RecipeError(at.path, name, "expected letters, digits, '_', '.', '-' (max 96)")


def render_date(value: Any, at: At) -> str | None:
    """``model.render_date`` as ``YYYY-MM-DD`` (YAML reads an unquoted one as a date)."""
    value = _given(value)
    if value is None:
        return None
    if isinstance(value, datetime.date):
        return value.isoformat()
    if isinstance(value, str) and re.fullmatch(r"\d{4}-\d{2}-\d{2}", value):
        with contextlib.suppress(ValueError):
            return datetime.date.fromisoformat(value).isoformat()
    raise RecipeError(at.path, value, "expected a real date YYYY-MM-DD, e.g. 2026-12-01")


def endpoints(value: Any, at: At) -> tuple[str, ...]:
    """``server.endpoints``: one URL or a list of distinct ones (a trailing ``/`` dropped)."""
    value = _given(value)
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(v, str) for v in items):
        raise RecipeError(at.path, value, "expected a URL or a list of URLs")
    for url in items:
        check_url(at.path, url)
    urls = tuple(url.rstrip("/") for url in items)
    if len(set(urls)) != len(urls):
        raise RecipeError(at.path, list(items), "expected each URL once (in-flight limits are per URL)")
    return urls


def check_url(field: str, url: str) -> None:
    """RecipeError unless ``url`` is an http(s) URL with a host and, if given, a port 1-65535 (what
    aiohttp would otherwise refuse with a ValueError at the first request)."""
    if not re.match(r"^https?://[^/\s]+", url):
        raise RecipeError(field, url, "expected an http:// or https:// URL")
    try:
        parts = urllib.parse.urlsplit(url)
        port, host = parts.port, parts.hostname
    except ValueError as exc:  # a port out of range or not a number, a broken [IPv6] host
        raise RecipeError(field, url, f"not a usable URL ({exc}); e.g. http://127.0.0.1:30000, "
                          "http://[::1]:30000") from exc  # fmt: skip
    if not host:
        raise RecipeError(field, url, "expected a host name or address after http://")
    if port == 0:
        raise RecipeError(field, url, "expected a port from 1 to 65535")


def check_one_server(launch: str | None, at: At) -> None:
    """A recipe names its servers (``server.endpoints``) or launches one, never both nor neither."""
    given = at.parsed["endpoints"]
    if not given and launch is None:
        raise RecipeError(
            f"{at.prefix}endpoints", [],
            "give at least one URL, or set server.launch: reference (or sglang, vllm)",
        )  # fmt: skip
    if given and launch is not None:
        raise RecipeError(
            at.path, launch,
            "cannot be combined with server.endpoints (the requests would be split between your "
            "servers and the launched one): keep one of them",
        )  # fmt: skip


_ENGINES = {"sglang": "SGLang", "vllm": "vLLM"}
"""The engines ``server.launch`` starts, each with a section of its own (``server.<launch>``)."""


def launch_args(value: Any, at: At) -> tuple[str, ...]:
    """``server.launch_args``: serve-reference flags, refused with ``launch: sglang`` or ``vllm``."""
    args = at.as_kind(value)
    launch = at.parsed["launch"]
    if args and launch in _ENGINES:
        raise RecipeError(
            at.path, args, f"serve-reference flags; {_ENGINES[launch]}'s go in server.{launch}.extra_args"
        )
    return tuple(str(a) for a in args)


def sglang_section(value: Any, at: At) -> Any:
    """``server.sglang``, required by ``launch: sglang`` and refused without it."""
    launch_config = _engine_section(value, at, "sglang", "model_path")
    if launch_config is not None:
        check_sglang_launch(launch_config)
    return launch_config


def vllm_section(value: Any, at: At) -> Any:
    """``server.vllm``, required by ``launch: vllm`` and refused without it."""
    launch_config = _engine_section(value, at, "vllm", "model")
    if launch_config is not None:
        check_vllm_launch(launch_config)
    return launch_config


def _engine_section(value: Any, at: At, engine: str, model_field: str) -> Any:
    """The section of ``engine`` as its class (None when absent, as it must be unless
    ``server.launch`` is ``engine``)."""
    value = _given(value)
    launch = at.parsed["launch"]
    if value is None:
        if launch == engine:
            raise RecipeError(
                at.path, None, f"required with server.launch: {engine}: at least {{{model_field}: ...}}"
            )
        return None
    if launch != engine:
        raise RecipeError(
            at.path, "...", f"only read with server.launch: {engine}; set it, or remove the section"
        )
    return at.build(read_section(value, at, required=True), f"{at.path}.")


def reference_startup_timeout(value: Any, at: At) -> float:
    """``server.startup_timeout``: the reference server's; SGLang's and vLLM's are in their sections."""
    launch = at.parsed["launch"]
    if value is not MISSING and launch in _ENGINES:
        why = f"applies to launch: reference; {_ENGINES[launch]}'s is server.{launch}.startup_timeout"
        raise RecipeError(at.path, value, why)
    seconds: float = at.as_kind(value)
    return seconds


def environment(value: Any, at: At) -> dict[str, str]:
    """``server.sglang.env``, ``server.vllm.env``: variable names to string values."""
    variables = at.as_kind(value)
    for name, text in variables.items():
        if (
            not isinstance(name, str)
            or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name)
            or not isinstance(text, str)
        ):
            raise RecipeError(f"{at.path}.{name}", text, 'expected NAME: "string value"')
    return dict(variables)


def draft_vocab_sizes(value: Any, at: At) -> tuple[int, ...]:
    """``export.draft_vocab_sizes``: distinct sizes >= 1, sorted."""
    sizes = at.as_kind(value)
    if not all(is_int(size) and size >= 1 for size in sizes) or len(set(sizes)) != len(sizes):
        raise RecipeError(at.path, sizes, "expected distinct integers >= 1, e.g. [32000]")
    return tuple(sorted(sizes))


def validation_share(value: Any, at: At) -> float | int | None:
    """``splits.validation``: a fraction strictly between 0 and 1 (a float), or a count of
    conversations >= 1 (an integer); None when not given."""
    value = _given(value)
    if value is None:
        return None
    if is_int(value):
        if value < 1:
            raise RecipeError(at.path, value, "a count holds out at least 1 conversation; or remove splits")
        return int(value)
    if isinstance(value, float) and is_number(value):
        if not 0 < value < 1:
            why = "a count of conversations is an integer, e.g. 200" if value >= 1 else "e.g. 0.05"
            raise RecipeError(at.path, value, f"a fraction must be between 0 and 1, exclusive ({why})")
        return value
    raise RecipeError(at.path, value, f"expected {at.spec.allowed}")


def rollout_section(value: Any, at: At) -> Any:
    """``rollout``, read only with ``turns: rollout`` (a missing or empty one: the defaults)."""
    section = read_section(value, at, required=False)
    if section and at.parsed["turns"] != "rollout":
        raise RecipeError(at.path, dict(section), "applies to turns: rollout only (set turns: rollout)")
    return at.build(section, f"{at.path}.")


def parser_name(value: Any, at: At) -> str | None:
    """One of SGLang 0.5.23's or vLLM 0.32's parser names (the field's choices:
    ``--reasoning-parser`` / ``--tool-call-parser``), or None; which engine's is checked once the
    engine is known (:func:`~eagle3_raw.recipe.engines.check_for_engine`)."""
    name: str | None = at.as_kind(value)
    known = at.spec.choices
    if name is not None and name not in known:
        raise RecipeError(at.path, name, f"not an SGLang or vLLM parser{did_you_mean(name, known)}; "
                          f"known: {', '.join(known)}")  # fmt: skip
    return name


def sampling_params(params: Mapping[str, Any], at: At) -> dict[str, Any]:
    """``sampling``'s SGLang keys (every key but the section's own): checked, nulls dropped, and
    ``max_new_tokens`` required."""
    checked = checked_params(at.prefix, params, at.own)
    if checked.get("max_new_tokens") is None:
        raise RecipeError(
            f"{at.prefix}max_new_tokens", checked.get("max_new_tokens"),
            "required: an integer >= 1 (SGLang's default of 128 silently truncates)",
        )  # fmt: skip
    check_min_new_tokens(at.prefix, checked)
    return checked


def mixture(value: Any, at: At) -> tuple[Any, ...]:
    """``sampling.mixture``: 1 to MAX_MIXTURE components, each over the recipe's parameters."""
    value = _given(value)
    if value is None:
        return ()
    if not isinstance(value, list) or not value or len(value) > MAX_MIXTURE:
        raise RecipeError(
            at.path, value,
            f"expected a list of 1 to {MAX_MIXTURE} components, e.g. [{{weight: 3, temperature: 0.7}}, "
            "{weight: 1, temperature: 0, chat_template_kwargs: {enable_thinking: false}}]",
        )  # fmt: skip
    return tuple(_component(f"{at.path}[{i}]", item, at) for i, item in enumerate(value))


def _component(path: str, item: Any, at: At) -> Any:
    if not isinstance(item, dict):
        raise RecipeError(path, item, "expected a mapping with a weight and what it changes")
    return at.build(item, f"{path}.", context={"params": at.parsed["params"]})


def weight(value: Any, at: At) -> float:
    """A mixture component's weight: a number > 0, its share of the draws."""
    value = _given(value)
    if not (is_number(value) and value > 0):
        raise RecipeError(at.path, value, "required: a number > 0 (its share of the draws)")
    return float(value)


def component_params(params: Mapping[str, Any], at: At) -> dict[str, Any]:
    """A mixture component's SGLang keys, checked over the recipe's (``context["params"]``)."""
    checked = checked_params(at.prefix, params, at.own)
    check_min_new_tokens(at.prefix, {**at.context["params"], **checked})
    return checked


def bound(value: Any, at: At) -> float | None:
    """A selection bound: a number >= 0, or null (no bound)."""
    value = _given(value)
    if value is None:
        return None
    if not (is_number(value) and value >= 0):
        raise RecipeError(at.path, value, "expected a number >= 0, or null")
    return float(value)


def share(value: Any, at: At) -> float | None:
    """A share from 0 to 1 (a repetition rate, a Jaccard similarity), or null."""
    value = _given(value)
    if value is None:
        return None
    if not (is_number(value) and 0 <= value <= 1):
        raise RecipeError(at.path, value, "expected a number from 0 to 1, or null")
    return float(value)


def fraction(value: Any, at: At) -> float | None:
    """A fraction of the rows: a number > 0 and <= 1, or null."""
    value = _given(value)
    if value is None:
        return None
    if not (is_number(value) and 0 < value <= 1):
        raise RecipeError(at.path, value, "expected a number > 0 and <= 1 (e.g. 0.25: a quarter), or null")
    return float(value)


def similarity(value: Any, at: At) -> float | None:
    """A Jaccard similarity threshold: a number > 0 and <= 1, or null."""
    value = _given(value)
    if value is None:
        return None
    if not (is_number(value) and 0 < value <= 1):
        raise RecipeError(at.path, value, "expected a similarity > 0 and <= 1 (e.g. 0.8), or null")
    return float(value)


def finish_reasons(value: Any, at: At) -> tuple[str, ...] | None:
    """``select.finish_reasons``: the finish reasons a row is kept with (distinct, sorted), or null."""
    value = _given(value)
    if value is None:
        return None
    known = at.spec.choices
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items or not all(isinstance(v, str) and v in known for v in items):
        raise RecipeError(at.path, value, f"expected a list of finish reasons from: {', '.join(known)}")
    return tuple(sorted(set(items)))
