"""The target of a recipe: which model (and server configuration) its rows come from.

The set's config id covers the target (:func:`eagle3_raw.identity.set_config_id`), so it is found
before anything is built or read from the ``datasets`` cache (:func:`resolve_target`):

- ``server.launch: reference``: computed from the launch options, without starting the server;
- ``server.launch: sglang``: the journal's record of a whole set built with the same launch
  configuration, else asked from the server, started now and kept for the run
  (:mod:`eagle3_raw.launching.target`);
- otherwise asked from every endpoint (``/model_info``, ``/server_info``, ``/v1/models``); those
  that answer must serve the same model; the limits are the tightest among them;
- when no endpoint answers: the target of the latest set of this recipe in the journal, so a set
  built before can be loaded (or rebuilt from its journal) without its server. Rows still missing
  then need the server, and the run says so.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3_raw.errors import RecipeError, ServerMismatch, ServerUnreachable
from eagle3_raw.identity import Target

if TYPE_CHECKING:
    from eagle3_raw.recipe import Recipe
    from eagle3_raw.sglang import ServerIdentity

log = logging.getLogger("eagle3_raw")


def target_of(identities: Sequence[ServerIdentity], origin: str = "server") -> Target:
    """The target of servers that answered (the first's model; the tightest limits)."""
    check_same_model(identities)
    first = identities[0]
    budgets = [i.token_budget for i in identities if i.token_budget is not None]
    inputs = [i.input_limit for i in identities if i.input_limit is not None]
    return Target(first.comparable(), min(budgets, default=None), min(inputs, default=None), origin)


def check_same_model(identities: Sequence[ServerIdentity]) -> None:
    """ServerMismatch unless every endpoint serves the same model (name, path, weights, SGLang version)."""
    first = identities[0]
    for other in identities[1:]:
        if other.comparable() != first.comparable():
            raise ServerMismatch(
                f"endpoints serve different models: {first.url} {first.comparable()} vs "
                f"{other.url} {other.comparable()}"
            )


def reference_target(launch_args: Sequence[str]) -> Target:
    """The target of a reference server launched with ``launch_args`` (computed, not started)."""
    from eagle3_raw.reference.identity import reported_identity
    from eagle3_raw.sglang import identity_from

    try:
        model_info, server_info, max_model_len = reported_identity(launch_args)
    except ValueError as exc:
        raise RecipeError("server.launch_args", list(launch_args), str(exc)) from exc
    return target_of([identity_from("reference", model_info, server_info, max_model_len)], "reference")


def resolve_target(
    recipe: Recipe, journal_root: Path, *, api_key: str | None, generate: bool = True
) -> Target:
    """The target of ``recipe`` (see the module docstring). ServerUnreachable when no endpoint
    answers and the journal has no set of this recipe; other server errors (a refused key, a
    server that is not SGLang) as they come. ``generate=False`` (a merge) never starts a server."""
    from eagle3_raw.runtime import run_sync

    if recipe.server.launch == "reference":
        return reference_target(recipe.server.launch_args)
    if recipe.server.launch == "sglang":
        from eagle3_raw.launching.target import launched_target

        return launched_target(recipe, journal_root, api_key=api_key, generate=generate)
    identities, errors = run_sync(lambda: ask_identities(recipe, api_key, recipe.server.endpoints))
    if identities:
        return target_of(identities)
    recorded = recorded_target(recipe, journal_root)
    if recorded is None:
        raise ServerUnreachable(
            "no endpoint answered: "
            + "; ".join(str(e) for e in errors)
            + f" (and the journal {journal_root} holds no set of recipe {recipe.name!r} to read without one)"
        )
    log.warning(
        "no endpoint answers (%s); using the target recorded by the last set of %r in the journal: %s",
        "; ".join(str(e) for e in errors), recipe.name, recorded.describe(),
    )  # fmt: skip
    return recorded


async def ask_identities(
    recipe: Recipe, api_key: str | None, urls: Sequence[str]
) -> tuple[list[ServerIdentity], list[BaseException]]:
    """The identities of the servers at ``urls`` that answer, and the ServerUnreachable errors of
    those that do not; any other error is raised."""
    from eagle3_raw import sglang

    timeout = recipe.server.connect_timeout
    async with sglang.new_session(connect_timeout=timeout, api_key=api_key) as session:
        results = await asyncio.gather(
            *(sglang.server_identity(session, url, timeout) for url in urls), return_exceptions=True
        )
    identities = [r for r in results if isinstance(r, sglang.ServerIdentity)]
    errors = [r for r in results if isinstance(r, BaseException)]
    for error in errors:
        if not isinstance(error, ServerUnreachable):
            raise error
    return identities, errors


def recorded_target(recipe: Recipe, journal_root: Path) -> Target | None:
    """The target of this recipe's set in the journal (the same fingerprint if any, complete first,
    else the latest set of the same name), or None."""
    from eagle3_raw.journal.manifest import read_manifest
    from eagle3_raw.shards import whole_count

    candidates: list[tuple[tuple[bool, bool, str], dict[str, Any]]] = []
    for folder in sorted((journal_root / "sets").glob(f"{recipe.name}-*")):
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
