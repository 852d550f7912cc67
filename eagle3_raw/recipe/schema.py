"""Recipes: one YAML file = one reproducible dataset, parsed into these frozen dataclasses.

Each recipe field is declared once, here: its type, its default, and (in its metadata,
:mod:`eagle3_raw.recipe.fields`) what it allows, its bounds or choices, its own rules and its help.
:func:`eagle3_raw.recipe.parsing.build` reads every section from these declarations; rules over a
whole section are its class's ``check()``. A new field is one declaration here plus its use.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

import yaml

from eagle3_raw.errors import RecipeError
from eagle3_raw.launching.reference import check_launch_args
from eagle3_raw.limits import REFERENCE_STARTUP_TIMEOUT, check_numbers
from eagle3_raw.recipe import values
from eagle3_raw.recipe.engines import check_for_engine
from eagle3_raw.recipe.fields import choice, custom, flag, integer, mapping, seconds, section, strings, text
from eagle3_raw.recipe.fingerprint import REFERENCE_TOKENIZER, fingerprint, recipe_to_dict, tokenizer_path
from eagle3_raw.recipe.localfiles import check_local_files
from eagle3_raw.recipe.sampling import is_greedy
from eagle3_raw.sglang.parsers import REASONING_PARSER_NAMES as SGLANG_REASONING_PARSERS
from eagle3_raw.sglang.parsers import TOOL_CALL_PARSER_NAMES as SGLANG_TOOL_CALL_PARSERS
from eagle3_raw.sglang.sampling import SGLANG_SAMPLING_DEFAULTS
from eagle3_raw.splits import SplitRule
from eagle3_raw.vllm.parsers import REASONING_PARSER_NAMES as VLLM_REASONING_PARSERS
from eagle3_raw.vllm.parsers import TOOL_CALL_PARSER_NAMES as VLLM_TOOL_CALL_PARSERS

PromptFormat = Literal["auto", "sharegpt", "openai", "prompt"]
Turns = Literal["last", "all", "rollout"]
Merge = Literal["auto", "never"]
Render = Literal["auto", "server", "local"]
OnTruncation = Literal["keep", "drop"]
Launch = Literal["reference", "sglang", "vllm"]
Engine = Literal["sglang", "vllm"]

LAUNCH_ENGINES: Mapping[str, str] = {"reference": "sglang", "sglang": "sglang", "vllm": "vllm"}
"""The engine each ``server.launch`` starts (the reference server speaks SGLang's API)."""

_REVISION = "a branch, tag or commit"


def _names(*engines: tuple[str, ...]) -> tuple[str, ...]:
    """Every engine's parser names, each once, in order."""
    return tuple(dict.fromkeys(name for names in engines for name in names))


_COMMIT = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class PromptsConfig:
    """Where the conversations come from and how to read them."""

    source: str = field(metadata=text("a local path or a Hub dataset id"))
    format: PromptFormat = field(default="auto", metadata=choice(get_args(PromptFormat)))
    subset: str | None = field(default=None, metadata=text())
    split: str = field(default="train", metadata=text("a split name"))
    revision: str | None = field(default=None, metadata=text(_REVISION))
    id_column: str | None = field(default=None, metadata=text("a column name"))
    category_column: str | None = field(default=None, metadata=text("a column name"))
    """A source column whose value groups the rows in acceptance summaries (card, ``eval``); it
    changes no row, so it is not part of the fingerprint."""
    limit: int | None = field(default=None, metadata=integer(minimum=1))
    shuffle_seed: int | None = field(default=None, metadata=integer(minimum=0))


@dataclass(frozen=True)
class ModelConfig:
    """The tokenizer and chat template, and who renders the prompts (the server's chat path, or
    the same path run here: :mod:`eagle3_raw.sglang.chatpath`)."""

    tokenizer: str = field(default=REFERENCE_TOKENIZER, metadata=text("a local dir, a Hub id or 'reference'"))
    revision: str | None = field(default=None, metadata=text(_REVISION))
    trust_remote_code: bool = field(default=False, metadata=flag())
    chat_template: str | None = field(default=None, metadata=text("a path to a Jinja template file"))
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict, metadata=mapping())
    reasoning_effort: str | None = field(
        default=None,
        metadata=text(
            "low, medium, high or none",
            help="Sent with every chat request, as a chat client would (low, medium, high, none).",
        ),
    )
    render: Render = field(
        default="auto",
        metadata=choice(
            get_args(Render),
            help="server: the server's /tokenize renders every prompt; local: rendered here, checked "
            "against the server on real conversations when it can render; auto: the server when it can.",
        ),
    )
    render_date: str | None = field(
        default=None,
        metadata=custom(
            values.render_date,
            help="YYYY-MM-DD a date-printing template (strftime_now) renders with, so a rebuild on "
            "another day renders the same prompt; such templates are refused without it.",
        ),
    )


