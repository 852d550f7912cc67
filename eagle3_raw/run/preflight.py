"""``eagle3-raw validate RECIPE``: every check of a recipe that needs no generation, one line each.

Local checks (nothing contacted): the recipe loads (with its ``--set`` overrides); the prompt source
opens and its first rows parse; the tokenizer and chat template load and take the template
keywords; every ``reasoning_effort`` is one the chat path allows; the first prompt renders here;
``turns: rollout`` over tool calls has a tool-call parser (when that is known here); the journal
root and the ``datasets`` cache can be written.

Server checks (unless ``--local``): every endpoint answers and serves one model (the target); its
tokenizer agrees with the recipe's; the first prompt renders through the server's chat path; the
recipe's sampling keys pass the server's own validation on one request with ``max_new_tokens`` 1
(one per mixture component). A ``launch: reference`` recipe starts its reference server for these
(seconds); ``launch: sglang`` and ``launch: vllm`` are checked locally only (starting a GPU
server is no check's price).

A build runs the local checks that would fail every row (:func:`check_before_launch`) before it
starts a server.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from eagle3_raw.credentials import server_api_key
from eagle3_raw.engines import engine_named, identify
from eagle3_raw.errors import Eagle3RawError, PromptFormatError, RecipeError, RequestRejected, SourceError
from eagle3_raw.journal import journal_root
from eagle3_raw.journal.roots import check_root
from eagle3_raw.launching.reference import recipe_endpoints
from eagle3_raw.outputs import check_writable, default_cache_dir, describe
from eagle3_raw.printable import printable
from eagle3_raw.recipe import load_recipe
from eagle3_raw.redact import public_url
from eagle3_raw.run.checks import ServerChecks, check_preferred_sampling
from eagle3_raw.run.plan import fit_max_new_tokens
from eagle3_raw.run.render import Renderer, generation_points
from eagle3_raw.run.runtime import run_sync
from eagle3_raw.run.target import (
    cannot_render,
    choose_render,
    reference_identity,
    target_of,
    with_rollout_parsers,
)
from eagle3_raw.serving import ENGINE_LABELS, Engine, ServerIdentity
from eagle3_raw.sglang.chatrequest import ChatRequestError, reasoning_effort_value
from eagle3_raw.source.prompts import Conversation, iter_conversations
from eagle3_raw.transport import new_session

if TYPE_CHECKING:
    import aiohttp

    from eagle3_raw.identity import Target
    from eagle3_raw.recipe import Recipe
    from eagle3_raw.run.render import Renderer
    from eagle3_raw.source.prompts import Conversation

FIRST_ROWS = 8
"""Source rows read and parsed by the prompt source check."""

Status = Literal["ok", "FAIL", "skip"]


@dataclass(frozen=True)
class Check:
    """The outcome of one check: ``ok`` (``text`` says what was found), ``FAIL`` (``text`` is the
    problem, naming the field) or ``skip`` (``text`` says why it was not made)."""

    name: str
    status: Status
    text: str

    def line(self) -> str:
        return printable(f"{self.status:<4}  {self.name:<9} {self.text}")


class _NotChecked(Exception):
    """A check that cannot be made here; its message says why."""


def validate(
    source: str | Path | Mapping[str, Any] | Recipe, overrides: Sequence[str] | Mapping[str, Any] = (), *,
    local: bool = False, journal_dir: Path | None = None, cache_dir: Path | None = None,
) -> Iterator[Check]:  # fmt: skip
    """The checks of the module docstring, in order, each as it is made. A recipe that does not
    load is one ``FAIL`` and nothing else (no other check has a recipe to check)."""
    try:
        recipe = load_recipe(source, overrides)
    except Eagle3RawError as exc:
        yield Check("recipe", "FAIL", str(exc))
        return
    yield Check("recipe", "ok", f"{recipe.name} (fingerprint {recipe.fingerprint[:12]})")
    checks = Validation(recipe, journal_dir=journal_dir, cache_dir=cache_dir)
    yield from checks.local()
    if local:
        yield Check("server", "skip", "not contacted (--local)")
    else:
        yield from checks.server()


def check_before_launch(recipe: Recipe) -> None:
    """Raise the first problem that would fail every row of ``recipe``'s build (the prompt source,
    ``reasoning_effort``, the tokenizer and template): called before a build starts a server."""
    checks = Validation(recipe)
    checks.prompts()
    checks.efforts()
    checks.template()


class Validation:
    """The checks of one loaded recipe; the local ones keep what the server ones use (the
    renderer, the first conversations)."""

    def __init__(self, recipe: Recipe, *, journal_dir: Path | None = None, cache_dir: Path | None = None):
        self.recipe = recipe
        self.journal_dir = journal_dir
        self.cache_dir = cache_dir
        self.conversations: list[Conversation] = []
        self.renderer: Renderer | None = None

    def local(self) -> Iterator[Check]:
        """The local checks (see the module docstring)."""
        yield _made("prompts", self.prompts)
        yield _made("effort", self.efforts)
        yield _made("template", self.template)
        yield _made("render", self.render_here)
        yield _made("parsers", self.parsers_here)
        yield _made("journal", self.journal)
        yield _made("cache", self.cache)

    def prompts(self) -> str:
        """The source opens and at least one of its first rows parses (SourceError otherwise)."""
        source = self.recipe.prompts.source
        rows = list(itertools.islice(iter_conversations(self.recipe), FIRST_ROWS))
        self.conversations = [r for r in rows if isinstance(r, Conversation)]
        bad = [r for r in rows if isinstance(r, PromptFormatError)]
        if not self.conversations:
            first = f"none of its first {len(rows)} rows is usable: {bad[0]}"
            raise SourceError(f"prompt source {source}: {first}")
        found = f"prompts.source {source}: the first {len(rows)} rows parse"
        if bad:
            found = f"prompts.source {source}: {len(self.conversations)} of the first {len(rows)} rows parse"
            found += f" (a build skips the others; the first: {bad[0]})"
        return found

    def efforts(self) -> str:
        """Every ``reasoning_effort`` of the recipe is one SGLang's chat path allows (RecipeError)."""
        given = [("model.reasoning_effort", self.recipe.model.reasoning_effort)] + [
            (f"sampling.mixture[{i}].reasoning_effort", c.reasoning_effort)
            for i, c in enumerate(self.recipe.sampling.mixture)
        ]
        for field, effort in given:
            try:
                reasoning_effort_value(effort)
            except ChatRequestError as exc:
                raise RecipeError(field, effort, str(exc).removeprefix("1 validation error: ")) from exc
        values = [repr(effort) for _, effort in given if effort is not None]
        return f"reasoning_effort {', '.join(values)}" if values else "no reasoning_effort set"

    def template(self) -> str:
        """The tokenizer and chat template load and take the template keywords (RecipeError)."""
        self.renderer = Renderer(self.recipe, self.recipe.server.engine_name or "sglang")
        kwargs = dict(self.recipe.model.chat_template_kwargs)
        taken = f"; chat_template_kwargs {kwargs}" if kwargs else ""
        return f"model.tokenizer {self.recipe.model.tokenizer}: {self.renderer.vocab_size:,} ids{taken}"

    def render_here(self) -> str:
        """The first prompt renders through the chat path run here (a PromptFormatError otherwise)."""
        conv, turn = self._first_point()
        assert self.renderer is not None
        ids = self.renderer.prompt_ids(conv, turn)
        return f"row {conv.source_id!r} turn {turn} renders here: {len(ids):,} prompt ids"

    def parsers_here(self) -> str:
        """``turns: rollout`` over tool calls has a tool-call parser, when that is known without a
        server (the recipe names one, or the reference server it launches reports one)."""
        if not self._needs_tool_parser():
            return "no tool-call parser needed"
        named = self.recipe.rollout.tool_call_parser
        if named:
            return f"rollout.tool_call_parser {named}"
        if self.recipe.server.launch != "reference":
            raise _NotChecked("the server's /server_info names the tool-call parser (a server check)")

        reported = reference_identity(self.recipe.server.launch_args).tool_call_parser
        return _parser_found(reported, "the reference server")

    def journal(self) -> str:
        """The journal root is this user's and can be written (JournalError, OutputError)."""
        root = self.journal_dir or journal_root()
        check_root(root)
        check_writable(root, "journal folder")
        return f"{root} is writable"

    def cache(self) -> str:
        """The ``datasets`` cache can be written (OutputError)."""
        cache = self.cache_dir or default_cache_dir()
        check_writable(cache, "datasets cache")
        return f"{cache} is writable"

    def server(self) -> Iterator[Check]:
        """The server checks (see the module docstring), against the recipe's endpoints or the
        reference server it launches (started for them, stopped after)."""
        launch = self.recipe.server.launch
        if launch in ("sglang", "vllm"):
            label = ENGINE_LABELS[launch]
            yield Check("server", "skip", f"server.launch is {launch}: validate starts no {label} server "
                        "(point server.endpoints at a running one to check it)")  # fmt: skip
            return

        try:
            with recipe_endpoints(self.recipe, _key(self.recipe)) as urls:
                checks = run_sync(lambda: self._server_checks(urls))
        except Eagle3RawError as exc:  # the reference server did not start
            checks = [Check("server", "FAIL", str(exc))]
        yield from checks

    async def _server_checks(self, urls: Sequence[str]) -> list[Check]:
        server = self.recipe.server
        async with new_session(connect_timeout=server.connect_timeout, api_key=_key(self.recipe)) as s:
            checks, identities = await _identities(s, urls, server.connect_timeout, server.engine_name)
            if not identities:
                return checks
            try:
                target = await self._target(s, identities)
            except Eagle3RawError as exc:
                return [*checks, Check("target", "FAIL", str(exc))]
            checks.append(Check("target", "ok", target.describe()))
            url, ids = identities[0].url, list[int]()
            checks.append(await _made_async("tokenizer", self._tokenizers(s, target, identities)))
            checks.append(await _made_async("render", self._render(s, target, url, ids)))
            engine = engine_named(target.engine)
            for component in [None, *range(len(self.recipe.sampling.mixture))]:
                checks.append(await _made_async("sampling", self._sampling(s, engine, url, ids, component)))
            if self._needs_tool_parser() and not self._parser_known_here():
                checks.append(_made("parsers", lambda: self._parsers(target)))
        return checks

    async def _target(self, session: aiohttp.ClientSession, identities: list[ServerIdentity]) -> Target:
        target = target_of(identities)  # one model on every endpoint, else ServerMismatch
        cannot = await cannot_render(session, identities[0], self.recipe.server.connect_timeout)
        target = with_rollout_parsers(self.recipe, choose_render(self.recipe, target, cannot), identities[0])
        for identity in identities:
            check_preferred_sampling(identity, self.recipe.sampling.request_params())
        return target

    async def _tokenizers(
        self, session: aiohttp.ClientSession, target: Target, identities: list[ServerIdentity]
    ) -> str:
        if self.renderer is None:
            raise _NotChecked("the recipe's tokenizer did not load")
        checks = ServerChecks(self.recipe, self.renderer, session, target)
        await checks.check_tokenizers(identities)
        return f"{len(identities)} endpoint(s) tokenize like model.tokenizer {self.recipe.model.tokenizer}"

    async def _render(self, session: aiohttp.ClientSession, target: Target, url: str, ids: list[int]) -> str:
        """The first prompt through the chat path that renders the set's prompts; its ids into ``ids``."""
        conv, turn = self._first_point()
        assert self.renderer is not None
        if target.render == "local":
            ids += await asyncio.to_thread(self.renderer.prompt_ids, conv, turn)
            return f"row {conv.source_id!r} turn {turn} renders here (model.render local): {len(ids):,} ids"
        body = self.renderer.chat_request(conv, turn)
        try:
            engine = engine_named(target.engine)
            ids += await engine.tokenize_chat(session, url, body, self.recipe.server.request_timeout)
        except RequestRejected as exc:
            key = _named_field(str(exc), {k: k for k in ("reasoning_effort", "chat_template_kwargs")})
            problem = f"the server's chat path refuses row {conv.source_id!r} turn {turn}: {exc}"
            raise RecipeError(f"model.{key}" if key else "model", body.get(key), problem) from exc
        return f"row {conv.source_id!r} turn {turn} renders through the server's chat path: {len(ids):,} ids"

    async def _sampling(
        self, session: aiohttp.ClientSession, engine: Engine, url: str, ids: list[int], component: int | None
    ) -> str:
        """One ``/generate`` of ``ids`` with the recipe's sampling params (``component``'s over
        them) and ``max_new_tokens`` 1; RecipeError naming the key the server refuses."""
        if not ids:
            raise _NotChecked("no prompt rendered to send")
        assert self.renderer is not None
        sampling = self.recipe.sampling
        params = sampling.request_params(sampling.mixture[component] if component is not None else None)
        params = fit_max_new_tokens({**params, "sampling_seed": sampling.seed}, len(ids), len(ids) + 1)
        where = "sampling" if component is None else f"sampling.mixture[{component}]"
        try:
            await engine.generate(
                session, url, rid=f"eagle3-raw-validate-{uuid.uuid4().hex}", input_ids=ids,
                sampling_params=params, vocab_size=self.renderer.vocab_size,
                timeout=self.recipe.server.request_timeout,
            )  # fmt: skip
        except RequestRejected as exc:
            key = _named_field(str(exc), {k: k for k in sorted(params, key=len, reverse=True)})
            field = f"{where}.{key}" if key else where
            value = params.get(key) if key else None
            raise RecipeError(field, value, f"the server refuses it: {exc}") from exc
        return f"{where}: the server accepts the keys on one request (max_new_tokens 1)"

    def _parsers(self, target: Target) -> str:
        where = "vLLM (it never reports it)" if target.engine == "vllm" else "the server's /server_info"
        return _parser_found(target.parsers.get("tool_call_parser"), where)

    def _parser_known_here(self) -> bool:
        return bool(self.recipe.rollout.tool_call_parser) or self.recipe.server.launch == "reference"

    def _needs_tool_parser(self) -> bool:
        """``turns: rollout`` and the first rows answer tool calls (a rollout then needs the
        target's calls read from its text)."""
        if self.recipe.turns != "rollout":
            return False
        return any(m.get("tool_calls") for c in self.conversations for m in c.messages)

    def _first_point(self) -> tuple[Conversation, int]:
        if self.renderer is None or not self.conversations:
            raise _NotChecked("needs the prompt source and the template checks to pass")
        for conv in self.conversations:
            points = generation_points(conv.messages, self.recipe.turns)
            if points:
                return conv, points[0]
        raise _NotChecked("none of the first rows has a turn to generate")


