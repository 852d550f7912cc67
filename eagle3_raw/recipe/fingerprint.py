"""A recipe's identity: its data as written (:func:`recipe_to_dict`), its fingerprint (a hash of
every field that changes the data, :func:`fingerprint_payload`), the fields that shape each
request (:func:`shaping_payload`, part of every input key), and the digests of the local files
they name (prompt sources, tokenizer, template override), by content, never by where they are.

Transport settings (endpoints, in-flight limits, timeouts, keys) never enter the fingerprint, nor
does the ``export`` section (the draft vocabulary sizes a push publishes files for).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from eagle3_raw.codedigest import module_digest
from eagle3_raw.errors import RecipeError
from eagle3_raw.recipe.sampling import canonical_params
from eagle3_raw.resources import reference_model_dir

if TYPE_CHECKING:  # the schema's Recipe names this module's functions: types only, no import circle
    from eagle3_raw.recipe.schema import ExportConfig, Recipe, SGLangLaunch, SplitsConfig, VLLMLaunch

REFERENCE_TOKENIZER = "reference"
"""``model.tokenizer`` value naming the built-in reference model's tokenizer."""

_HUB_MODEL_ID = re.compile(r"(?:\b[\w.-]{1,96}\b/)?\b[\w.-]{1,96}\b", re.ASCII)
"""A Hub model id (``name`` or ``org/name``), as ``huggingface_hub.utils.validate_repo_id`` checks it."""


def is_hub_id(value: str) -> bool:
    """True when ``value`` has the form of a Hub repo id (``name`` or ``org/name``)."""
    return bool(_HUB_MODEL_ID.fullmatch(value)) and "--" not in value and ".." not in value


def fingerprint(recipe: Recipe) -> str:
    """16 hex digits identifying the data ``recipe`` produces (see :func:`fingerprint_payload`)."""
    payload = orjson.dumps(fingerprint_payload(recipe), option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(payload).hexdigest()[:16]


def recipe_to_dict(recipe: Recipe) -> dict[str, Any]:
    """YAML-ready data with every field (defaults included); ``base_dir`` is not part of it."""

    server = asdict(recipe.server)
    server["endpoints"] = list(recipe.server.endpoints)
    server["launch_args"] = list(recipe.server.launch_args)
    server["sglang"] = _launch_dict(recipe.server.sglang)
    server["vllm"] = _launch_dict(recipe.server.vllm)
    if server["vllm"] is None:  # written only when set: recipes without one are as before
        del server["vllm"]
    if recipe.server.launch in ("sglang", "vllm"):  # their own is in their section
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
        **({"select": recipe.select.rules()} if recipe.select.active else {}),
        **_splits_dict(recipe.splits),
    }


def _launch_dict(launch: SGLangLaunch | VLLMLaunch | None) -> dict[str, Any] | None:
    """``server.sglang`` or ``server.vllm`` as YAML-ready data (lists, not tuples), or None."""
    if launch is None:
        return None

    data = asdict(launch)
    data.update(extra_args=list(launch.extra_args), executable=list(launch.executable), env=dict(launch.env))
    return data


def _export_dict(export: ExportConfig) -> dict[str, Any]:
    """The ``export`` section, only when it is set (recipes without one publish as before)."""
    return (
        {"export": {"draft_vocab_sizes": list(export.draft_vocab_sizes)}} if export.draft_vocab_sizes else {}
    )


def _splits_dict(splits: SplitsConfig) -> dict[str, Any]:
    """The ``splits`` section, only when it holds something out (recipes without one are as before)."""
    return {"splits": asdict(splits)} if splits.validation is not None else {}


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
        **_select_identity(recipe),
        **_splits_identity(recipe),
    }


SELECTION_MODULE = "eagle3_raw.selection"
"""The module whose code applies a ``select`` section's rules: its digest is part of the identity of
every derived set (and of no other)."""


def _select_identity(recipe: Recipe) -> dict[str, Any]:
    """The ``select`` rules and the digest of the code that applies them (absent without a rule:
    fingerprints of recipes that select nothing stay as they were)."""
    rules = recipe.select.rules()
    if not rules:
        return {}
    return {"select": {"rules": rules, "code": module_digest(SELECTION_MODULE)}}


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


def _splits_identity(recipe: Recipe) -> dict[str, Any]:
    """The held-out split (absent when none: fingerprints of recipes without one stay as they
    were). A fraction and a count stay apart (``0.5`` is not ``1``), and never shape a request."""
    s = recipe.splits
    if s.validation is None:
        return {}
    kind = "fraction" if isinstance(s.validation, float) else "count"
    return {"splits": {kind: s.validation, "seed": s.seed, "rule": 1}}


def _prompts_identity(recipe: Recipe) -> dict[str, Any]:
    """The prompt source: a local one by content, a Hub one by id, subset, split and revision."""
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
    """The tokenizer (a local one by content), the template override's digest and the model's
    chat keywords; RecipeError when the tokenizer is neither a folder nor a Hub id."""
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
    """The chat template override's digest; RecipeError when it is not a file."""
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
    return sorted(p for p in folder.rglob("*") if is_digestible(p, folder))


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


def is_digestible(path: Path, root: Path) -> bool:
    """Whether :func:`digest_path` reads ``path`` of folder ``root``."""
    parts = path.relative_to(root).parts
    hidden = any(part.startswith(".") or part == "__pycache__" for part in parts)
    return path.is_file() and not hidden and path.suffix not in _WEIGHT_SUFFIXES