@dataclass(frozen=True)
class SGLangLaunch:
    """``server.sglang``: the SGLang server ``server.launch: sglang`` starts for the run, on
    127.0.0.1 and a free port (:mod:`eagle3_raw.launching`). Not part of the fingerprint: the model
    it serves (what it reports) is part of the set's config id, as for any server."""

    model_path: str = field(
        metadata=text(
            "a Hub model id or a folder on the server's node",
            help="--model-path: a Hub model id or a folder on the node that runs the server.",
        )
    )
    revision: str | None = field(default=None, metadata=text(_REVISION))
    served_model_name: str | None = field(default=None, metadata=text())
    tp_size: int = field(default=1, metadata=integer(minimum=1, maximum=4096))
    dp_size: int = field(default=1, metadata=integer(minimum=1, maximum=4096))
    context_length: int | None = field(default=None, metadata=integer(minimum=8))
    reasoning_parser: str | None = field(default=None, metadata=text("an SGLang reasoning parser name"))
    tool_call_parser: str | None = field(default=None, metadata=text("an SGLang tool-call parser name"))
    trust_remote_code: bool = field(default=False, metadata=flag())
    deterministic: bool = field(
        default=True,
        metadata=flag(
            help="--enable-deterministic-inference: each row's sampling_seed then decides its sample."
        ),
    )
    extra_args: tuple[str, ...] = field(
        default=(),
        metadata=strings(
            help="Any other sglang.launch_server flags (not the ones above, nor host, port or keys)."
        ),
    )
    executable: tuple[str, ...] = field(
        default=(),
        metadata=strings(help="The command before the flags; empty: this Python's -m sglang.launch_server."),
    )
    env: Mapping[str, str] = field(
        default_factory=dict,
        metadata=custom(
            values.environment,
            "a mapping of variable names to strings",
            kind="mapping",
            help="Variables added to the server's environment (e.g. CUDA_VISIBLE_DEVICES).",
        ),
    )
    startup_timeout: float = field(
        default=1800.0,
        metadata=seconds(
            help="Seconds to wait for /health before giving up (the error shows the log's tail)."
        ),
    )
    stop_timeout: float = field(
        default=30.0, metadata=seconds(help="Seconds between SIGTERM and SIGKILL when the server is stopped.")
    )
    log_dir: str | None = field(
        default=None,
        metadata=text(
            "a folder",
            help="Keep the server's log in this folder (default: a temporary file, removed after a "
            "clean stop).",
        ),
    )


