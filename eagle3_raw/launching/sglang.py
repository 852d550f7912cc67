"""Starting the SGLang server a recipe's ``server.sglang`` describes.

The key, if the recipe has one (``server.api_key_env``), goes into a 0600 YAML file passed as
``--config`` and removed once the server has started (SGLang reads it at start-up); the command
line carries no secret.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from eagle3_raw.launching.process import LaunchedServer, LaunchSpec, start_server
from eagle3_raw.sglang.launch import sglang_command, shown

if TYPE_CHECKING:
    from eagle3_raw.recipe import SGLangLaunch


def start_sglang(launch: SGLangLaunch, api_key: str | None, *, base_dir: Path) -> LaunchedServer:
    """Start ``launch`` on a free loopback port and wait until it is healthy (ServerUnreachable with
    its log's tail if it exits or never answers within ``startup_timeout``). A relative
    ``log_dir`` is in ``base_dir`` (the recipe's folder)."""
    log_dir = base_dir / Path(launch.log_dir).expanduser() if launch.log_dir else None
    with _key_file(api_key) as key_file:
        spec = LaunchSpec(
            command=lambda port: sglang_command(launch, port, key_file=key_file),
            name="SGLang", section="server.sglang", env=dict(launch.env),
            startup_timeout=launch.startup_timeout, stop_timeout=launch.stop_timeout, log_dir=log_dir,
            shown=shown,
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
