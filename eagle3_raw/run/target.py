"""The target of a recipe: which model (and server configuration) its rows come from.

The set's config id covers the target (:func:`eagle3_raw.identity.set_config_id`), so it is found
before anything is built or read from the ``datasets`` cache (:func:`eagle3_raw.run.build.resolve_target`):

- ``server.launch: reference``: computed from the launch options, without starting the server;
- ``server.launch: sglang``: the journal's record of a whole set built with the same launch
  configuration, else asked from the server, started now and kept for the run
  (:mod:`eagle3_raw.launching.target`);
- otherwise asked from every endpoint (``/model_info``, ``/server_info``, ``/v1/models``); those
  that answer must serve the same model; the limits are the tightest among them;
- when no endpoint answers: the target of the latest set of this recipe in the journal, so a set
  built before can be loaded (or rebuilt from its journal) without its server. Rows still missing
  then need the server, and the run says so.

Who renders the prompts is part of the target (:func:`choose_render`): the server's chat path when
it can (``/tokenize`` with ``messages``; not with ``--skip-tokenizer-init``, behind a router without
``/tokenize``, or on an SGLang older than 0.5.23), else the same chat path run here, with a notice;
``model.render`` can ask for either. A template that prints today's date renders here, with
``model.render_date``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3_raw.engines import engine_named, identify
from eagle3_raw.errors import (
    ConnectError,
    Eagle3RawError,
    EndpointNotFound,
    RecipeError,
    RequestTimeout,
    ServerMismatch,
    ServerUnreachable,
)
from eagle3_raw.identity import Target
from eagle3_raw.journal.manifest import read_manifest
from eagle3_raw.journal.roots import check_root
from eagle3_raw.recipe.engines import check_for_engine
from eagle3_raw.redact import public_url
from eagle3_raw.reference.identity import reported_identity
from eagle3_raw.run.render import check_date, prints_date, template_source
from eagle3_raw.run.retry import backoff
from eagle3_raw.run.shards import whole_count
from eagle3_raw.serving import ServerIdentity
from eagle3_raw.sglang.client import RENDERER_KEYS, identity_from
from eagle3_raw.sglang.model import TARGET_KEYS
from eagle3_raw.transport import new_session

if TYPE_CHECKING:
    from eagle3_raw.recipe import Recipe

log = logging.getLogger("eagle3_raw")


def target_of(identities: Sequence[ServerIdentity], origin: str = "server") -> Target:
    """The target of servers that answered (the first's model and rendering facts; the tightest
    limits), prompts rendered by the server until :func:`choose_render` says otherwise."""
    check_same_model(identities)
    first = identities[0]
    budgets = [i.token_budget for i in identities if i.token_budget is not None]
    inputs = [i.input_limit for i in identities if i.input_limit is not None]
    renderer = {key: first.server_info.get(key) for key in RENDERER_KEYS}
    model = {key: first.comparable()[key] for key in TARGET_KEYS}
    return Target(
        model, min(budgets, default=None), min(inputs, default=None), "server", renderer, origin,
        drafter=first.drafter, engine=first.engine,
    )  # fmt: skip


def check_same_model(identities: Sequence[ServerIdentity]) -> None:
    """ServerMismatch unless every endpoint serves the same model (name, path, weights, engine and
    its version) with the same drafter (or none): a set's acceptance figures are one drafter's."""
    first = identities[0]
    for other in identities[1:]:
        if other.comparable() != first.comparable():
            raise ServerMismatch(
                f"endpoints serve different models: {first.url} {first.comparable()} vs "
                f"{other.url} {other.comparable()}"
            )
        if other.drafter != first.drafter:
            raise ServerMismatch(
                f"endpoints run different drafters: {first.url} {first.drafter or 'none'} vs "
                f"{other.url} {other.drafter or 'none'} (a set's acceptance figures are one drafter's)"
            )


def reference_target(launch_args: Sequence[str]) -> Target:
    """The target of a reference server launched with ``launch_args`` (computed, not started)."""
    return target_of([reference_identity(launch_args)], "reference")


def reference_identity(launch_args: Sequence[str]) -> ServerIdentity:
    """What a reference server launched with ``launch_args`` will report (computed, not started)."""
    try:
        model_info, server_info, max_model_len = reported_identity(launch_args)
    except ValueError as exc:
        raise RecipeError("server.launch_args", list(launch_args), str(exc)) from exc
    return identity_from("reference", model_info, server_info, max_model_len)


def with_rollout_parsers(recipe: Recipe, target: Target, identity: ServerIdentity) -> Target:
    """For ``turns: rollout``: ``target`` with the parsers that split the target's turns, the
    recipe's ``rollout`` names or else those the server's chat API uses (``/server_info``)."""
    if recipe.turns != "rollout":
        return target
    reasoning = recipe.rollout.reasoning_parser or identity.reasoning_parser
    tools = recipe.rollout.tool_call_parser or identity.tool_call_parser
    return target.with_parsers(reasoning, tools)


async def ask_identities(
    recipe: Recipe, api_key: str | None, urls: Sequence[str]
) -> tuple[list[ServerIdentity], list[BaseException], str]:
    """The identities of the servers at ``urls`` that answer, the ServerUnreachable errors of those
    that do not (any other error is raised), and why the first cannot render chat requests ("" when
    it can)."""
    timeout, engine = recipe.server.connect_timeout, recipe.server.engine_name
    async with new_session(connect_timeout=timeout, api_key=api_key) as session:
        results = await asyncio.gather(
            *(identify(session, url, timeout, engine) for url in urls), return_exceptions=True
        )
        identities = [r for r in results if isinstance(r, ServerIdentity)]
        if identities:
            check_for_engine(recipe, identities[0].engine)  # an engine the recipe did not name
        cannot = await cannot_render(session, identities[0], timeout) if identities else ""
    errors = [r for r in results if isinstance(r, BaseException)]
    for error in errors:
        if not isinstance(error, ServerUnreachable):
            raise error
    return identities, errors, cannot


PROBE_CHAT = {"messages": [{"role": "user", "content": "Hello!"}]}
PROBE_ATTEMPTS = 4


async def cannot_render(session: Any, identity: ServerIdentity, timeout: float) -> str:
    """Why ``identity``'s server cannot render a chat request through ``/tokenize`` ("" when it can).

    A probe that gets no answer in time (or no connection) is tried again: a server's first chat
    render can be slow. ServerUnreachable after :data:`PROBE_ATTEMPTS`: no answer says nothing
    about what the server can render, so it never turns into local rendering. An answer that is an
    error (any status) says the server cannot render."""
    if identity.skips_tokenizer_init:
        return "it runs with --skip-tokenizer-init"
    last: RequestTimeout | ConnectError | None = None
    for attempt in range(PROBE_ATTEMPTS):
        if attempt:
            await asyncio.sleep(backoff(attempt))
        try:
            await engine_named(identity.engine).tokenize_chat(session, identity.url, PROBE_CHAT, timeout)
            return ""
        except EndpointNotFound:
            return "it has no /tokenize (a router that does not forward it?)"
        except (RequestTimeout, ConnectError) as exc:
            last = exc
        except Eagle3RawError as exc:  # an SGLang older than 0.5.23 refuses messages with a 400
            return f"/tokenize refuses a chat request ({exc})"
    where = f"{public_url(identity.url)}/tokenize"
    raise ServerUnreachable(f"{where} did not answer a chat request in {PROBE_ATTEMPTS} tries; last: {last}")


def choose_render(recipe: Recipe, target: Target, cannot: str) -> Target:
    """``target`` with who renders its prompts decided (see the module docstring); ``cannot``: why
    the server cannot render ("" when it can)."""
    mode, template = recipe.model.render, template_source(recipe)
    if template is not None and prints_date(template):
        check_date(template, recipe.model.render_date)  # refuses an unpinned date
        if mode == "server":
            problem = (
                "the chat template prints today's date: the server would print its own; use render: local"
            )
            raise RecipeError("model.render", mode, problem)
        log.warning("the chat template prints a date: prompts render here, with render_date %s",
                    recipe.model.render_date)  # fmt: skip
        return target.with_render("local")
    if mode == "local" or (mode == "auto" and cannot):
        if cannot:
            log.warning("the server cannot render chat requests (%s): prompts render here, with SGLang's "
                        "chat path", cannot)  # fmt: skip
        return target.with_render("local")
    if cannot:
        raise ServerMismatch(f"model.render is server, but the server cannot render chat requests: {cannot}")
    return target.with_render("server", target.renderer)


def recorded_target(recipe: Recipe, journal_root: Path) -> Target | None:
    """The target of this recipe's set in the journal (the same fingerprint if any, complete first,
    else the latest set of the same name), or None."""
    check_root(journal_root)  # another user's root is no record of ours
    candidates: list[tuple[tuple[bool, bool, str], dict[str, Any]]] = []
    for folder in sorted((journal_root / "sets").glob(f"{recipe.name}-*")):
        if folder.is_symlink():  # a journal makes no links: not followed
            continue
        try:
            manifest = read_manifest(folder)
        except Exception:  # an unreadable journal is not this lookup's business
            continue
        if manifest is None or manifest.get("name") != recipe.name:
            continue
        same = manifest.get("fingerprint") == recipe.fingerprint
        rank = (same, same and whole_count(folder) is not None, str(manifest.get("updated", "")))
        candidates.append((rank, manifest))
    if not candidates:
        return None
    return Target.from_dict(max(candidates, key=lambda c: c[0])[1]["target"])