@dataclass(frozen=True)
class VLLMLaunch:
    """``server.vllm``: the vLLM server ``server.launch: vllm`` starts for the run, on 127.0.0.1 and a
    free port (:mod:`eagle3_raw.launching`; its command and environment:
    :mod:`eagle3_raw.vllm.launch`). Not part of the fingerprint: the model it serves (what it
    reports) is part of the set's config id, as for any server."""

    model: str = field(
        metadata=text(
            "a Hub model id or a folder on the server's node",
            help="--model: a Hub model id or a folder on the node that runs the server.",
        )
    )
    revision: str | None = field(default=None, metadata=text(_REVISION))
    served_model_name: str | None = field(default=None, metadata=text())
    tensor_parallel_size: int = field(default=1, metadata=integer(minimum=1, maximum=4096))
    data_parallel_size: int = field(default=1, metadata=integer(minimum=1, maximum=4096))
    max_model_len: int | None = field(default=None, metadata=integer(minimum=8))
    reasoning_parser: str | None = field(default=None, metadata=text("a vLLM reasoning parser name"))
    tool_call_parser: str | None = field(
        default=None,
        metadata=text(
            "a vLLM tool-call parser name",
            help="--tool-call-parser, with --enable-auto-tool-choice (vLLM needs both for tool calls).",
        ),
    )
    trust_remote_code: bool = field(default=False, metadata=flag())
    seed: int = field(
        default=0,
        metadata=integer(
            minimum=0, help="--seed: with it, a request's own seed decides its sample (vLLM's default 0)."
        ),
    )
    extra_args: tuple[str, ...] = field(
        default=(),
        metadata=strings(
            help="Any other vLLM server flags (not the ones above, nor host, port, keys or --config)."
        ),
    )
    executable: tuple[str, ...] = field(
        default=(),
        metadata=strings(
            help="The command before the flags; empty: this Python's -m vllm.entrypoints.openai.api_server."
        ),
    )
    env: Mapping[str, str] = field(
        default_factory=dict,
        metadata=custom(
            values.environment,
            "a mapping of variable names to strings",
            kind="mapping",
            help="Variables added to the server's environment (e.g. CUDA_VISIBLE_DEVICES); usage "
            "statistics are always off.",
        ),
    )
    startup_timeout: float = field(
        default=1800.0,
        metadata=seconds(
            help="Seconds to wait for /health before giving up (the error shows the log's tail)."
        ),
    )
    stop_timeout: float = field(
        default=30.0, metadata=seconds(help="Seconds between SIGTERM and SIGKILL when the server is stopped.")
    )
    log_dir: str | None = field(
        default=None,
        metadata=text(
            "a folder",
            help="Keep the server's log in this folder (default: a temporary file, removed after a "
            "clean stop).",
        ),
    )


@dataclass(frozen=True)
class ServerConfig:
    """Transport: where requests go and how patiently. Never part of the fingerprint."""

    endpoints: tuple[str, ...] = field(default=(), metadata=custom(values.endpoints))
    engine: Engine | None = field(
        default=None,
        metadata=choice(
            (*get_args(Engine), None),
            help="The servers' engine: sglang or vllm (None: asked from each server, /v1/models; "
            "server.launch decides it for a launched server).",
        ),
    )
    launch: Launch | None = field(
        default=None, metadata=choice((*get_args(Launch), None), check=values.check_one_server)
    )
    launch_args: tuple[str, ...] = field(
        default=(), metadata=custom(values.launch_args, "a list of strings", kind="list")
    )
    sglang: SGLangLaunch | None = field(
        default=None, metadata=custom(values.sglang_section, section=SGLangLaunch)
    )
    vllm: VLLMLaunch | None = field(default=None, metadata=custom(values.vllm_section, section=VLLMLaunch))
    api_key_env: str | None = field(default=None, metadata=text("an environment variable name"))
    max_in_flight: int | None = field(default=None, metadata=integer(minimum=1))
    request_timeout: float = field(default=600.0, metadata=seconds())
    connect_timeout: float = field(default=10.0, metadata=seconds())
    max_retries: int = field(default=8, metadata=integer(minimum=0))
    wait_for_server: float = field(default=600.0, metadata=seconds())
    startup_timeout: float = field(
        default=REFERENCE_STARTUP_TIMEOUT,
        metadata=custom(
            values.reference_startup_timeout,
            kind="seconds",
            help="With launch: reference: seconds to wait for the launched server's /health (a loaded "
            "machine can take long to start Python); launch: sglang has server.sglang.startup_timeout "
            "(vllm: server.vllm.startup_timeout).",
        ),
    )

    @property
    def engine_name(self) -> str | None:
        """The engine the servers are, when the recipe says (``engine``, or what ``launch`` starts)."""
        return self.engine or LAUNCH_ENGINES.get(self.launch or "")


