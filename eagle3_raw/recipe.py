"""Recipes: one YAML file = one reproducible dataset.

A recipe is parsed into frozen dataclasses, validated in one place (:func:`parse_recipe`), and
identified by its fingerprint: a hash of every field that changes the data, with defaults resolved
and local files (prompt sources, tokenizer, template override) identified by their content.
Transport settings (endpoints, in-flight limits, timeouts, keys) never enter the fingerprint, nor
does the ``export`` section (the draft vocabulary sizes a push publishes files for).
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import functools
import hashlib
import logging
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import orjson
import yaml

from eagle3_raw.errors import RecipeError, RecipeFileError
from eagle3_raw.launching.command import check_sglang_launch
from eagle3_raw.launching.reference import check_launch_args
from eagle3_raw.limits import (
    REFERENCE_STARTUP_TIMEOUT,
    check_local_files,
    check_numbers,
    check_plain_values,
    check_recipe_file,
    check_yaml_size,
)
from eagle3_raw.printable import printable
from eagle3_raw.resources import builder_scripts_dir, reference_model_dir
from eagle3_raw.sglang.parsers import REASONING_PARSER_NAMES, TOOL_CALL_PARSER_NAMES
from eagle3_raw.yaml_text import load_yaml

REFERENCE_TOKENIZER = "reference"
"""``model.tokenizer`` value naming the built-in reference model's tokenizer."""

PromptFormat = Literal["auto", "sharegpt", "openai", "prompt"]
Turns = Literal["last", "all", "rollout"]
Merge = Literal["auto", "never"]
Render = Literal["auto", "server", "local"]
OnTruncation = Literal["keep", "drop"]

#: SGLang 0.5.23 ``SamplingParams`` defaults (``sglang/api/v1/api_types.py``). Keys listed here are
#: sent explicitly on every request so a server's ``--preferred-sampling-params`` cannot change
#: the data behind the fingerprint's back.
SGLANG_SAMPLING_DEFAULTS: Mapping[str, Any] = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 1073741824,
    "min_p": 0.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "min_new_tokens": 0,
}

#: SGLang 0.5.23 defaults of every other ``sampling_params`` key a recipe may set (sent only when
#: written). ``max_new_tokens`` has no entry: a recipe must give it (the 128 default truncates).
SGLANG_OPTIONAL_SAMPLING_DEFAULTS: Mapping[str, Any] = {
    "stop": None,
    "stop_token_ids": None,
    "stop_regex": None,
    "json_schema": None,
    "regex": None,
    "ebnf": None,
    "structural_tag": None,
    "ignore_eos": False,
    "skip_special_tokens": True,
    "spaces_between_special_tokens": True,
    "no_stop_trim": False,
    "logit_bias": None,
    "custom_params": None,
    "beam_width": None,
    "watermark": None,
}

#: Every key SGLang 0.5.23 accepts in ``sampling_params`` that a recipe may set, beyond the defaults
#: sent on every request.
SGLANG_OPTIONAL_SAMPLING_KEYS = frozenset({"max_new_tokens", *SGLANG_OPTIONAL_SAMPLING_DEFAULTS})

#: Keys SGLang accepts but eagle3_raw sets itself or must not send, with the reason.
MANAGED_SAMPLING_KEYS: Mapping[str, str] = {
    "n": "use sampling.samples_per_prompt (each sample is its own request with its own seed)",
    "sampling_seed": "derived per row from sampling.seed",
    "stream_interval": "eagle3_raw does not stream",
    "choice": "SGLang 0.5.23 accepts it in the contract but fails on it",
}

_OWN_SAMPLING_KEYS = frozenset({"samples_per_prompt", "seed", "mixture"})
_MIXTURE_OWN_KEYS = frozenset({"weight", "chat_template_kwargs", "reasoning_effort"})
MAX_MIXTURE = 64
"""The most components a sampling mixture may have."""
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")
_HUB_MODEL_ID = re.compile(r"(?:\b[\w.-]{1,96}\b/)?\b[\w.-]{1,96}\b", re.ASCII)
"""A Hub model id (``name`` or ``org/name``), as ``huggingface_hub.utils.validate_repo_id`` checks it."""


def is_hub_id(value: str) -> bool:
    """True when ``value`` has the form of a Hub repo id (``name`` or ``org/name``)."""
    return bool(_HUB_MODEL_ID.fullmatch(value)) and "--" not in value and ".." not in value


log = logging.getLogger("eagle3_raw")

T = TypeVar("T")


@dataclass(frozen=True)
class PromptsConfig:
    """Where the conversations come from and how to read them."""

    source: str
    format: PromptFormat = "auto"
    subset: str | None = None
    split: str = "train"
    revision: str | None = None
    id_column: str | None = None
    limit: int | None = None
    shuffle_seed: int | None = None


@dataclass(frozen=True)
class ModelConfig:
    """The tokenizer and chat template, and who renders the prompts (the server's chat path, or
    the same path run here: :mod:`eagle3_raw.sglang.chatpath`)."""

    tokenizer: str = REFERENCE_TOKENIZER
    revision: str | None = None
    trust_remote_code: bool = False
    chat_template: str | None = None
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    reasoning_effort: str | None = None
    """Sent with every chat request, as a chat client would (``low``, ``medium``, ``high``, ``none``)."""
    render: Render = "auto"
    """``server``: the server's ``/tokenize`` renders every prompt; ``local``: rendered here, checked
    against the server on real conversations when it can render; ``auto``: the server when it can."""
    render_date: str | None = None
    """``YYYY-MM-DD`` a date-printing template (``strftime_now``) renders with, so a rebuild on
    another day renders the same prompt; such templates are refused without it."""


@dataclass(frozen=True)
class SGLangLaunch:
    """``server.sglang``: the SGLang server ``server.launch: sglang`` starts for the run, on
    127.0.0.1 and a free port (:mod:`eagle3_raw.launching`). Not part of the fingerprint: the model
    it serves (what it reports) is part of the set's config id, as for any server."""

    model_path: str
    """``--model-path``: a Hub model id or a folder on the node that runs the server."""
    revision: str | None = None
    served_model_name: str | None = None
    tp_size: int = 1
    dp_size: int = 1
    context_length: int | None = None
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    trust_remote_code: bool = False
    deterministic: bool = True
    """``--enable-deterministic-inference``: each row's ``sampling_seed`` then decides its sample."""
    extra_args: tuple[str, ...] = ()
    """Any other ``sglang.launch_server`` flags (not the ones above, nor host, port or keys)."""
    executable: tuple[str, ...] = ()
    """The command before the flags; empty: this Python's ``-m sglang.launch_server``."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Variables added to the server's environment (e.g. ``CUDA_VISIBLE_DEVICES``)."""
    startup_timeout: float = 1800.0
    """Seconds to wait for ``/health`` before giving up (the error shows the log's tail)."""
    stop_timeout: float = 30.0
    """Seconds between SIGTERM and SIGKILL when the server is stopped."""
    log_dir: str | None = None
    """Keep the server's log in this folder (default: a temporary file, removed after a clean stop)."""


