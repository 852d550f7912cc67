"""One evaluation: a recipe's split replayed through each server in turn, and the report.

Every server is asked first whether it speculates (``/server_info``), so a server without a
drafter is named before any prompt is sent to any of them. The servers are replayed one after
the other, never at once: two servers on one machine (two drafters of one target, the usual
comparison) would otherwise share its GPU and each one's speed would be the other's too.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from eagle3_raw.credentials import server_api_key
from eagle3_raw.engines import detect
from eagle3_raw.errors import FatalError, ServerMismatch
from eagle3_raw.evaluate.replay import ReplayOptions, not_speculating, replay
from eagle3_raw.evaluate.report import Report, server_report
from eagle3_raw.evaluate.sets import COLUMNS, open_split, points, table_rows
from eagle3_raw.recipe import Recipe
from eagle3_raw.redact import public_url
from eagle3_raw.run.render import Renderer
from eagle3_raw.sglang import client as sglang
from eagle3_raw.source.prompts import source_categories

log = logging.getLogger("eagle3_raw")


@dataclass(frozen=True)
class EvalOptions:
    """What to replay and how (the command line's options)."""

    split: str | None = None
    """None: ``validation`` when the set has one, else ``train``."""
    greedy: bool = False
    limit: int | None = None
    """Replay only the first ``limit`` points."""
    max_in_flight: int = 16
    api_key_env: str | None = None
    """The variable holding the servers' API key (default: the recipe's ``server.api_key_env``)."""
    request_timeout: float | None = None
    """Seconds per attempt (default: the recipe's ``server.request_timeout``)."""
    retries: int | None = None
    """Default: the recipe's ``server.max_retries``."""
    categories: Mapping[str, str] | None = None
    """Source id -> the source's category (default: the recipe's ``prompts.category_column``, read
    from the source)."""


def evaluate(
    recipe: str | Path | Mapping[str, Any] | Recipe,
    urls: Sequence[str],
    options: EvalOptions = EvalOptions(),
    *,
    overrides: Mapping[str, Any] | None = None,
    cache_dir: Path | None = None,
    journal_dir: Path | None = None,
) -> Report:
    """Replay ``recipe``'s split (as built) through each of ``urls`` and summarize each; see the
    module docstring. FatalError for a set not built, a missing split, an empty one, or a server
    that does not speculate (named)."""
    if not urls:
        raise FatalError("no server to evaluate: pass --server URL")
    opened = open_split(
        recipe, split=options.split, overrides=overrides, cache_dir=cache_dir, journal_dir=journal_dir
    )
    categories = options.categories if options.categories is not None else source_categories(opened.recipe)
    table = opened.dataset.select_columns(list(COLUMNS)).with_format("arrow")[:]  # memory-mapped
    every = points(table_rows(table), opened.recipe, greedy=options.greedy, categories=categories)
    found = list(itertools.islice(every, options.limit))  # held for every server: --limit bounds them
    if not found:
        raise FatalError(f"{opened.label} has no rows to replay")
    replay_options = _replay_options(opened.recipe, options)
    asyncio.run(_check_servers(urls, replay_options, opened.model))
    reports = tuple(server_report(replay(url, found, replay_options)) for url in urls)
    return Report(opened.label, opened.split, len(found), "greedy" if options.greedy else "recipe", reports)


def _replay_options(recipe: Recipe, options: EvalOptions) -> ReplayOptions:
    """The replay's limits, and the tokenizer's facts every answer is checked against (its
    vocabulary, its EOS ids: as a build checks them)."""
    renderer = Renderer(recipe)
    server = recipe.server
    timeout = server.request_timeout if options.request_timeout is None else options.request_timeout
    key_env = options.api_key_env or server.api_key_env
    api_key = (
        server_api_key(replace(recipe, server=replace(server, api_key_env=key_env))) if key_env else None
    )
    return ReplayOptions(
        vocab_size=renderer.vocab_size, eos_ids=renderer.eos_token_ids, api_key=api_key,
        max_in_flight=options.max_in_flight,
        request_timeout=timeout,
        connect_timeout=server.connect_timeout,
        retries=server.max_retries if options.retries is None else options.retries,
    )  # fmt: skip


async def _check_servers(urls: Sequence[str], options: ReplayOptions, model: Mapping[str, str]) -> None:
    """ServerMismatch naming the first of ``urls`` that runs no drafter (before any replay); a
    warning for one that serves another model than the set's (its drafter would be measured on
    prompts of another target; one model loaded from another path looks the same here)."""
    async with sglang.new_session(
        connect_timeout=options.connect_timeout, api_key=options.api_key
    ) as session:
        for url in urls:
            if await detect(session, url.rstrip("/"), options.connect_timeout) == "vllm":
                raise ServerMismatch(
                    f"{public_url(url)} is a vLLM server: eval reads each answer's acceptance figures, "
                    "which vLLM's completions do not carry (point it at an SGLang server running the drafter)"
                )
            identity = await sglang.server_identity(session, url.rstrip("/"), options.connect_timeout)
            if not identity.drafter:
                raise ServerMismatch(not_speculating(url))
            served = {key: identity.comparable()[key] for key in ("model_path", "weight_version")}
            wanted = {key: model.get(key) for key in served}
            if model and served != wanted:
                log.warning(
                    "%s serves %s; the set was generated by %s: acceptance on these prompts is another "
                    "target's", public_url(url), served, wanted,
                )  # fmt: skip