@dataclass(frozen=True)
class MixtureComponent:
    """One weighted choice of a sampling mixture: sampling parameters over the recipe's, and chat
    template keywords and ``reasoning_effort`` over the model's (None: the model's)."""

    weight: float = field(metadata=custom(values.weight))
    params: Mapping[str, Any] = field(
        default_factory=dict, metadata=custom(values.component_params, rest=True)
    )
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict, metadata=mapping())
    reasoning_effort: str | None = field(default=None, metadata=text("low, medium, high or none"))

    def to_dict(self) -> dict[str, Any]:
        """The component as written: its weight and parameters, and what it changes of the model."""
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

    params: Mapping[str, Any] = field(metadata=custom(values.sampling_params, rest=True))
    samples_per_prompt: int = field(default=1, metadata=integer(minimum=1))
    seed: int = field(default=0, metadata=integer(minimum=0))
    mixture: tuple[MixtureComponent, ...] = field(
        default=(), metadata=custom(values.mixture, section=MixtureComponent)
    )

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

    def check(self) -> None:
        """RecipeError for several samples of a prompt sampled greedily: one answer written several
        times."""
        if self.samples_per_prompt < 2:
            return
        greedy = self.greedy_components()
        if (len(greedy) == len(self.mixture)) if self.mixture else is_greedy(self.params):
            raise RecipeError(
                "sampling.samples_per_prompt", self.samples_per_prompt,
                "with greedy sampling (temperature 0, or top_k 1) every sample of a prompt is the same "
                "answer, so the set would hold each row that many times: set samples_per_prompt: 1, or "
                "sample (e.g. temperature: 0.7; each sample has its own sampling_seed, honoured by a "
                "server started with --enable-deterministic-inference)",
            )  # fmt: skip


@dataclass(frozen=True)
class RolloutConfig:
    """``turns: rollout``: how the target's own turns become the history of the next."""

    reasoning_parser: str | None = field(
        default=None,
        metadata=custom(
            values.parser_name,
            "an SGLang or vLLM parser name",
            kind="text",
            choices=_names(SGLANG_REASONING_PARSERS, VLLM_REASONING_PARSERS),
            help="The parser that splits a generated turn into reasoning and content (None: the one "
            "the server reports, as its chat API uses it; none: the text stays content). vLLM splits "
            "with the parsers it runs: the name records which.",
        ),
    )
    tool_call_parser: str | None = field(
        default=None,
        metadata=custom(
            values.parser_name,
            "an SGLang or vLLM parser name",
            kind="text",
            choices=_names(SGLANG_TOOL_CALL_PARSERS, VLLM_TOOL_CALL_PARSERS),
            help="The parser that splits tool_calls out of a generated turn (None: the server's).",
        ),
    )
    merge: Merge = field(
        default="auto",
        metadata=choice(
            get_args(Merge),
            help="auto makes one row of a conversation whose every prompt starts with the previous "
            "turn's whole sequence; never keeps one row per turn.",
        ),
    )


@dataclass(frozen=True)
class ExportConfig:
    """What ``push`` publishes beside the set for trainers. Never part of the fingerprint."""

    draft_vocab_sizes: tuple[int, ...] = field(
        default=(), metadata=custom(values.draft_vocab_sizes, "a list of integers >= 1", kind="list")
    )


_LENGTH = "keep a row whose {what} is {side} this many tokens (null: no bound)"


_RULE_OPTION_OF = {"max_repetition": "repetition_ngram", "near_duplicate_threshold": "near_duplicate_shingle"}
_RULE_OPTIONS = frozenset(_RULE_OPTION_OF.values())


