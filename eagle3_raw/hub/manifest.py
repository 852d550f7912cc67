"""``recipes/<name>.manifest.json``: what a published set is, where it came from, what it holds.

Built from the set as pushed (rows, tokens, lengths), the journal (target, server identity, skips
and failures, a Hub source's commit, whether the set is partial) and the installed versions.
Server facts pass through :func:`~eagle3_raw.redact.scrub`; the server's launch command carries
no install path (:func:`~eagle3_raw.redact.public_command`). It has no timestamp of the push, so
pushing the same set twice uploads the same manifest.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3_raw.errors import JournalError
from eagle3_raw.hub.published import PublishedRecipe
from eagle3_raw.hub.sets import SetScan
from eagle3_raw.journal import Journal
from eagle3_raw.recipe import Recipe
from eagle3_raw.redact import public_command, scrub, scrub_text
from eagle3_raw.run.render import Renderer
from eagle3_raw.selection import report
from eagle3_raw.splits import SplitRule
from eagle3_raw.version import __version__

if TYPE_CHECKING:
    import datasets

MANIFEST_FORMAT = 1

_log = logging.getLogger("eagle3_raw")


def build_manifest(
    recipe: Recipe, published: PublishedRecipe, scan: SetScan, journal_dir: Path, *,
    partial: str | None = None, splits: Mapping[str, Any] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """``recipes/<name>.manifest.json``: identity, server, tokenizer, versions, counts, lengths.

    Counts of rows and tokens come from the set as pushed (its ``train`` split: ``scan``); skips
    and failures (and rows dropped for ``on_truncation: drop``) from the journal; ``splits``
    (:func:`split_counts`, only for a recipe that holds a split out) each split's rows and
    conversations. Server facts are scrubbed. No timestamps of the push, so pushing the same set
    twice changes nothing.
    """
    journal_manifest, stats = _journal_facts(recipe, journal_dir)
    server = (journal_manifest or {}).get("server") or None
    return {
        "format": MANIFEST_FORMAT,
        "name": recipe.name,
        "fingerprint": recipe.fingerprint,
        "config_id": journal_dir.name + ("-partial" if partial else ""),
        "partial": partial,
        "target": (journal_manifest or {}).get("target"),
        "source": (journal_manifest or {}).get("source"),
        "recipe_file": published.path,
        "prompt_source": published.prompt_source,
        "prompt_files": sorted(p for p in published.files if "/prompts/" in p),
        "versions": _versions(),
        "request_params": recipe.sampling.request_params(),
        "server": _server_facts(server),
        "tokenizer": _public_tokenizer(
            scrub((server or {}).get("tokenizer") or _tokenizer_identity(recipe)), published
        ),
        "counts": _counts(recipe, scan, stats),
        "lengths": scan.length_stats(),
        "journal": _journal_history(journal_manifest),
        **_selection(recipe, journal_dir),
        **({"splits": dict(splits)} if splits else {}),
    }


def _selection(recipe: Recipe, journal_dir: Path) -> dict[str, Any]:
    """A derived set's parent, rules and counts (:func:`eagle3_raw.selection.report`); absent for a
    set that selects nothing."""
    made = report(recipe, journal_dir) if recipe.select.active else None
    return {"selection": made.to_dict()} if made is not None else {}


def split_counts(rule: SplitRule, splits: Mapping[str, datasets.Dataset]) -> dict[str, Any]:
    """The manifest's ``splits``: the rule, and each split's rows and conversations (distinct
    source ids), counted from the rows as pushed."""
    how = {"validation": rule.fraction if rule.fraction is not None else rule.count, "seed": rule.seed}
    counted = {
        name: {"rows": len(rows), "conversations": len(set(rows.unique("source_id")))}
        for name, rows in splits.items()
    }
    return {"rule": {**how, "assigned": rule.describe()}, **counted}


def _journal_facts(recipe: Recipe, journal_dir: Path) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    try:
        with Journal.read_dir(journal_dir) as journal:
            return dict(journal.manifest), journal.stats()
    except JournalError as exc:
        _log.warning(
            "no journal for %s (%s): the card will not show the server or failures", recipe.name, exc
        )
        return None, None


def _server_facts(server: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if server is None:
        return None
    keys = ("model_path", "served_model_name", "weight_version", "version", "server_info", "model_info")
    facts: dict[str, Any] = scrub({key: server[key] for key in keys if key in server})
    info = facts.get("server_info")
    if isinstance(info, dict) and isinstance(info.get("launch_command"), str):
        facts["server_info"] = {**info, "launch_command": public_command(info["launch_command"])}
    return facts


def _public_tokenizer(identity: Mapping[str, Any], published: PublishedRecipe) -> dict[str, Any]:
    """The tokenizer's identity with the tokenizer named as the published recipe names it: never a
    local path (the reference tokenizer's own is the installed package's)."""
    name = published.data["model"]["tokenizer"]
    return {**identity, "tokenizer": name, "name_or_path": name}


def _tokenizer_identity(recipe: Recipe) -> dict[str, str]:
    return Renderer(recipe).identity()


def _counts(recipe: Recipe, scan: SetScan, stats: Mapping[str, Any] | None) -> dict[str, Any]:
    failures = (stats or {}).get("failures") or {}
    journaled_length = ((stats or {}).get("finish_reasons") or {}).get("length", 0)
    return {
        "rows": scan.rows,
        "prompt_tokens": int(scan.prompt_lengths.sum()),
        "generated_tokens": int(scan.generated_lengths.sum()),
        "finish_reasons": dict(sorted(scan.finish_reasons.items())),
        "dropped_truncated": journaled_length if recipe.on_truncation == "drop" else 0,
        "skipped": _reasons(failures.get("skipped") or {}),
        "failed": _reasons(failures.get("failed") or {}),
        **{key: (stats or {})[key] for key in ("rollouts", "mixture") if (stats or {}).get(key) is not None},
    }


def _reasons(counts: Mapping[str, int]) -> dict[str, int]:
    """Reason -> rows, with credentials redacted in the reason *text*. Not :func:`scrub` on the
    mapping: it drops keys that read like secret names, and "bad token id" or "missing key" would
    vanish from the published counts."""
    redacted: Counter[str] = Counter()
    for reason, count in counts.items():
        redacted[scrub_text(str(reason))] += count
    return dict(redacted)


def _journal_history(manifest: Mapping[str, Any] | None) -> dict[str, Any]:
    if manifest is None:
        return {"available": False}
    return {"available": True, "created": manifest.get("created"), "code": manifest.get("code")}


def _versions() -> dict[str, str]:
    import datasets
    import huggingface_hub

    return {
        "eagle3_raw": __version__,
        "datasets": datasets.__version__,
        "huggingface_hub": huggingface_hub.__version__,
    }