def _made(name: str, check: Callable[[], str]) -> Check:
    try:
        return Check(name, "ok", check())
    except _NotChecked as exc:
        return Check(name, "skip", str(exc))
    except Eagle3RawError as exc:
        return Check(name, "FAIL", str(exc))
    except OSError as exc:
        return Check(name, "FAIL", describe(exc) + (f" ({exc.filename})" if exc.filename else ""))


async def _made_async(name: str, check: Awaitable[str]) -> Check:
    try:
        return Check(name, "ok", await check)
    except _NotChecked as exc:
        return Check(name, "skip", str(exc))
    except Eagle3RawError as exc:
        return Check(name, "FAIL", str(exc))


async def _identities(
    session: aiohttp.ClientSession, urls: Sequence[str], timeout: float, engine: str | None
) -> tuple[list[Check], list[ServerIdentity]]:
    """One check per endpoint (it answers as an ``engine`` server, None: either), and the
    identities of those that do."""
    results = await asyncio.gather(*(identify(session, u, timeout, engine) for u in urls),
                                   return_exceptions=True)  # fmt: skip
    checks, identities = [], []
    for url, result in zip(urls, results, strict=True):
        if isinstance(result, ServerIdentity):
            identities.append(result)
            checks.append(
                Check("endpoint", "ok", f"{public_url(url)} ({result.label}) serves {result.model_path}")
            )
        elif isinstance(result, Eagle3RawError):
            checks.append(Check("endpoint", "FAIL", f"{public_url(url)}: {result}"))
        elif isinstance(result, BaseException):
            raise result
    return checks, identities


def _parser_found(name: Any, where: str) -> str:
    if isinstance(name, str) and name:
        return f"tool-call parser {name} ({where})"
    raise RecipeError(
        "rollout.tool_call_parser", None,
        f"turns is rollout and the source's assistant turns call tools, but {where} reports no tool-call "
        "parser: every rollout would end no_tool_call; set rollout.tool_call_parser or start the server "
        "with --tool-call-parser NAME (vLLM reports none: name the one it runs in rollout.tool_call_parser)",
    )  # fmt: skip


def _named_field(message: str, fields: Mapping[str, str]) -> str:
    """The field of the first key of ``fields`` that ``message`` mentions ("" when none)."""
    return next((field for key, field in fields.items() if key in message), "")


def _key(recipe: Recipe) -> str | None:
    return server_api_key(recipe)