@dataclass(frozen=True)
class SelectConfig:
    """``select``: the rules that make a derived set of the recipe's set (its parent: the same
    recipe without ``select``), applied as its rows are read (:mod:`eagle3_raw.selection`).

    Every rule keeps the rows it allows; a row is dropped when any rule drops it, and counted under
    the first of them in this declared order. Lengths: ``prompt`` is ``prompt_len``, ``output`` the
    generated ids (``loss_mask`` 1), ``total`` ``len(input_ids)``. Not part of the fingerprint
    unless a rule is set (a recipe without one keeps its set id).
    """

    finish_reasons: tuple[str, ...] | None = field(
        default=None,
        metadata=custom(
            values.finish_reasons,
            "a list of finish reasons",
            choices=("stop", "length"),
            help="keep only the rows that ended with one of these (null: any)",
        ),
    )
    min_prompt_len: int | None = field(
        default=None, metadata=integer(minimum=0, help=_LENGTH.format(what="prompt", side="at least"))
    )
    max_prompt_len: int | None = field(
        default=None, metadata=integer(minimum=0, help=_LENGTH.format(what="prompt", side="at most"))
    )
    min_output_len: int | None = field(
        default=None, metadata=integer(minimum=0, help=_LENGTH.format(what="output", side="at least"))
    )
    max_output_len: int | None = field(
        default=None, metadata=integer(minimum=0, help=_LENGTH.format(what="output", side="at most"))
    )
    min_total_len: int | None = field(
        default=None, metadata=integer(minimum=0, help=_LENGTH.format(what="total", side="at least"))
    )
    max_total_len: int | None = field(
        default=None, metadata=integer(minimum=0, help=_LENGTH.format(what="total", side="at most"))
    )
    min_accept_length: float | None = field(
        default=None,
        metadata=custom(
            values.bound, "a number >= 0", help="keep a row whose meta.spec_accept_length is at least this"
        ),
    )
    max_accept_length: float | None = field(
        default=None,
        metadata=custom(
            values.bound,
            "a number >= 0",
            help="keep a row whose meta.spec_accept_length is at most this (the drafter's hard rows)",
        ),
    )
    lowest_accept_fraction: float | None = field(
        default=None,
        metadata=custom(
            values.fraction,
            "a number > 0 and <= 1",
            help="keep the ceil(f x measured) rows of the parent set with the lowest spec_accept_length "
            "(ties: the earlier row)",
        ),
    )
    max_repetition: float | None = field(
        default=None,
        metadata=custom(
            values.share,
            "a number from 0 to 1",
            help="keep a row whose generated spans' n-gram repetition rate (the share of a span's "
            "n-grams that repeat an earlier n-gram of the span; a row's: its highest span's) is at most this",
        ),
    )
    repetition_ngram: int = field(
        default=4, metadata=integer(minimum=1, maximum=64, help="n of max_repetition's n-grams")
    )
    drop_duplicate_prompts: bool = field(
        default=False,
        metadata=flag(help="drop a row whose prompt ids equal those of a row kept before it"),
    )
    near_duplicate_threshold: float | None = field(
        default=None,
        metadata=custom(
            values.similarity,
            "a number > 0 and <= 1",
            help="drop a row whose prompt's shingles have an estimated Jaccard similarity of at least "
            "this with a row kept before it (MinHash, 128 hashes, LSH candidates)",
        ),
    )
    near_duplicate_shingle: int = field(
        default=5, metadata=integer(minimum=1, maximum=64, help="ids per shingle of near_duplicate_threshold")
    )

    @property
    def active(self) -> bool:
        """Whether any rule is set (a section of defaults selects nothing and changes no id)."""
        return bool(self.rules())

    def rules(self) -> dict[str, Any]:
        """The rules set, in declared order, with the n-gram and shingle sizes only beside the rule
        that reads them: two sections that select the same rows give the same mapping."""
        rules: dict[str, Any] = {}
        for item in dataclasses.fields(self):
            value = getattr(self, item.name)
            if item.name in _RULE_OPTIONS or value is None or value is False:
                continue
            rules[item.name] = list(value) if isinstance(value, tuple) else value
            if item.name in _RULE_OPTION_OF:
                option = _RULE_OPTION_OF[item.name]
                rules[option] = getattr(self, option)
        return rules

    def check(self) -> None:
        """RecipeError for a lower bound above its upper one (no row could be kept)."""
        for low, high in (
            ("min_prompt_len", "max_prompt_len"), ("min_output_len", "max_output_len"),
            ("min_total_len", "max_total_len"), ("min_accept_length", "max_accept_length"),
        ):  # fmt: skip
            lower, upper = getattr(self, low), getattr(self, high)
            if lower is not None and upper is not None and lower > upper:
                raise RecipeError(f"select.{low}", lower, f"expected at most select.{high} ({upper})")


@dataclass(frozen=True)
class SplitsConfig:
    """``splits``: the part of the source held out as the ``validation`` split, whole conversations
    chosen by a seeded hash of their source id (:mod:`eagle3_raw.splits`); the rest is ``train``.
    Part of the fingerprint when set (the splits are the set's content); absent, the recipe is as
    before."""

    validation: float | int | None = field(
        default=None,
        metadata=custom(
            values.validation_share,
            "a fraction between 0 and 1 (e.g. 0.05), or a count of conversations >= 1",
            help="A fraction (recommended: a conversation's split never changes as the source grows) "
            "or a count (the conversations with the lowest keys: exact, but a growing source can move "
            "some back to train).",
        ),
    )
    seed: int = field(default=0, metadata=integer(minimum=0, help="Seed of the hash that assigns them."))

    @property
    def rule(self) -> SplitRule | None:
        """The split rule, or None when nothing is held out."""
        if self.validation is None:
            return None
        if isinstance(self.validation, float):
            return SplitRule(fraction=self.validation, seed=self.seed)
        return SplitRule(count=self.validation, seed=self.seed)

    def check(self) -> None:
        """RecipeError for a seed without a share to hold out."""
        if self.validation is None and self.seed != 0:
            raise RecipeError(
                "splits.validation", None,
                "required with splits.seed: a fraction (e.g. 0.05) or a count of conversations",
            )  # fmt: skip


