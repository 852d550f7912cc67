"""eagle3_raw: raw-token EAGLE-3 training sets from SGLang's native ``/generate``.

``import eagle3_raw`` registers the ``"eagle3_raw"`` name with ``datasets``, so that
``datasets.load_dataset("eagle3_raw", recipe="r.yaml", split="train")`` works. The import stays
light: ``datasets`` and the other heavy libraries load only when first needed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from eagle3_raw.errors import (
    AuthError,
    ConnectError,
    Eagle3RawError,
    EndpointNotFound,
    ExportError,
    FatalError,
    GenerationAborted,
    HubError,
    Interrupted,
    InvalidResponse,
    JournalError,
    JournalFull,
    LocalFileError,
    MissingExtra,
    PromptFormatError,
    PromptTooLong,
    RecipeError,
    RecipeFileError,
    Redirected,
    RequestRejected,
    RequestTimeout,
    RetriesExhausted,
    RetryableError,
    RowError,
    ServerBusy,
    ServerMismatch,
    ServerUnreachable,
    SourceError,
)
from eagle3_raw.recipe import Recipe, load_recipe
from eagle3_raw.registry import register
from eagle3_raw.version import __version__

if TYPE_CHECKING:
    import datasets

    from eagle3_raw.export import ExportResult
    from eagle3_raw.hub import Comparison, PushResult


__all__ = [
    "AuthError",
    "ConnectError",
    "Eagle3RawError",
    "EndpointNotFound",
    "ExportError",
    "FatalError",
    "GenerationAborted",
    "HubError",
    "Interrupted",
    "InvalidResponse",
    "JournalError",
    "JournalFull",
    "LocalFileError",
    "MissingExtra",
    "PromptFormatError",
    "PromptTooLong",
    "Recipe",
    "RecipeError",
    "RecipeFileError",
    "Redirected",
    "RequestRejected",
    "RequestTimeout",
    "RetriesExhausted",
    "RetryableError",
    "RowError",
    "ServerBusy",
    "ServerMismatch",
    "ServerUnreachable",
    "SourceError",
    "__version__",
    "export",
    "load",
    "load_recipe",
    "push",
    "register",
    "reproduce",
]


def load(
    recipe: Any, split: str = "train", *, cache_dir: str | None = None, **overrides: Any
) -> datasets.Dataset:
    """Build (or load from the cache) the dataset of ``recipe``; same as ``load_dataset("eagle3_raw", ...)``.

    ``recipe`` is a YAML path, a bundled recipe name, a mapping or a :class:`Recipe`; ``overrides``
    are dotted paths or sections (``sampling={"temperature": 0}``), as in :func:`load_recipe`, or
    run options (``journal_dir``, ``retry_failed``, ``progress``,
    ``log_interval``). ``name=`` is the recipe's ``name`` (as ``datasets``' config name).

    Raises an :class:`Eagle3RawError`; an unwritable ``cache_dir`` is one (checked before the
    build, and while ``datasets`` writes it: the journal keeps every generated row).
    """
    from eagle3_raw.builder import load_set  # import eagle3_raw stays light: datasets loads here

    return load_set(recipe, split, cache_dir=cache_dir, **overrides)


def push(recipe: Any, repo_id: str, **options: Any) -> PushResult:
    """Build (or reuse) ``recipe``'s set and publish it to ``repo_id``; see :func:`eagle3_raw.hub.push`."""
    from eagle3_raw import hub

    return hub.push(recipe, repo_id, **options)


def export(**options: Any) -> ExportResult:
    """Write a set in a trainer's layout, with draft-vocabulary files; see :func:`eagle3_raw.export.export`.

    Keyword arguments only: ``output_dir``, ``recipe`` or ``hub`` (and ``config``), ``layout``,
    ``max_length``, ``overflow``, ``extend_boundary``, ``draft_vocab_sizes``, ``target_vocab_size``,
    ``overrides``, ``cache_dir``, ``run_options``, ``token``.
    """
    from eagle3_raw.export import exporting

    return exporting.export(**options)


def reproduce(ref: str, **options: Any) -> Comparison:
    """Rebuild a published set and compare it with the Hub's rows; see :func:`eagle3_raw.hub.reproduce`."""
    from eagle3_raw import hub

    return hub.reproduce(ref, **options)


register()
