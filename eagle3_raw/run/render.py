"""Rendering: conversations -> prompt token ids, as the deployed server's chat API would make them.

A prompt is what SGLang's chat path makes of a chat request (``sglang-protocol.md`` §14): the
conversation before a generation point, as a chat client would send it (messages with their content
parts, names and tool calls, the row's tools, ``model.chat_template_kwargs`` and
``model.reasoning_effort``). The server renders it (``/tokenize`` with ``messages``: the default
wherever the server can), or :class:`Renderer` runs the same path here (:mod:`eagle3_raw.sglang.chatpath`:
SGLang 0.5.23's normalization, template call and encoding, tested against SGLang's own code) for
servers that cannot render, checked against the server on real conversations when it can.

Generation points (``turns``): ``last`` is the final assistant message when the conversation ends
with one (its prompt is the messages before it), else the end of the conversation. ``all`` is every
assistant message, plus the end when the conversation does not end with an assistant message;
``rollout`` has the points of ``all``, each prompted with the target's own earlier turns
(:mod:`eagle3_raw.run.rollout`).
``PromptTurn.turn`` is the point's index in the message list. A point with no message before it is
not a generation point; whether any other history is acceptable is the chat path's call: when it
refuses, the conversation is a :class:`~eagle3_raw.errors.PromptFormatError`.

Templates that print today's date (``strftime_now``) are refused unless ``model.render_date`` pins
the date they print; they then render here with that date, so a rebuild renders the same prompt.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from eagle3_raw.errors import PromptFormatError, RecipeError
from eagle3_raw.hub_reach import hub_local_files_only
from eagle3_raw.limits import TEMPLATE_BYTES, check_regular_file
from eagle3_raw.recipe import Recipe, did_you_mean, is_hub_id, tokenizer_path
from eagle3_raw.run.template_limits import compile_bounded, guard_templates
from eagle3_raw.sglang.chatpath import (
    ChatRequestError,
    read_template_file,
    render_prompt_ids,
    resolve_template,
)
from eagle3_raw.source.prompts import Conversation
from eagle3_raw.vllm import chatpath as vllm_chatpath

if TYPE_CHECKING:
    import jinja2
    from transformers import PreTrainedTokenizerBase

    from eagle3_raw.run.mixture import Choice


@dataclass(frozen=True)
class PromptTurn:
    """The prompt of one generation point: ``prompt_ids`` exactly as they will be sent."""

    index: int
    source_id: str
    turn: int
    prompt_ids: list[int]


class Renderer:
    """Renders conversations as the engine's chat path does (SGLang's, or vLLM's with ``engine``
    ``vllm``), with the recipe's tokenizer and template.

    Loading raises :class:`RecipeError` (on ``model.tokenizer``, ``model.chat_template``,
    ``model.chat_template_kwargs`` or ``model.render_date``) when the tokenizer cannot be loaded, the
    template override cannot be read, no chat template is available, the template has a Jinja syntax
    error (every row would fail), a keyword collides with what the chat path passes itself or is one
    the template never reads (a typo would silently give the template's default), or the template
    prints today's date and no ``render_date`` pins it.
    """

    def __init__(self, recipe: Recipe, engine: str = "sglang") -> None:
        self._engine = engine
        self._model = recipe.model
        self._turns = recipe.turns
        self._local = tokenizer_path(recipe)
        self._tokenizer = load_tokenizer(recipe)
        if recipe.model.chat_template is not None:
            self._tokenizer.chat_template = read_template(recipe)
        if self._tokenizer.chat_template is None:
            raise RecipeError("model.chat_template", None, "the tokenizer has no chat template; give a file")
        where = recipe.model.chat_template or f"the chat template of {recipe.model.tokenizer}"
        # compiled only within the bounds (template_limits), also for this check: a stranger's
        # template never reaches transformers' own compilation, which folds constants unchecked
        read = template_variables(self._tokenizer.chat_template, where)

        guard_templates(self._tokenizer.chat_template)  # every rendering within bounds
        self._template = resolve_template(self._tokenizer)
        self._kwargs = checked_kwargs(recipe.model.chat_template_kwargs)
        check_kwargs_are_read(read, self._kwargs, ignore=self._tokenizer.special_tokens_map)
        for i, component in enumerate(recipe.sampling.mixture):
            where = f"sampling.mixture[{i}].chat_template_kwargs"
            kwargs = checked_kwargs(component.chat_template_kwargs, where)
            check_kwargs_are_read(read, kwargs, ignore=self._tokenizer.special_tokens_map, where=where)
        dated = check_date(self._template, recipe.model.render_date)
        self._date = dated is not None
        if dated is not None:
            guard_templates(dated)
            self._template = dated

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        """The Hugging Face tokenizer (with the template override applied, if any)."""
        return self._tokenizer

    @property
    def vocab_size(self) -> int:
        """Every id the tokenizer knows, added tokens included (``len(tokenizer)``)."""
        return len(self._tokenizer)

    @property
    def prints_date(self) -> bool:
        """Whether the template prints today's date (then rendered here, with ``render_date``)."""
        return self._date

    @functools.cached_property
    def eos_token_ids(self) -> frozenset[int]:
        """The tokenizer's EOS id and those of the model's ``generation_config.json``/``config.json``."""
        ids = {self._tokenizer.eos_token_id} if self._tokenizer.eos_token_id is not None else set()
        for name in ("generation_config.json", "config.json"):
            ids |= _eos_ids_in(self._model_file(name))
        return frozenset(ids)

    def render(
        self, conv: Conversation, only: Container[int] | None = None, choice: Choice | None = None
    ) -> list[PromptTurn]:
        """One :class:`PromptTurn` per generation point (those in ``only``, if given), in message order,
        for a conversation drawn mixture component ``choice``.

        Raises :class:`PromptFormatError` when the chat path refuses the conversation or it has no
        generation point (a single assistant message).
        """
        points = generation_points(conv.messages, self._turns)
        if not points:
            message = f"row {conv.source_id!r}: nothing to generate (no message before the assistant turn)"
            raise PromptFormatError(message, row_id=conv.source_id, index=conv.index)
        wanted = [p for p in points if only is None or p in only]
        return [
            PromptTurn(conv.index, conv.source_id, p, self.prompt_ids(conv, p, choice=choice)) for p in wanted
        ]

    def chat_request(
        self, conv: Conversation, turn: int, *, choice: Choice | None = None,
        history: Sequence[Mapping[str, Any]] | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """The ``/tokenize`` body of generation point ``turn``: the chat request a client would send
        (``messages``, and ``tools``, ``chat_template_kwargs``, ``reasoning_effort`` when set).

        ``choice``: the conversation's mixture component (its keywords over the model's);
        ``history``: the messages sent (a rollout's own turns) instead of the source's before ``turn``.
        """
        messages = conv.messages[:turn] if history is None else history
        body: dict[str, Any] = {"messages": [dict(m) for m in messages]}
        if conv.tools:
            body["tools"] = [dict(t) for t in conv.tools]
        kwargs = {**self._kwargs, **(choice.component.chat_template_kwargs if choice is not None else {})}
        if kwargs:
            body["chat_template_kwargs"] = kwargs
        effort = self._model.reasoning_effort
        if choice is not None and choice.component.reasoning_effort is not None:
            effort = choice.component.reasoning_effort
        if effort is not None:
            body["reasoning_effort"] = effort
        return body

    def prompt_ids(
        self, conv: Conversation, turn: int, *, choice: Choice | None = None,
        history: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[int]:  # fmt: skip
        """The prompt ids of generation point ``turn`` (see :meth:`chat_request`), as the server's
        chat path would make them (SGLang's, or vLLM's for a vLLM target)."""
        body = self.chat_request(conv, turn, choice=choice, history=history)
        kwargs = body.get("chat_template_kwargs")
        try:
            if self._engine == "vllm":
                return vllm_chatpath.render_prompt_ids(
                    self._tokenizer, body["messages"], body.get("tools"), chat_template=self._template,
                    chat_template_kwargs=kwargs,
                )  # fmt: skip
            return render_prompt_ids(
                self._tokenizer, body["messages"], body.get("tools"), chat_template=self._template,
                chat_template_kwargs=kwargs, reasoning_effort=body.get("reasoning_effort"),
            )  # fmt: skip
        except ChatRequestError as exc:
            message = f"row {conv.source_id!r} turn {turn}: the chat path refused it ({exc})"
            raise PromptFormatError(message, row_id=conv.source_id, index=conv.index) from exc

    def encode(self, text: str) -> list[int]:
        """``text`` as ids, no special tokens added (``verbose=False``: no warning for long texts)."""
        return list(self._tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])

    def identity(self) -> dict[str, str]:
        """What the prompt ids depend on, for the manifest and the dataset card."""
        return {
            "tokenizer": self._model.tokenizer,
            "tokenizer_revision": self._model.revision or "",
            "name_or_path": str(self._tokenizer.name_or_path),
            "tokenizer_sha256": self._tokenizer_digest(),
            "chat_template_sha256": template_digest(self._tokenizer.chat_template),
            "chat_template_kwargs": orjson.dumps(dict(self._kwargs), option=orjson.OPT_SORT_KEYS).decode(),
            "vocab_size": str(self.vocab_size),
        }

    def _tokenizer_digest(self) -> str:
        """sha256 of ``tokenizer.json``, else of the vocabulary files (names and bytes), else ""."""
        single = self._model_file("tokenizer.json")
        if single is not None:
            return _file_digest([single], names=False)
        names = sorted(set(getattr(self._tokenizer, "vocab_files_names", {}).values()))
        files = [f for f in map(self._model_file, names) if f is not None]
        return _file_digest(files, names=True) if files else ""

    def _model_file(self, name: str) -> Path | None:
        """A file of the tokenizer's folder or Hub repo (None when it has none or it cannot be fetched)."""
        if self._local is not None:
            path = self._local / name
            return path if path.is_file() else None
        from huggingface_hub import hf_hub_download

        try:
            cached = hub_local_files_only("model.tokenizer", self._model.tokenizer, self._model.revision)
            return Path(
                hf_hub_download(
                    self._model.tokenizer, name, revision=self._model.revision, local_files_only=cached
                )
            )
        except Exception:  # best effort: a missing optional file is not an error
            return None


def generation_points(messages: Sequence[Mapping[str, Any]], turns: str) -> list[int]:
    """Indexes in ``messages`` where the model generates (see the module docs), in order."""
    assistants = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    ends_with_assistant = bool(assistants) and assistants[-1] == len(messages) - 1
    if turns == "last":
        points = [assistants[-1]] if ends_with_assistant else [len(messages)]
    else:  # all, rollout (where the source's assistant turns are the points the target replaces)
        points = assistants if ends_with_assistant else [*assistants, len(messages)]
    return [p for p in points if p > 0]


def load_tokenizer(recipe: Recipe) -> PreTrainedTokenizerBase:
    """The recipe's tokenizer: its local folder, or a Hub id at ``model.revision``."""
    from transformers import AutoTokenizer

    local = tokenizer_path(recipe)
    source = str(local) if local is not None else recipe.model.tokenizer
    cached = local is None and hub_local_files_only("model.tokenizer", source, recipe.model.revision)
    try:
        return AutoTokenizer.from_pretrained(
            source,
            revision=recipe.model.revision,
            trust_remote_code=recipe.model.trust_remote_code,
            local_files_only=cached,
        )
    except Exception as exc:  # transformers raises many kinds (OSError, ValueError, HTTP errors)
        raise RecipeError(
            "model.tokenizer", recipe.model.tokenizer, _load_problem(recipe, local, exc)
        ) from exc


def _load_problem(recipe: Recipe, local: Path | None, exc: Exception) -> str:
    """Why the tokenizer did not load, saying whether it was tried as a local folder or a Hub id."""
    cause = " ".join(f"{type(exc).__name__}: {exc}".split())[:400]
    if local is not None:
        return f"could not load a tokenizer from the folder {local} ({cause})"
    missing = recipe.resolve_path(recipe.model.tokenizer)
    if not is_hub_id(recipe.model.tokenizer):  # load_recipe refuses these first; a Recipe built by hand
        return f"no tokenizer folder: {missing} does not exist (and it is not a Hub model id)"
    return f"no local folder {missing}, and loading it as a Hub model id failed ({cause})"


def read_template(recipe: Recipe) -> str:
    """The ``model.chat_template`` override file, read as SGLang reads ``--chat-template``: leading
    and trailing newlines stripped, every two-character ``\\n`` made a newline."""
    assert recipe.model.chat_template is not None
    path = recipe.resolve_path(recipe.model.chat_template)
    if path.exists():  # not /dev/zero, not 10 GB (a missing file is reported below)
        check_regular_file("model.chat_template", path, TEMPLATE_BYTES)
    try:
        return read_template_file(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise RecipeError(
            "model.chat_template", str(path), f"expected a readable Jinja file ({exc})"
        ) from exc


#: What the chat path passes ``apply_chat_template`` itself (a template kwarg of that name would clash).
CHAT_PATH_KEYWORDS = frozenset(
    {"messages", "conversation", "tools", "documents", "tokenize", "add_generation_prompt", "return_dict",
     "chat_template", "continue_final_message", "strftime_now"}
)  # fmt: skip


def checked_kwargs(kwargs: Mapping[str, Any], where: str = "model.chat_template_kwargs") -> dict[str, Any]:
    """``chat_template_kwargs`` (the recipe field ``where``), refused if one would collide with what
    the chat path passes itself. Keywords a tokenizer's own ``apply_chat_template`` declares (Kimi's
    ``thinking``) are fine: SGLang passes them through too."""
    clashes = sorted(CHAT_PATH_KEYWORDS.intersection(kwargs))
    if clashes:
        raise RecipeError(where, dict(kwargs), f"{', '.join(clashes)}: set by the chat path itself")
    return dict(kwargs)


def check_date(template: str | None, render_date: str | None) -> str | None:
    """None for a template that prints no date; for one that calls ``strftime_now``, the template
    with a macro of that name in front that prints ``render_date`` (at noon) instead of today (a
    name the template defines comes before the environment's global); RecipeError when no date is
    pinned."""
    if template is None or not prints_date(template):
        if render_date is not None:
            raise RecipeError("model.render_date", render_date, "the chat template prints no date: drop it")
        return None
    if render_date is None:
        import datetime

        today = datetime.date.today().isoformat()
        raise RecipeError(
            "model.render_date", None,
            "the chat template prints today's date (strftime_now), so its prompts would change with the day "
            f"of the build under one set identity: pin it, e.g. render_date: {today} (the prompts then "
            "render here, with that date)",
        )  # fmt: skip
    import datetime

    pinned = datetime.datetime.combine(datetime.date.fromisoformat(render_date), datetime.time(12))
    directives = "aAbBcdHIjmMpSUwWyYZ"  # every strftime directive a chat template could ask for, "%%" last
    replaced = "".join(f" | replace('%{d}', '{pinned.strftime('%' + d)}')" for d in directives)
    macro = f"{{%- macro strftime_now(fmt) -%}}{{{{ fmt{replaced} | replace('%%', '%') }}}}{{%- endmacro -%}}"
    return macro + template


def template_source(recipe: Recipe) -> str | None:
    """The chat template the recipe renders with, read without loading the tokenizer (the override
    file, else the tokenizer folder's or Hub repo's ``tokenizer_config.json`` / ``chat_template.jinja``),
    or None when it cannot be read this way."""
    if recipe.model.chat_template is not None:
        return read_template(recipe)
    jinja = _tokenizer_file(recipe, "chat_template.jinja")
    if jinja is not None:
        return jinja.read_text(encoding="utf-8")
    config = _tokenizer_file(recipe, "tokenizer_config.json")
    try:
        template = orjson.loads(config.read_bytes()).get("chat_template") if config else None
    except (OSError, orjson.JSONDecodeError, AttributeError):
        return None
    if isinstance(template, list):  # named templates: SGLang renders with the first
        template = next((t.get("template") for t in template if isinstance(t, dict)), None)
    return template if isinstance(template, str) else None


def _tokenizer_file(recipe: Recipe, name: str) -> Path | None:
    local = tokenizer_path(recipe)
    if local is not None:
        return local / name if (local / name).is_file() else None
    from huggingface_hub import hf_hub_download

    try:
        cached = hub_local_files_only("model.tokenizer", recipe.model.tokenizer, recipe.model.revision)
        return Path(
            hf_hub_download(
                recipe.model.tokenizer, name, revision=recipe.model.revision, local_files_only=cached
            )
        )
    except Exception:  # best effort: the tokenizer load reports real problems
        return None


def prints_date(template: str) -> bool:
    """Whether the template calls ``strftime_now`` (transformers' today's-date global)."""
    import jinja2.nodes

    try:
        ast = _compile(template).environment.parse(template)
    except Exception:  # a syntax error is reported by template_variables
        return "strftime_now" in template
    return any(
        isinstance(call.node, jinja2.nodes.Name) and call.node.name == "strftime_now"
        for call in ast.find_all(jinja2.nodes.Call)
    )


def template_variables(template: str | Mapping[str, str], where: str) -> frozenset[str]:
    """Compile the chat template(s) as transformers does for rendering, and return every name they
    read from their context (``messages``, ``tools``, special tokens, the keywords they look at):
    ``jinja2.meta.find_undeclared_variables`` over each template's AST, the environment's globals
    (``raise_exception``, ``strftime_now``, ...) left out.

    RecipeError (``model.chat_template``, naming ``where`` and the line) on a Jinja syntax error,
    which would otherwise fail every row one by one.
    """
    import jinja2
    import jinja2.meta

    named = template.items() if isinstance(template, Mapping) else [("", template)]
    names: set[str] = set()
    for name, text in named:
        try:
            env = _compile(text).environment
            names |= jinja2.meta.find_undeclared_variables(env.parse(text)) - set(env.globals)
        except jinja2.TemplateSyntaxError as exc:
            label = f"{where} (template {name!r})" if name else where
            problem = f"Jinja syntax error at line {exc.lineno}: {exc.message}"
            raise RecipeError("model.chat_template", label, problem) from exc
    return frozenset(names)


def _compile(text: str) -> jinja2.Template:
    """What apply_chat_template renders with (its sandbox, extensions, globals), compiled within
    the bounds of :mod:`eagle3_raw.run.template_limits`."""
    return compile_bounded(text)


def check_kwargs_are_read(
    read: frozenset[str], kwargs: Mapping[str, Any], *, ignore: Container[str],
    where: str = "model.chat_template_kwargs",
) -> None:  # fmt: skip
    """RecipeError on ``model.chat_template_kwargs`` naming each keyword the template never reads
    (``enable_thinkin``), with a did-you-mean among the ones it does read (``read``, from
    :func:`template_variables`; names in ``ignore``, the special tokens, are not offered).
    transformers passes ``chat_template_kwargs`` to the template and reads none of them itself,
    so an unread keyword changes nothing: a typo would silently give the template's default."""
    unread = sorted(set(kwargs) - read)
    if not unread:
        return
    offered = sorted(name for name in read - _SET_BY_US if name not in ignore)
    hints = "".join(did_you_mean(name, offered) for name in unread)
    allowed = (
        f"the chat template never reads {', '.join(map(repr, unread))}{hints}; "
        f"the keywords it reads: {', '.join(offered) or 'none'}"
    )
    raise RecipeError(where, dict(kwargs), allowed)


_SET_BY_US = frozenset({"messages", "tools", "documents", "add_generation_prompt"})


def template_digest(template: str | Mapping[str, str] | None) -> str:
    """sha256 of the template text (of the canonical JSON of a tokenizer's named templates)."""
    if template is None:
        return ""
    data = (
        template.encode()
        if isinstance(template, str)
        else orjson.dumps(template, option=orjson.OPT_SORT_KEYS)
    )
    return hashlib.sha256(data).hexdigest()


def _file_digest(files: Sequence[Path], *, names: bool) -> str:
    digest = hashlib.sha256()
    for file in files:
        if names:
            digest.update(file.name.encode() + b"\0")
        digest.update(file.read_bytes())
    return digest.hexdigest()


def _eos_ids_in(path: Path | None) -> set[int]:
    if path is None:
        return set()
    try:
        value = orjson.loads(path.read_bytes()).get("eos_token_id")
    except (OSError, orjson.JSONDecodeError, AttributeError):
        return set()
    values = value if isinstance(value, list) else [value]
    return {v for v in values if isinstance(v, int) and not isinstance(v, bool)}
