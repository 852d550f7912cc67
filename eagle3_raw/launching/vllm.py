"""Starting the vLLM server a recipe's ``server.vllm`` describes.

The key, if the recipe has one (``server.api_key_env``), reaches the server as ``VLLM_API_KEY`` in
its environment, where vLLM reads it (:func:`~eagle3_raw.vllm.launch.vllm_env`); the command line
carries no secret.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from eagle3_raw.launching.process import LaunchedServer, LaunchSpec, start_server
from eagle3_raw.vllm.launch import shown, vllm_command, vllm_env

if TYPE_CHECKING:
    from eagle3_raw.recipe import VLLMLaunch


def start_vllm(launch: VLLMLaunch, api_key: str | None, *, base_dir: Path) -> LaunchedServer:
    """Start ``launch`` on a free loopback port and wait until it is healthy (ServerUnreachable with
    its log's tail if it exits or never answers within ``startup_timeout``). A relative
    ``log_dir`` is in ``base_dir`` (the recipe's folder)."""
    log_dir = base_dir / Path(launch.log_dir).expanduser() if launch.log_dir else None
    spec = LaunchSpec(
        command=lambda port: vllm_command(launch, port),
        name="vLLM", section="server.vllm", env=vllm_env(launch, api_key),
        startup_timeout=launch.startup_timeout, stop_timeout=launch.stop_timeout, log_dir=log_dir,
        shown=shown,
    )  # fmt: skip
    return start_server(spec)
