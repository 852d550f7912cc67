"""The engine section of a recipe that launches one, and what is done per engine with it.

``server.launch: sglang`` starts what ``server.sglang`` describes (:class:`SGLangLaunch`),
``server.launch: vllm`` what ``server.vllm`` does (:class:`VLLMLaunch`). Everything else in this
package (the held server, the manifest's record of launches, the target found from that record)
works on a section through :func:`launch_section` and :func:`launcher_of`, the same way for both.
The engine's own facts (its command line, managed flags, environment, launch digest) are in its
package: :mod:`eagle3_raw.sglang.launch`, :mod:`eagle3_raw.vllm.launch`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3_raw.launching.sglang import start_sglang
from eagle3_raw.launching.vllm import start_vllm
from eagle3_raw.recipe import SGLangLaunch, VLLMLaunch
from eagle3_raw.sglang.launch import launch_digest as sglang_digest
from eagle3_raw.vllm.launch import launch_digest as vllm_digest

if TYPE_CHECKING:
    from eagle3_raw.launching.process import LaunchedServer
    from eagle3_raw.recipe import Recipe

LaunchSection = SGLangLaunch | VLLMLaunch
"""A section ``server.launch`` starts a server from."""


@dataclass(frozen=True)
class Launcher:
    """How eagle3_raw launches one engine from its section."""

    launch: str
    """The ``server.launch`` value, and the name of its section under ``server``."""
    name: str
    """For messages (``SGLang``)."""
    model_field: str
    """The section's field naming the model (what the manifest's record of a launch keeps)."""
    digest: Callable[[Any], str]
    """The section's launch digest: the key of the manifest's record of its launches."""
    start: Callable[[Any, str | None, Path], LaunchedServer]
    """Start the section's server (section, API key, the recipe's folder) and wait until it is healthy."""

    @property
    def section(self) -> str:
        """The section's path in a recipe (``server.sglang``)."""
        return f"server.{self.launch}"


LAUNCHERS: dict[type[Any], Launcher] = {
    SGLangLaunch: Launcher(
        "sglang", "SGLang", "model_path", sglang_digest,
        lambda launch, key, base_dir: start_sglang(launch, key, base_dir=base_dir),
    ),
    VLLMLaunch: Launcher(
        "vllm", "vLLM", "model", vllm_digest,
        lambda launch, key, base_dir: start_vllm(launch, key, base_dir=base_dir),
    ),
}  # fmt: skip
"""Each launch section's class and how its engine is launched."""


def launch_section(recipe: Recipe) -> LaunchSection | None:
    """The section of the engine ``recipe`` launches (None: it launches none, or the reference server)."""
    server = recipe.server
    return {"sglang": server.sglang, "vllm": server.vllm}.get(server.launch or "")


def launcher_of(section: LaunchSection) -> Launcher:
    """How the engine of ``section`` is launched."""
    return LAUNCHERS[type(section)]


def section_digest(section: LaunchSection) -> str:
    """``section``'s launch digest (:func:`eagle3_raw.sglang.launch.launch_digest`, or vLLM's)."""
    return launcher_of(section).digest(section)
