"""Starting the SGLang server a recipe's ``server.sglang`` describes, and recording it in the set.

The key, if the recipe has one (``server.api_key_env``), goes into a 0600 YAML file passed as
``--config`` and removed once the server has started (SGLang reads it at start-up); the command
line carries no secret. Each set's manifest keeps, under ``launches``, the launch configurations
it was built with (by :func:`~eagle3_raw.sglang.launch.launch_digest`) and the command each
ran (redacted): that record is how a later load finds the set's target without a GPU
(:mod:`eagle3_raw.launching.target`).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from eagle3_raw.launching.process import LaunchedServer, LaunchSpec, start_server
from eagle3_raw.sglang.launch import launch_digest, sglang_command, shown

if TYPE_CHECKING:
    from eagle3_raw.journal import Journal
    from eagle3_raw.recipe import SGLangLaunch


def start_sglang(launch: SGLangLaunch, api_key: str | None, *, base_dir: Path) -> LaunchedServer:
    """Start ``launch`` on a free loopback port and wait until it is healthy (ServerUnreachable with
    its log's tail if it exits or never answers within ``startup_timeout``). A relative
    ``log_dir`` is in ``base_dir`` (the recipe's folder)."""
    log_dir = base_dir / Path(launch.log_dir).expanduser() if launch.log_dir else None
    with _key_file(api_key) as key_file:
        spec = LaunchSpec(
            command=lambda port: sglang_command(launch, port, key_file=key_file),
            name="SGLang", env=dict(launch.env), startup_timeout=launch.startup_timeout,
            stop_timeout=launch.stop_timeout, log_dir=log_dir, shown=shown,
        )  # fmt: skip
        return start_server(spec)


@contextlib.contextmanager
def _key_file(api_key: str | None) -> Iterator[Path | None]:
    """A private file holding ``api-key: KEY`` for ``--config``, removed after the block."""
    if not api_key:
        yield None
        return
    fd, name = tempfile.mkstemp(prefix="eagle3-raw-sglang-", suffix=".yaml")  # 0600
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(orjson.dumps({"api-key": api_key}))  # JSON is YAML
        yield Path(name)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(name)


def launch_record(launch: SGLangLaunch, server: LaunchedServer) -> dict[str, Any]:
    """What a set's manifest keeps about one launch (no secret: the key was in a file)."""
    return {"kind": "sglang", "command": server.shown_command, "model_path": launch.model_path}


def record_launch(journal: Journal, launch: SGLangLaunch, server: LaunchedServer) -> None:
    """Add this launch to the set's manifest (``launches``, by launch digest)."""
    journal.sets.update(adding_launch(launch, server))


def adding_launch(launch: SGLangLaunch, server: LaunchedServer) -> Callable[[dict[str, Any]], None]:
    """A manifest change that adds this launch to ``launches``."""
    digest, record = launch_digest(launch), launch_record(launch, server)

    def add(manifest: dict[str, Any]) -> None:
        manifest["launches"] = {**(manifest.get("launches") or {}), digest: record}

    return add