@dataclass(frozen=True)
class Recipe:
    """A parsed, validated recipe. ``base_dir`` is where relative paths resolve."""

    name: str = field(metadata=text(check=values.check_name))
    prompts: PromptsConfig = field(metadata=section(PromptsConfig))
    model: ModelConfig = field(metadata=section(ModelConfig, required=False))
    server: ServerConfig = field(metadata=section(ServerConfig, required=False))
    sampling: SamplingConfig = field(metadata=section(SamplingConfig))
    turns: Turns = field(default="last", metadata=choice(get_args(Turns)))
    on_truncation: OnTruncation = field(default="keep", metadata=choice(get_args(OnTruncation)))
    license: str | None = field(default=None, metadata=text("a string such as apache-2.0"))
    description: str | None = field(default=None, metadata=text())
    export: ExportConfig = field(default_factory=ExportConfig, metadata=section(ExportConfig, required=False))
    rollout: RolloutConfig = field(
        default_factory=RolloutConfig, metadata=custom(values.rollout_section, section=RolloutConfig)
    )
    select: SelectConfig = field(default_factory=SelectConfig, metadata=section(SelectConfig, required=False))
    splits: SplitsConfig = field(default_factory=SplitsConfig, metadata=section(SplitsConfig, required=False))
    base_dir: Path = field(default_factory=Path.cwd, compare=False)

    def resolve_path(self, value: str) -> Path:
        """``value`` as a path, relative to the recipe file's folder unless absolute."""
        path = Path(value).expanduser()
        return path if path.is_absolute() else self.base_dir / path

    @functools.cached_property
    def fingerprint(self) -> str:
        """16 hex digits identifying the data this recipe produces
        (:func:`eagle3_raw.recipe.fingerprint.fingerprint_payload`)."""
        return fingerprint(self)

    def to_dict(self) -> dict[str, Any]:
        """The recipe as YAML-ready data, defaults included (round-trips through ``parse_recipe``)."""
        return recipe_to_dict(self)

    def to_yaml(self) -> str:
        """:meth:`to_dict` as YAML, in field order."""
        return yaml.safe_dump(self.to_dict(), sort_keys=False, allow_unicode=True)

    def check(self) -> None:
        """The bounds (:mod:`eagle3_raw.limits`: numeric maxima, the local files' sizes before any
        of them is read, the reference server's flags), and remote code only pinned to a commit."""
        check_numbers(self)
        check_launch_args(self.server.launch_args)
        check_local_files(self)
        self._check_remote_code()
        self._check_engine()

    def _check_engine(self) -> None:
        """RecipeError for an engine the launched server is not, and for what the named engine
        cannot do (:func:`~eagle3_raw.recipe.engines.check_for_engine`)."""
        server = self.server
        launched = LAUNCH_ENGINES.get(server.launch or "")
        if server.engine is not None and launched is not None and server.engine != launched:
            problem = f"server.launch: {server.launch} starts {launched}: leave server.engine out"
            raise RecipeError("server.engine", server.engine, problem)
        if server.engine_name is not None:
            check_for_engine(self, server.engine_name)

    def _check_remote_code(self) -> None:
        """Code a tokenizer brings from the Hub runs only pinned to a commit (a local folder's code
        is in the fingerprint by content)."""
        m = self.model
        if not m.trust_remote_code or tokenizer_path(self) is not None:
            return
        if m.revision is None or not _COMMIT.fullmatch(m.revision):
            raise RecipeError(
                "model.revision", m.revision,
                "trust_remote_code runs the tokenizer repo's own code: pin model.revision to a commit "
                "(40 hex digits), so the code that renders the prompts is the code the fingerprint names",
            )  # fmt: skip
