"""The launches a set was built with, recorded in its manifest.

Each set's manifest keeps, under ``launches``, the launch configurations it was built with (by
launch digest: :func:`~eagle3_raw.launching.sections.section_digest`) and the command each ran
(redacted; no key is on it): that record is how a later load finds the set's target without
starting a server (:mod:`eagle3_raw.launching.target`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from eagle3_raw.launching.sections import LaunchSection, launcher_of, section_digest

if TYPE_CHECKING:
    from eagle3_raw.journal import Journal
    from eagle3_raw.launching.process import LaunchedServer


def launch_record(section: LaunchSection, server: LaunchedServer) -> dict[str, Any]:
    """What a set's manifest keeps about one launch: the engine, the command, the model."""
    launcher = launcher_of(section)
    model = getattr(section, launcher.model_field)
    return {"kind": launcher.launch, "command": server.shown_command, launcher.model_field: model}


def record_launch(journal: Journal, section: LaunchSection, server: LaunchedServer) -> None:
    """Add this launch to the set's manifest (``launches``, by launch digest)."""
    journal.sets.update(adding_launch(section, server))


def adding_launch(section: LaunchSection, server: LaunchedServer) -> Callable[[dict[str, Any]], None]:
    """A manifest change that adds this launch to ``launches``."""
    digest, record = section_digest(section), launch_record(section, server)

    def add(manifest: dict[str, Any]) -> None:
        manifest["launches"] = {**(manifest.get("launches") or {}), digest: record}

    return add