@dataclass(frozen=True)
class ServerConfig:
    """Transport: where requests go and how patiently. Never part of the fingerprint."""

    endpoints: tuple[str, ...] = ()
    launch: Literal["reference", "sglang"] | None = None
    launch_args: tuple[str, ...] = ()
    sglang: SGLangLaunch | None = None
    api_key_env: str | None = None
    max_in_flight: int | None = None
    request_timeout: float = 600.0
    connect_timeout: float = 10.0
    max_retries: int = 8
    wait_for_server: float = 600.0
    startup_timeout: float = REFERENCE_STARTUP_TIMEOUT
    """With ``launch: reference``: seconds to wait for the launched server's ``/health`` (a loaded
    machine can take long to start Python); ``launch: sglang`` has ``server.sglang.startup_timeout``."""


@dataclass(frozen=True)
class MixtureComponent:
    """One weighted choice of a sampling mixture: sampling parameters over the recipe's, and chat
    template keywords and ``reasoning_effort`` over the model's (None: the model's)."""

    weight: float
    params: Mapping[str, Any] = field(default_factory=dict)
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    reasoning_effort: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"weight": self.weight, **dict(self.params)}
        if self.chat_template_kwargs:
            data["chat_template_kwargs"] = dict(self.chat_template_kwargs)
        if self.reasoning_effort is not None:
            data["reasoning_effort"] = self.reasoning_effort
        return data


@dataclass(frozen=True)
class SamplingConfig:
    """SGLang ``sampling_params`` as written, plus eagle3_raw's sample count, base seed and the
    optional mixture (one component drawn per conversation and sample, :mod:`eagle3_raw.run.mixture`)."""

    params: Mapping[str, Any]
    samples_per_prompt: int = 1
    seed: int = 0
    mixture: tuple[MixtureComponent, ...] = ()

    def request_params(self, component: MixtureComponent | None = None) -> dict[str, Any]:
        """The ``sampling_params`` a request carries (before its ``sampling_seed``), with
        ``component``'s over the recipe's."""
        extra = component.params if component is not None else {}
        return {**SGLANG_SAMPLING_DEFAULTS, **self.params, **extra}

    def greedy_components(self) -> list[int]:
        """The mixture components (by index) that sample greedily (:func:`is_greedy`)."""
        return [i for i, c in enumerate(self.mixture) if is_greedy(self.request_params(c))]

    def warnings(self) -> list[str]:
        """What is allowed but probably not meant: greedy mixture components beside sampled ones
        when a conversation has several samples (two samples drawing one repeat each other)."""
        greedy = self.greedy_components()
        if self.samples_per_prompt < 2 or not greedy:
            return []
        shown = ", ".join(f"sampling.mixture[{i}]" for i in greedy)
        return [
            f"{shown} {'samples' if len(greedy) == 1 else 'sample'} greedily (temperature 0): two of the "
            f"{self.samples_per_prompt} samples of a conversation that both draw it are the same answer, "
            "a duplicate row; give it a temperature > 0 (each sample has its own sampling_seed), or set "
            "samples_per_prompt: 1"
        ]


def is_greedy(params: Mapping[str, Any]) -> bool:
    """Whether SGLang samples these ``sampling_params`` greedily: a temperature below 1e-6 (SGLang
    makes it top_k 1) or ``top_k`` 1; every sample of one prompt is then the same answer."""
    temperature = params.get("temperature", SGLANG_SAMPLING_DEFAULTS["temperature"])
    return (isinstance(temperature, int | float) and temperature < 1e-6) or params.get("top_k") == 1


@dataclass(frozen=True)
class RolloutConfig:
    """``turns: rollout``: how the target's own turns become the history of the next.

    ``reasoning_parser`` / ``tool_call_parser``: the SGLang parser names that split a generated
    turn into ``reasoning_content``, ``content`` and ``tool_calls`` (None: the ones the server
    reports in ``/server_info``, as its chat API uses them; no parser: the text stays content).
    ``merge``: ``auto`` makes one row of a conversation whose every prompt starts with the previous
    turn's whole sequence; ``never`` keeps one row per turn.
    """

    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    merge: Merge = "auto"


@dataclass(frozen=True)
class ExportConfig:
    """What ``push`` publishes beside the set for trainers. Never part of the fingerprint."""

    draft_vocab_sizes: tuple[int, ...] = ()


