"""The target of a ``launch: sglang`` or ``launch: vllm`` recipe: asked from the server it launches,
or read from the journal's record of a set built with the same launch configuration.

Why ask a running server rather than compute the target from the launch flags (as
``launch: reference`` does): what the engine reports decides the set's config id (its version, the
weights version, the context length it derives from the model's config, the longest prompt its KV
pool allows, the slots speculative decoding reserves), and only the server knows them; a computed
guess that differs from the live server would fail every run's identity check. So:

- a set of this recipe (same name and fingerprint) whose manifest records this launch
  configuration (:func:`~eagle3_raw.launching.sections.section_digest`) and that is whole gives
  its target, and nothing starts: a load of a finished set, a merge or a push on a node without a
  GPU never starts the engine. A merge (``generate=False``) also takes a set that is not whole yet
  (it then says which shards are missing);
- otherwise the server is started here, held (:mod:`.held`) for the run that follows, and asked.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3_raw.errors import FatalError
from eagle3_raw.identity import Target, set_config_id
from eagle3_raw.journal import set_dir
from eagle3_raw.journal.manifest import update_manifest
from eagle3_raw.journal.roots import sets_of
from eagle3_raw.launching.held import hold
from eagle3_raw.launching.records import adding_launch
from eagle3_raw.launching.sections import LaunchSection, launch_section, launcher_of, section_digest
from eagle3_raw.run.preflight import check_before_launch
from eagle3_raw.run.runtime import run_sync
from eagle3_raw.run.shards import whole_count
from eagle3_raw.run.target import ask_identities, choose_render, target_of, with_rollout_parsers

if TYPE_CHECKING:
    from eagle3_raw.identity import Target
    from eagle3_raw.launching.process import LaunchedServer
    from eagle3_raw.recipe import Recipe

log = logging.getLogger("eagle3_raw")


def launched_target(recipe: Recipe, root: Path, *, api_key: str | None, generate: bool = True) -> Target:
    """The target of ``recipe`` (``launch: sglang`` or ``vllm``); see the module docstring."""
    recorded = recorded_launch_target(recipe, root, whole_only=generate)
    if recorded is not None:
        return recorded
    if not generate:
        section = launcher_of(_section(recipe)).section
        raise FatalError(
            f"no set of recipe {recipe.name!r} built with this {section} configuration is in the "
            f"journal {root}: build the shards first (eagle3-raw build --shard i/N), or pass the "
            "--journal-dir (and --set options) they were built with"
        )

    check_before_launch(recipe)  # a missing source or a bad template before the engine starts, not after
    server = hold(recipe, api_key)
    target = _ask(recipe, server.url, api_key)
    _remember(recipe, root, target, server)
    return target


def _remember(recipe: Recipe, root: Path, target: Target, server: LaunchedServer) -> None:
    """Record this launch in the set it leads to, if that set exists already (built with another
    launch configuration that serves the same target): the next load then starts nothing."""
    directory = set_dir(root, set_config_id(recipe, target))
    if not (directory / "manifest.json").is_file():
        return
    try:
        update_manifest(directory, adding_launch(_section(recipe), server))
    except FatalError as exc:  # a journal this process cannot write: the next load asks again
        log.debug("cannot record the launch in %s: %s", directory, exc)


def _ask(recipe: Recipe, url: str, api_key: str | None) -> Target:
    identities, errors, cannot = run_sync(lambda: ask_identities(recipe, api_key, (url,)))
    if errors:
        raise errors[0]
    target = choose_render(recipe, target_of(identities, "launch"), cannot)
    return with_rollout_parsers(recipe, target, identities[0])


def recorded_launch_target(recipe: Recipe, root: Path, *, whole_only: bool) -> Target | None:
    """The target of a set of ``recipe`` (same name and fingerprint) built with its launch
    configuration: a whole one first, then (unless ``whole_only``) the latest updated."""
    digest = section_digest(_section(recipe))
    ranked: list[tuple[tuple[bool, str], dict[str, Any]]] = []
    for folder, manifest in sets_of(root, recipe.name, recipe.fingerprint):
        if digest in (manifest.get("launches") or {}):
            ranked.append(((_whole(folder), str(manifest.get("updated", ""))), manifest))
    ranked = [r for r in ranked if r[0][0] or not whole_only]
    if not ranked:
        return None
    target = Target.from_dict(max(ranked, key=lambda r: r[0])[1]["target"])
    log.info("the target of %r is the journal's record of this launch: %s", recipe.name, target.describe())
    return target


def _section(recipe: Recipe) -> LaunchSection:
    section = launch_section(recipe)
    assert section is not None, "a recipe that launches sglang or vllm"
    return section


def _whole(folder: Path) -> bool:
    return whole_count(folder) is not None