@dataclass(frozen=True)
class Recipe:
    """A parsed, validated recipe. ``base_dir`` is where relative paths resolve."""

    name: str
    prompts: PromptsConfig
    model: ModelConfig
    server: ServerConfig
    sampling: SamplingConfig
    turns: Turns = "last"
    on_truncation: OnTruncation = "keep"
    license: str | None = None
    description: str | None = None
    export: ExportConfig = field(default_factory=ExportConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    base_dir: Path = field(default_factory=Path.cwd, compare=False)

    def resolve_path(self, value: str) -> Path:
        """``value`` as a path, relative to the recipe file's folder unless absolute."""
        path = Path(value).expanduser()
        return path if path.is_absolute() else self.base_dir / path

    @functools.cached_property
    def fingerprint(self) -> str:
        """16 hex digits identifying the data this recipe produces (see :func:`fingerprint_payload`)."""
        payload = orjson.dumps(fingerprint_payload(self), option=orjson.OPT_SORT_KEYS)
        return hashlib.sha256(payload).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        """The recipe as YAML-ready data, defaults included (round-trips through :func:`parse_recipe`)."""
        return recipe_to_dict(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False, allow_unicode=True)


# --- loading ---------------------------------------------------------------------------------


def load_recipe(
    source: str | Path | Mapping[str, Any] | Recipe,
    overrides: Mapping[str, Any] | Sequence[str] | None = None,
) -> Recipe:
    """Load a recipe from a YAML path, a bundled recipe name, a mapping, or a :class:`Recipe`.

    ``overrides`` is either ``["a.b=yaml-value", ...]`` (the CLI's ``--set``) or a mapping whose keys
    are dotted paths (``{"sampling.temperature": 0}``) or section names with mapping values
    (``{"sampling": {"temperature": 0}}``, merged into the section).
    """
    if isinstance(source, Recipe):
        if not overrides:
            return source  # already validated and fingerprinted: no second pass over the files
        raw, base_dir = recipe_to_dict(source), source.base_dir
    elif isinstance(source, Mapping):
        raw, base_dir = copy.deepcopy(dict(source)), Path.cwd()
    else:
        path = find_recipe_file(source)
        check_not_kept_copy(path)
        check_recipe_file(path)
        raw, base_dir = read_yaml(path), path.parent
        raw.setdefault("name", path.stem)
    items = _override_items(overrides or {})
    recipe = parse_recipe(_one_server_kind(_apply_items(raw, items), items), base_dir=base_dir)
    recipe.fingerprint  # noqa: B018  (computed now, from the files as they are at load time)
    return recipe


KEPT_COPY_MARK = ".eagle3_raw-published-recipes"
"""The file marking a folder of recipes downloaded from the Hub (a stranger's, kept by ``reproduce``)."""


def mark_kept_copy(folder: Path, origin: str) -> None:
    """Mark ``folder`` (before anything is downloaded into it) as holding a stranger's recipes from
    ``origin`` (``org/name@commit``): :func:`load_recipe` refuses every recipe file below it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / KEPT_COPY_MARK).write_text(origin + "\n", encoding="utf-8")


def check_not_kept_copy(path: Path) -> None:
    """RecipeFileError when ``path`` lies in a folder :func:`mark_kept_copy` marked: a published
    recipe runs only through ``reproduce``, whose rules keep its server, key, launcher and code out."""
    for folder in path.absolute().parents:
        mark = folder / KEPT_COPY_MARK
        if mark.is_file() and not mark.is_symlink() and mark.stat().st_uid == os.getuid():  # ours only
            origin = mark.read_bytes()[:200].decode("utf-8", errors="replace").strip() or "the Hub"
            raise RecipeFileError(
                str(path),
                f"a published recipe (from {printable(origin)}) kept by `eagle3-raw reproduce`; a stranger's "
                f"recipe is data and runs only as `eagle3-raw reproduce {printable(origin)}` (with your "
                "server). To make it your own recipe, copy it out of that folder, read its server, "
                "model.trust_remote_code and paths, and build the copy",
            )  # fmt: skip


def find_recipe_file(source: str | Path) -> Path:
    """A recipe path as given, else a recipe bundled in ``builder_scripts`` by file name or stem."""
    path = Path(source).expanduser()
    if path.is_file():
        return path.resolve()

    bundled = builder_scripts_dir()
    for candidate in (bundled / path.name, bundled / f"{path.name}.yaml"):
        if not path.parent.parts and candidate.is_file():
            return candidate
    names = ", ".join(sorted(p.stem for p in bundled.glob("*.yaml"))) or "none"
    where = "no such file" if not path.exists() else "not a file"
    raise RecipeFileError(str(source), f"{where}, and no bundled recipe has that name (bundled: {names})")


def read_yaml(path: Path) -> dict[str, Any]:
    """A YAML file holding a mapping; errors name the file (and the line, for bad YAML)."""
    try:
        data = load_yaml(path.read_bytes().decode("utf-8"))
    except OSError as exc:
        raise RecipeFileError(str(path), f"cannot read it ({exc.strerror or exc})") from exc
    except UnicodeDecodeError as exc:
        problem = (
            f"not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}); save it as UTF-8"
        )
        raise RecipeFileError(str(path), problem) from exc
    except yaml.YAMLError as exc:
        raise RecipeFileError(str(path), f"not valid YAML ({yaml_problem(exc)})") from exc
    except (ValueError, OverflowError) as exc:  # a value YAML cannot make (an integer of 5,000 digits)
        raise RecipeFileError(str(path), f"not valid YAML ({printable(exc, limit=200)})") from exc
    if not isinstance(data, dict):
        raise RecipeFileError(
            str(path), f"expected a YAML mapping at the top level, got {type(data).__name__}"
        )
    return data


def yaml_problem(exc: yaml.YAMLError) -> str:
    """One line saying what is wrong with a YAML text, and where (1-based line and column)."""
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        return f"{where}{exc.problem or exc.context or 'cannot parse it'}"
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def apply_overrides(raw: dict[str, Any], overrides: Mapping[str, Any] | Sequence[str]) -> dict[str, Any]:
    """``raw`` with the overrides applied (see :func:`load_recipe`); ``raw`` is not modified."""
    return _apply_items(raw, _override_items(overrides))


def _apply_items(raw: dict[str, Any], items: Sequence[tuple[str, Any]]) -> dict[str, Any]:
    result = copy.deepcopy(raw)
    for dotted, value in items:
        _set_path(result, dotted.split("."), value)
    return result


def parse_set_args(items: Sequence[str]) -> dict[str, Any]:
    """``["a.b=yaml-value", ...]`` (the CLI's ``--set``) as a mapping of dotted paths to values."""
    return dict(_override_items(items))


def _override_items(overrides: Mapping[str, Any] | Sequence[str]) -> list[tuple[str, Any]]:
    if isinstance(overrides, Mapping):
        return [(k, v) for key, value in overrides.items() for k, v in _flatten(key, value)]
    items = []
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise RecipeError("--set", item, "expected KEY=VALUE, e.g. sampling.temperature=0.7")
        try:
            value = load_yaml(text)
        except (yaml.YAMLError, ValueError, OverflowError) as exc:  # ValueError: an int of 5,000 digits
            problem = yaml_problem(exc) if isinstance(exc, yaml.YAMLError) else printable(exc, limit=120)
            allowed = f"VALUE is not valid YAML ({problem}); quote a string, e.g. key='[text'"
            raise RecipeError("--set", printable(item, limit=200), allowed) from exc
        items.append((key.strip(), value))
    return items


_SERVER_KINDS = ("server.endpoints", "server.launch")


def _one_server_kind(raw: dict[str, Any], items: Sequence[tuple[str, Any]]) -> dict[str, Any]:
    """``raw`` where an override of ``server.endpoints`` (or ``server.launch``) replaces the recipe's
    other kind of server: ``--set server.endpoints=[...]`` on a recipe that launches the reference
    server sends every request to the given endpoints, and launches nothing (a notice says so)."""
    given = {key for key, value in items if key in _SERVER_KINDS and value not in (None, [], "")}
    if len(given) != 1:
        return raw
    (kept,) = given
    dropped = next(k for k in _SERVER_KINDS if k != kept).split(".")[1]
    server = raw.get("server")
    if not isinstance(server, dict) or server.get(dropped) in (None, [], ""):
        return raw
    log.info("%s is overridden: the recipe's server.%s (%r) is not used", kept, dropped, server[dropped])
    unused = {"sglang": None} if kept == "server.endpoints" and "sglang" in server else {}
    return {**raw, "server": {**server, dropped: None, **unused}}


def _flatten(key: str, value: Any) -> list[tuple[str, Any]]:
    if isinstance(value, Mapping) and key in _SECTIONS:
        return [(f"{key}.{k}", v) for k, v in value.items()]
    return [(key, value)]


def _set_path(target: dict[str, Any], parts: list[str], value: Any) -> None:
    for part in parts[:-1]:
        child = target.setdefault(part, {})
        if not isinstance(child, dict):
            raise RecipeError(".".join(parts), value, f"{part!r} is not a section")
        target = child
    target[parts[-1]] = value


# --- validation ------------------------------------------------------------------------------


def parse_recipe(raw: Mapping[str, Any], *, base_dir: Path) -> Recipe:
    """Validate raw recipe data. Every error names the field, the bad value and what is allowed.

    Bounds (:mod:`eagle3_raw.limits`) come first and last: the data's expanded size before anything
    walks it, numeric maxima and the local files' sizes before any of them is read.
    """
    check_yaml_size(raw, "recipe")
    check_plain_values(raw)
    _check_keys("", raw, _TOP_KEYS)
    name = _get(raw, "name", "", str, "a string")
    if not _NAME_RE.fullmatch(name):
        raise RecipeError("name", name, "expected letters, digits, '_', '.', '-' (max 96)")
    recipe = Recipe(
        name=name,
        prompts=_parse_prompts(_section(raw, "prompts")),
        model=_parse_model(_section(raw, "model", required=False)),
        server=_parse_server(_section(raw, "server", required=False)),
        sampling=_parse_sampling(_section(raw, "sampling")),
        turns=_choice(raw, "turns", "", ("last", "all", "rollout"), "last"),
        on_truncation=_choice(raw, "on_truncation", "", ("keep", "drop"), "keep"),
        license=_optional(raw, "license", "", str, "a string such as apache-2.0"),
        description=_optional(raw, "description", "", str, "a string"),
        export=_parse_export(_section(raw, "export", required=False)),
        rollout=_parse_rollout(raw),
        base_dir=base_dir,
    )
    _check_bounds(recipe)
    _check_remote_code(recipe)
    return recipe


_COMMIT = re.compile(r"[0-9a-f]{40}")


def _check_remote_code(recipe: Recipe) -> None:
    """Code a tokenizer brings from the Hub runs only pinned to a commit (a local folder's code is
    in the fingerprint by content)."""
    m = recipe.model
    if not m.trust_remote_code or tokenizer_path(recipe) is not None:
        return
    if m.revision is None or not _COMMIT.fullmatch(m.revision):
        raise RecipeError(
            "model.revision", m.revision,
            "trust_remote_code runs the tokenizer repo's own code: pin model.revision to a commit (40 hex "
            "digits), so the code that renders the prompts is the code the fingerprint names",
        )  # fmt: skip


def _check_bounds(recipe: Recipe) -> None:
    check_numbers(recipe)
    check_launch_args(recipe.server.launch_args)
    check_local_files(recipe)


def _parse_prompts(raw: Mapping[str, Any]) -> PromptsConfig:
    _check_keys("prompts.", raw, _PROMPTS_KEYS)
    return PromptsConfig(
        source=_get(raw, "source", "prompts.", str, "a local path or a Hub dataset id"),
        format=_choice(raw, "format", "prompts.", ("auto", "sharegpt", "openai", "prompt"), "auto"),
        subset=_optional(raw, "subset", "prompts.", str, "a string"),
        split=_get(raw, "split", "prompts.", str, "a split name", "train"),
        revision=_optional(raw, "revision", "prompts.", str, "a branch, tag or commit"),
        id_column=_optional(raw, "id_column", "prompts.", str, "a column name"),
        limit=_optional_int(raw, "limit", "prompts.", minimum=1),
        shuffle_seed=_optional_int(raw, "shuffle_seed", "prompts.", minimum=0),
    )


def _parse_model(raw: Mapping[str, Any]) -> ModelConfig:
    _check_keys("model.", raw, _MODEL_KEYS)
    kwargs = _get(raw, "chat_template_kwargs", "model.", dict, "a mapping", {})
    return ModelConfig(
        tokenizer=_get(raw, "tokenizer", "model.", str, "a local dir, a Hub id or 'reference'", "reference"),
        revision=_optional(raw, "revision", "model.", str, "a branch, tag or commit"),
        trust_remote_code=_get(raw, "trust_remote_code", "model.", bool, "true or false", False),
        chat_template=_optional(raw, "chat_template", "model.", str, "a path to a Jinja template file"),
        chat_template_kwargs=dict(kwargs),
        reasoning_effort=_optional(raw, "reasoning_effort", "model.", str, "low, medium, high or none"),
        render=_choice(raw, "render", "model.", ("auto", "server", "local"), "auto"),
        render_date=_render_date(raw.get("render_date")),
    )


def _render_date(value: Any) -> str | None:
    import datetime

    if value is None:
        return None
    if isinstance(value, datetime.date):  # YAML reads 2026-12-01 as a date
        return value.isoformat()
    if isinstance(value, str) and re.fullmatch(r"\d{4}-\d{2}-\d{2}", value):
        with contextlib.suppress(ValueError):
            return datetime.date.fromisoformat(value).isoformat()
    raise RecipeError("model.render_date", value, "expected a real date YYYY-MM-DD, e.g. 2026-12-01")


def _parse_server(raw: Mapping[str, Any]) -> ServerConfig:
    _check_keys("server.", raw, _SERVER_KEYS)
    endpoints = _endpoints(raw.get("endpoints"))
    launch = _choice(raw, "launch", "server.", ("reference", "sglang", None), None)
    if not endpoints and launch is None:
        raise RecipeError(
            "server.endpoints", [], "give at least one URL, or set server.launch: reference (or sglang)"
        )
    if endpoints and launch is not None:
        raise RecipeError(
            "server.launch", launch,
            "cannot be combined with server.endpoints (the requests would be split between your "
            "servers and the launched one): keep one of them",
        )  # fmt: skip
    args = _get(raw, "launch_args", "server.", list, "a list of strings", [])
    if args and launch == "sglang":
        raise RecipeError(
            "server.launch_args", args, "serve-reference flags; SGLang's go in server.sglang.extra_args"
        )
    return ServerConfig(
        endpoints=endpoints,
        launch=launch,
        launch_args=tuple(str(a) for a in args),
        sglang=_parse_sglang(raw.get("sglang"), launch),
        api_key_env=_optional(raw, "api_key_env", "server.", str, "an environment variable name"),
        max_in_flight=_optional_int(raw, "max_in_flight", "server.", minimum=1),
        request_timeout=_positive(raw, "request_timeout", "server.", 600.0),
        connect_timeout=_positive(raw, "connect_timeout", "server.", 10.0),
        max_retries=_get_int(raw, "max_retries", "server.", 8, minimum=0),
        wait_for_server=_positive(raw, "wait_for_server", "server.", 600.0),
        startup_timeout=_startup_timeout(raw, launch),
    )


def _startup_timeout(raw: Mapping[str, Any], launch: str | None) -> float:
    if "startup_timeout" in raw and launch == "sglang":
        why = "applies to launch: reference; SGLang's is server.sglang.startup_timeout"
        raise RecipeError("server.startup_timeout", raw["startup_timeout"], why)
    return _positive(raw, "startup_timeout", "server.", REFERENCE_STARTUP_TIMEOUT)


def _parse_sglang(raw: Any, launch: str | None) -> SGLangLaunch | None:
    """``server.sglang``, required by ``launch: sglang`` and refused without it."""
    p = "server.sglang."
    if raw is None:
        if launch == "sglang":
            raise RecipeError(
                "server.sglang", None, "required with server.launch: sglang: at least {model_path: ...}"
            )
        return None
    if launch != "sglang":
        raise RecipeError(
            "server.sglang", "...", "only read with server.launch: sglang; set it, or remove the section"
        )
    if not isinstance(raw, Mapping):
        raise RecipeError("server.sglang", raw, "expected a mapping (a YAML section)")
    _check_keys(p, raw, _SGLANG_KEYS)
    launch_config = SGLangLaunch(
        model_path=_get(raw, "model_path", p, str, "a Hub model id or a folder on the server's node"),
        revision=_optional(raw, "revision", p, str, "a branch, tag or commit"),
        served_model_name=_optional(raw, "served_model_name", p, str, "a string"),
        tp_size=_bounded_int(raw, "tp_size", p, 1),
        dp_size=_bounded_int(raw, "dp_size", p, 1),
        context_length=_optional_int(raw, "context_length", p, minimum=8),
        reasoning_parser=_optional(raw, "reasoning_parser", p, str, "an SGLang reasoning parser name"),
        tool_call_parser=_optional(raw, "tool_call_parser", p, str, "an SGLang tool-call parser name"),
        trust_remote_code=_get(raw, "trust_remote_code", p, bool, "true or false", False),
        deterministic=_get(raw, "deterministic", p, bool, "true or false", True),
        extra_args=_strings(raw, "extra_args", p),
        executable=_strings(raw, "executable", p),
        env=_string_map(raw, "env", p),
        startup_timeout=_positive(raw, "startup_timeout", p, 1800.0),
        stop_timeout=_positive(raw, "stop_timeout", p, 30.0),
        log_dir=_optional(raw, "log_dir", p, str, "a folder"),
    )

    check_sglang_launch(launch_config)
    return launch_config


def _bounded_int(raw: Mapping[str, Any], key: str, prefix: str, default: int, maximum: int = 4096) -> int:
    value = _get_int(raw, key, prefix, default, minimum=1)
    if value > maximum:
        raise RecipeError(f"{prefix}{key}", value, f"expected an integer from 1 to {maximum}")
    return value


def _strings(raw: Mapping[str, Any], key: str, prefix: str) -> tuple[str, ...]:
    value = _get(raw, key, prefix, list, "a list of strings", [])
    if not all(isinstance(v, str) for v in value):
        raise RecipeError(f"{prefix}{key}", value, 'expected a list of strings (quote numbers: "8")')
    return tuple(value)


def _string_map(raw: Mapping[str, Any], key: str, prefix: str) -> dict[str, str]:
    value = _get(raw, key, prefix, dict, "a mapping of variable names to strings", {})
    for name, text in value.items():
        if (
            not isinstance(name, str)
            or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name)
            or not isinstance(text, str)
        ):
            raise RecipeError(f"{prefix}{key}.{name}", text, 'expected NAME: "string value"')
    return dict(value)


def _endpoints(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(v, str) for v in items):
        raise RecipeError("server.endpoints", value, "expected a URL or a list of URLs")
    for url in items:
        check_url("server.endpoints", url)
    urls = tuple(url.rstrip("/") for url in items)
    if len(set(urls)) != len(urls):
        raise RecipeError(
            "server.endpoints", list(items), "expected each URL once (in-flight limits are per URL)"
        )
    return urls


def check_url(field: str, url: str) -> None:
    """RecipeError unless ``url`` is an http(s) URL with a host and, if given, a port 1-65535 (what
    aiohttp would otherwise refuse with a ValueError at the first request)."""
    import urllib.parse

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


def _parse_export(raw: Mapping[str, Any]) -> ExportConfig:
    _check_keys("export.", raw, frozenset(ExportConfig.__dataclass_fields__))
    sizes = _get(raw, "draft_vocab_sizes", "export.", list, "a list of integers >= 1", [])
    if not all(_is_int(size) and size >= 1 for size in sizes) or len(set(sizes)) != len(sizes):
        raise RecipeError("export.draft_vocab_sizes", sizes, "expected distinct integers >= 1, e.g. [32000]")
    return ExportConfig(draft_vocab_sizes=tuple(sorted(sizes)))


def _parse_rollout(raw: Mapping[str, Any]) -> RolloutConfig:
    section = _section(raw, "rollout", required=False)
    if section and raw.get("turns") != "rollout":
        raise RecipeError("rollout", dict(section), "applies to turns: rollout only (set turns: rollout)")
    _check_keys("rollout.", section, frozenset(RolloutConfig.__dataclass_fields__))

    return RolloutConfig(
        reasoning_parser=_parser_name(section, "reasoning_parser", REASONING_PARSER_NAMES),
        tool_call_parser=_parser_name(section, "tool_call_parser", TOOL_CALL_PARSER_NAMES),
        merge=_choice(section, "merge", "rollout.", ("auto", "never"), "auto"),
    )


def _parser_name(section: Mapping[str, Any], key: str, known: Sequence[str]) -> str | None:
    """One of SGLang 0.5.23's parser names (the ``--reasoning-parser`` / ``--tool-call-parser`` choices)."""
    name = _optional(section, key, "rollout.", str, "an SGLang parser name")
    if name is not None and name not in known:
        raise RecipeError(f"rollout.{key}", name, f"not an SGLang parser{did_you_mean(name, known)}; "
                          f"known: {', '.join(known)}")  # fmt: skip
    return name


def _parse_sampling(raw: Mapping[str, Any]) -> SamplingConfig:
    params = _sampling_params("sampling.", {k: v for k, v in raw.items() if k not in _OWN_SAMPLING_KEYS})
    if params.get("max_new_tokens") is None:
        raise RecipeError(
            "sampling.max_new_tokens", params.get("max_new_tokens"),
            "required: an integer >= 1 (SGLang's default of 128 silently truncates)",
        )  # fmt: skip
    _check_min_new_tokens("sampling.", params)
    config = SamplingConfig(
        params=params,
        samples_per_prompt=_get_int(raw, "samples_per_prompt", "sampling.", 1, minimum=1),
        seed=_get_int(raw, "seed", "sampling.", 0, minimum=0),
        mixture=_parse_mixture(raw.get("mixture"), params),
    )
    _check_greedy_samples(config)
    return config


def _check_greedy_samples(config: SamplingConfig) -> None:
    """Several samples of a prompt sampled greedily are one answer written several times."""
    if config.samples_per_prompt < 2:
        return
    greedy = config.greedy_components()
    if (len(greedy) == len(config.mixture)) if config.mixture else is_greedy(config.params):
        raise RecipeError(
            "sampling.samples_per_prompt", config.samples_per_prompt,
            "with greedy sampling (temperature 0, or top_k 1) every sample of a prompt is the same "
            "answer, so the set would hold each row that many times: set samples_per_prompt: 1, or "
            "sample (e.g. temperature: 0.7; each sample has its own sampling_seed, honoured by a "
            "server started with --enable-deterministic-inference)",
        )  # fmt: skip


def _sampling_params(prefix: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` checked key by key; nulls dropped (SGLang's default, not sent)."""
    for key in params:
        _check_sampling_key(key, prefix)
    for key, value in params.items():
        _check_sampling_value(key, value, prefix)
    return {k: v for k, v in params.items() if v is not None}


def _check_min_new_tokens(prefix: str, params: Mapping[str, Any]) -> None:
    minimum = params.get("min_new_tokens")
    if isinstance(minimum, int) and minimum > params["max_new_tokens"]:
        allowed = f"at most sampling.max_new_tokens ({params['max_new_tokens']}); SGLang refuses more"
        raise RecipeError(f"{prefix}min_new_tokens", minimum, allowed)


def _parse_mixture(value: Any, base: Mapping[str, Any]) -> tuple[MixtureComponent, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not value or len(value) > MAX_MIXTURE:
        raise RecipeError(
            "sampling.mixture", value,
            f"expected a list of 1 to {MAX_MIXTURE} components, e.g. [{{weight: 3, temperature: 0.7}}, "
            "{weight: 1, temperature: 0, chat_template_kwargs: {enable_thinking: false}}]",
        )  # fmt: skip
    return tuple(_mixture_component(f"sampling.mixture[{i}].", c, base) for i, c in enumerate(value))


def _mixture_component(prefix: str, raw: Any, base: Mapping[str, Any]) -> MixtureComponent:
    if not isinstance(raw, dict):
        raise RecipeError(prefix.rstrip("."), raw, "expected a mapping with a weight and what it changes")
    weight: Any = raw.get("weight")
    if not (_is_number(weight) and weight > 0):
        raise RecipeError(f"{prefix}weight", weight, "required: a number > 0 (its share of the draws)")
    params = _sampling_params(prefix, {k: v for k, v in raw.items() if k not in _MIXTURE_OWN_KEYS})
    _check_min_new_tokens(prefix, {**base, **params})
    kwargs = _get(raw, "chat_template_kwargs", prefix, dict, "a mapping", {})
    effort = _optional(raw, "reasoning_effort", prefix, str, "low, medium, high or none")
    return MixtureComponent(float(weight), params, dict(kwargs), effort)


def _check_sampling_key(key: str, prefix: str = "sampling.") -> None:
    if key in MANAGED_SAMPLING_KEYS:
        raise RecipeError(f"{prefix}{key}", key, f"not settable: {MANAGED_SAMPLING_KEYS[key]}")
    if key not in SGLANG_SAMPLING_DEFAULTS and key not in SGLANG_OPTIONAL_SAMPLING_KEYS:
        own = _OWN_SAMPLING_KEYS if prefix == "sampling." else _MIXTURE_OWN_KEYS
        allowed = sorted({*SGLANG_SAMPLING_DEFAULTS, *SGLANG_OPTIONAL_SAMPLING_KEYS, *own})
        hint = _SAMPLING_ALIASES.get(key) or did_you_mean(key, allowed)
        raise RecipeError(
            f"{prefix}{key}", key, f"not an SGLang sampling key{hint}; allowed: {', '.join(allowed)}"
        )


#: Names other APIs use for an SGLang sampling key.
_SAMPLING_ALIASES: Mapping[str, str] = {
    "max_tokens": " (SGLang calls it max_new_tokens)",
    "max_completion_tokens": " (SGLang calls it max_new_tokens)",
    "stop_sequences": " (SGLang calls it stop)",
}


def _check_sampling_value(key: str, value: Any, prefix: str = "sampling.") -> None:
    if value is None and key in SGLANG_OPTIONAL_SAMPLING_DEFAULTS:
        return  # SGLang reads null as "use the default", as if the key were left out
    check = _SAMPLING_CHECKS.get(key)
    if check is not None and not check[0](value):
        raise RecipeError(f"{prefix}{key}", value, check[1])


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


def _num_in(low: float, high: float, *, low_open: bool = False) -> Callable[[Any], bool]:
    return lambda v: _is_number(v) and (v > low if low_open else v >= low) and v <= high


_SAMPLING_CHECKS: Mapping[str, tuple[Callable[[Any], bool], str]] = {
    "max_new_tokens": (lambda v: _is_int(v) and v >= 1, "expected an integer >= 1"),
    "min_new_tokens": (lambda v: _is_int(v) and v >= 0, "expected an integer >= 0"),
    "temperature": (lambda v: _is_number(v) and v >= 0, "expected a finite number >= 0 (0 = greedy)"),
    "top_p": (_num_in(0.0, 1.0, low_open=True), "expected a number in (0, 1]"),
    "top_k": (lambda v: _is_int(v) and (v == -1 or v >= 1), "expected -1 (all) or an integer >= 1"),
    "min_p": (_num_in(0.0, 1.0), "expected a number in [0, 1]"),
    "frequency_penalty": (_num_in(-2.0, 2.0), "expected a number in [-2, 2]"),
    "presence_penalty": (_num_in(-2.0, 2.0), "expected a number in [-2, 2]"),
    "repetition_penalty": (_num_in(0.0, 2.0, low_open=True), "expected a number in (0, 2]"),
    "ignore_eos": (lambda v: isinstance(v, bool), "expected true or false"),
    "skip_special_tokens": (lambda v: isinstance(v, bool), "expected true or false"),
    "stop_token_ids": (lambda v: isinstance(v, list) and all(map(_is_int, v)), "expected a list of ints"),
    "stop": (
        lambda v: (
            isinstance(v, str)
            or (isinstance(v, list) and len(v) <= 32 and all(isinstance(s, str) for s in v))
        ),
        "expected a string or a list of at most 32 strings",
    ),
}


# --- small typed getters -----------------------------------------------------------------------


def _section(raw: Mapping[str, Any], name: str, *, required: bool = True) -> Mapping[str, Any]:
    value = raw.get(name)
    if value is None and not required:
        return {}
    if not isinstance(value, Mapping):
        raise RecipeError(name, value, "expected a mapping (a YAML section)")
    return value


def _check_keys(prefix: str, raw: Mapping[str, Any], allowed: frozenset[str]) -> None:
    for key in raw:
        if key not in allowed:
            raise RecipeError(
                f"{prefix}{key}", raw[key],
                f"unknown field{did_you_mean(key, allowed)}; allowed: {', '.join(sorted(allowed))}",
            )  # fmt: skip


def did_you_mean(key: object, known: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for a near miss of one of ``known``, else ``""``."""
    close = difflib.get_close_matches(str(key), list(known), n=1, cutoff=0.75)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _get(raw: Mapping[str, Any], key: str, prefix: str, kind: type[T], allowed: str, default: Any = ...) -> T:
    value = raw.get(key, default)
    if value is ... or (value is None and default is ...):
        raise RecipeError(f"{prefix}{key}", None, f"required: {allowed}")
    if value is None:
        value = default
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise RecipeError(f"{prefix}{key}", value, f"expected {allowed}")
    return value


def _optional(raw: Mapping[str, Any], key: str, prefix: str, kind: type[T], allowed: str) -> T | None:
    return None if raw.get(key) is None else _get(raw, key, prefix, kind, allowed)


def _get_int(raw: Mapping[str, Any], key: str, prefix: str, default: int, *, minimum: int) -> int:
    value = _get(raw, key, prefix, int, f"an integer >= {minimum}", default)
    if value < minimum:
        raise RecipeError(f"{prefix}{key}", value, f"expected an integer >= {minimum}")
    return value


def _optional_int(raw: Mapping[str, Any], key: str, prefix: str, *, minimum: int) -> int | None:
    return None if raw.get(key) is None else _get_int(raw, key, prefix, 0, minimum=minimum)


def _positive(raw: Mapping[str, Any], key: str, prefix: str, default: float) -> float:
    value = raw.get(key, default)
    if not _is_number(value) or value <= 0:
        raise RecipeError(f"{prefix}{key}", value, "expected a positive number of seconds")
    return float(value)


def _choice(raw: Mapping[str, Any], key: str, prefix: str, allowed: Sequence[Any], default: Any) -> Any:
    value = raw.get(key, default)
    if value not in allowed:
        shown = ", ".join("null" if a is None else str(a) for a in allowed)
        raise RecipeError(f"{prefix}{key}", value, f"expected one of: {shown}")
    return value


_TOP_KEYS = frozenset(
    {"name", "prompts", "model", "server", "sampling", "turns", "on_truncation", "license", "description",
     "export", "rollout"}
)  # fmt: skip
_SECTIONS = frozenset({"prompts", "model", "server", "sampling", "export", "rollout"})
_PROMPTS_KEYS = frozenset(PromptsConfig.__dataclass_fields__)
_MODEL_KEYS = frozenset(ModelConfig.__dataclass_fields__)
_SERVER_KEYS = frozenset(ServerConfig.__dataclass_fields__)
_SGLANG_KEYS = frozenset(SGLangLaunch.__dataclass_fields__)


# --- output and fingerprint ------------------------------------------------------------------


def recipe_to_dict(recipe: Recipe) -> dict[str, Any]:
    """YAML-ready data with every field (defaults included); ``base_dir`` is not part of it."""
    from dataclasses import asdict

    server = asdict(recipe.server)
    server["endpoints"] = list(recipe.server.endpoints)
    server["launch_args"] = list(recipe.server.launch_args)
    server["sglang"] = _sglang_dict(recipe.server.sglang)
    if recipe.server.launch == "sglang":  # SGLang's own is server.sglang.startup_timeout
        del server["startup_timeout"]
    sampling = recipe.sampling
    return {
        "name": recipe.name,
        "description": recipe.description,
        "license": recipe.license,
        "prompts": asdict(recipe.prompts),
        "turns": recipe.turns,
        "model": {**asdict(recipe.model), "chat_template_kwargs": dict(recipe.model.chat_template_kwargs)},
        "server": server,
        "sampling": {
            **dict(sampling.params),
            "samples_per_prompt": sampling.samples_per_prompt,
            "seed": sampling.seed,
            **({"mixture": [c.to_dict() for c in sampling.mixture]} if sampling.mixture else {}),
        },
        "on_truncation": recipe.on_truncation,
        **_export_dict(recipe.export),
        **({"rollout": asdict(recipe.rollout)} if recipe.turns == "rollout" else {}),
    }


def _sglang_dict(launch: SGLangLaunch | None) -> dict[str, Any] | None:
    """``server.sglang`` as YAML-ready data (lists, not tuples), or None."""
    if launch is None:
        return None
    from dataclasses import asdict

    data = asdict(launch)
    data.update(extra_args=list(launch.extra_args), executable=list(launch.executable), env=dict(launch.env))
    return data


def _export_dict(export: ExportConfig) -> dict[str, Any]:
    """The ``export`` section, only when it is set (recipes without one publish as before)."""
    return (
        {"export": {"draft_vocab_sizes": list(export.draft_vocab_sizes)}} if export.draft_vocab_sizes else {}
    )


def fingerprint_payload(recipe: Recipe) -> dict[str, Any]:
    """Everything that changes the data, canonical: defaults resolved, local files by content digest.

    A local path enters only through its content (moving a file keeps the fingerprint); a Hub id
    enters with its revision as written (pin ``revision`` for a fingerprint that means one thing).
    """
    return {
        "prompts": _prompts_identity(recipe),
        "turns": recipe.turns,
        "model": _model_identity(recipe),
        "sampling": {
            "params": canonical_params(recipe.sampling.request_params()),
            "samples_per_prompt": recipe.sampling.samples_per_prompt,
            "seed": recipe.sampling.seed,
            **_mixture_identity(recipe),
        },
        "on_truncation": recipe.on_truncation,
        **_rollout_identity(recipe),
    }


def shaping_payload(recipe: Recipe) -> dict[str, Any]:
    """The fields that shape each request (not which rows there are): the model, its template and
    kwargs, the sampling parameters and the base seed. Part of every input key
    (:func:`eagle3_raw.identity.input_context`)."""
    return {
        "model": _model_identity(recipe),
        "params": canonical_params(recipe.sampling.request_params()),
        "seed": recipe.sampling.seed,
        **_mixture_identity(recipe),
        **_rollout_identity(recipe, shaping=True),
    }


def _mixture_identity(recipe: Recipe) -> dict[str, Any]:
    """The mixture as each component's resolved request (absent without one: fingerprints of
    recipes that have none stay as they were)."""
    if not recipe.sampling.mixture:
        return {}
    return {
        "mixture": [
            {
                "weight": c.weight,
                "params": canonical_params(recipe.sampling.request_params(c)),
                "chat_template_kwargs": dict(c.chat_template_kwargs),
                "reasoning_effort": c.reasoning_effort,
            }
            for c in recipe.sampling.mixture
        ]
    }


def _rollout_identity(recipe: Recipe, *, shaping: bool = False) -> dict[str, Any]:
    """The rollout section (absent unless ``turns: rollout``); ``shaping``: what shapes requests
    (the parsers), not how rows are made of them (``merge``)."""
    if recipe.turns != "rollout":
        return {}
    r = recipe.rollout
    section: dict[str, Any] = {"reasoning_parser": r.reasoning_parser, "tool_call_parser": r.tool_call_parser}
    return {"rollout": section if shaping else {**section, "merge": r.merge}}


def canonical_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` with every SGLang default resolved: optional keys left at their default dropped."""
    result = {k: v for k, v in params.items() if not _is_optional_default(k, v)}
    if result.get("top_k") == -1:
        result["top_k"] = SGLANG_SAMPLING_DEFAULTS["top_k"]
    for key, value in result.items():
        if isinstance(value, int) and not isinstance(value, bool) and key in _FLOAT_KEYS:
            result[key] = float(value)
    return result


def _is_optional_default(key: str, value: Any) -> bool:
    """True when sending ``value`` for optional ``key`` means the same to SGLang as leaving it out.

    Null, ``[]`` and ``{}`` are unset. An empty *string* is not: ``stop: ""`` or ``regex: ""`` changes
    the output. Types must match too (``0`` is not ``false``; SGLang refuses it).
    """
    if key not in SGLANG_OPTIONAL_SAMPLING_DEFAULTS:
        return False
    if value is None or (isinstance(value, (list, dict)) and not value):
        return True
    default = SGLANG_OPTIONAL_SAMPLING_DEFAULTS[key]
    return type(value) is type(default) and value == default


_FLOAT_KEYS = frozenset(
    {"temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty"}
)


def _prompts_identity(recipe: Recipe) -> dict[str, Any]:
    p = recipe.prompts
    local = recipe.resolve_path(p.source)
    source: dict[str, Any] = (
        {"content": digest_files(local if local.is_dir() else local.parent, prompt_source_files(local))}
        if local.exists()
        else {"hub": p.source, "subset": p.subset, "split": p.split, "revision": p.revision}
    )
    return {
        "source": source,
        "format": p.format,
        "id_column": p.id_column,
        "limit": p.limit,
        "shuffle_seed": p.shuffle_seed,
    }


def _model_identity(recipe: Recipe) -> dict[str, Any]:
    m = recipe.model
    tokenizer_dir = tokenizer_path(recipe)
    if tokenizer_dir is None and not is_hub_id(m.tokenizer):
        where = recipe.resolve_path(m.tokenizer)
        problem = "is not a folder" if where.exists() else "does not exist"
        allowed = f"no tokenizer folder: {where} {problem} (and it is not a Hub model id, org/name)"
        raise RecipeError("model.tokenizer", m.tokenizer, allowed)
    return {
        "tokenizer": (
            {"content": digest_path(tokenizer_dir)}
            if tokenizer_dir is not None
            else {"hub": m.tokenizer, "revision": m.revision}
        ),
        "chat_template": _template_digest(recipe) if m.chat_template else None,
        "chat_template_kwargs": dict(m.chat_template_kwargs),
        "reasoning_effort": m.reasoning_effort,
        "render_date": m.render_date,
    }


def _template_digest(recipe: Recipe) -> str:
    assert recipe.model.chat_template is not None
    path = recipe.resolve_path(recipe.model.chat_template)
    if not path.is_file():
        problem = "is a folder" if path.is_dir() else "does not exist"
        raise RecipeError(
            "model.chat_template", str(path), f"no such file: {problem}; give a Jinja template file"
        )
    return digest_path(path)


def tokenizer_path(recipe: Recipe) -> Path | None:
    """The local tokenizer directory of the recipe, or None when ``model.tokenizer`` is a Hub id."""
    if recipe.model.tokenizer == REFERENCE_TOKENIZER:
        return reference_model_dir()
    local = recipe.resolve_path(recipe.model.tokenizer)
    return local if local.is_dir() else None


PROMPT_SUFFIXES = (".jsonl", ".json", ".parquet")
"""File types a local prompt source is read from."""


def prompt_source_files(path: Path) -> list[Path]:
    """The files a local prompt source is read from: the file itself, or the folder's top-level
    data files (``PROMPT_SUFFIXES``, not hidden) in name order."""
    if path.is_file():
        return [path]
    return sorted(
        p
        for p in path.iterdir()
        if p.is_file() and not p.name.startswith(".") and p.name.endswith(PROMPT_SUFFIXES)
    )


def digest_path(path: Path) -> str:
    """sha256 over a file's bytes, or over a folder's files (relative names and bytes, sorted).

    In a folder, only text-like files count (JSON, Jinja, vocabularies, data files), so a model
    folder's multi-GB weights are never read; hidden files and folders inside it are skipped.
    """
    if not path.exists():
        raise RecipeError("path", str(path), "expected an existing file or folder")
    if path.is_file():
        return digest_files(path.parent, [path])
    return digest_files(path, digested_files(path))


def digested_files(folder: Path) -> list[Path]:
    """The files of ``folder`` that :func:`digest_path` reads, in path order: all files below it but
    hidden ones (or ones in hidden folders or ``__pycache__``) and model weights. A push uploads
    exactly these, so the published recipe keeps its fingerprint."""
    return sorted(p for p in folder.rglob("*") if _digestible(p, folder))


def digest_files(root: Path, files: list[Path]) -> str:
    """sha256 over ``files``' names (relative to ``root``) and bytes, in name order."""
    digest = hashlib.sha256()
    for name, file in sorted((f.relative_to(root).as_posix(), f) for f in files):
        digest.update(name.encode() + b"\0")
        with file.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


_WEIGHT_SUFFIXES = frozenset({".safetensors", ".bin", ".pt", ".pth", ".gguf", ".ckpt", ".h5", ".msgpack"})


def _digestible(path: Path, root: Path) -> bool:
    parts = path.relative_to(root).parts
    hidden = any(part.startswith(".") or part == "__pycache__" for part in parts)
    return path.is_file() and not hidden and path.suffix not in _WEIGHT_SUFFIXES
