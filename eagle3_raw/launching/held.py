"""The launched servers this process holds, one per launch configuration.

A set's target is known before it is built (:mod:`eagle3_raw.run.target`): for ``launch: sglang``
or ``launch: vllm`` without a record in the journal, that means starting the server to ask it. The
server started then is held here and is the one the run sends its requests to (:func:`serving`), so
a GPU server is started once per build, not twice. Whoever resolved a target and then did not run
(a set read from the ``datasets`` cache, a merge) releases it (:func:`release`); at interpreter exit
every held server is stopped, and one whose holder dies any other way stops by itself (the guard's
pipe).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

from eagle3_raw.launching.sections import LaunchSection, launch_section, launcher_of, section_digest

if TYPE_CHECKING:
    from eagle3_raw.launching.process import LaunchedServer
    from eagle3_raw.recipe import Recipe

log = logging.getLogger("eagle3_raw")

_lock = threading.Lock()
_held: dict[str, LaunchedServer] = {}
_exit_hook = False


def hold(recipe: Recipe, api_key: str | None) -> LaunchedServer:
    """The running server of ``recipe``'s launch section (``server.sglang`` or ``server.vllm``):
    the one held already if it is alive, else a new one."""
    global _exit_hook
    section = launch_section(recipe)
    assert section is not None
    digest = section_digest(section)
    with _lock:
        server = _held.get(digest)
        if server is not None and server.alive:
            return server
        if not _exit_hook:
            atexit.register(release_all)
            _exit_hook = True
        _held[digest] = server = launcher_of(section).start(section, api_key, recipe.base_dir)
        return server


def held(section: LaunchSection) -> LaunchedServer | None:
    """The server held for ``section``, if any."""
    with _lock:
        return _held.get(section_digest(section))


@contextlib.contextmanager
def serving(recipe: Recipe, api_key: str | None) -> Iterator[tuple[str, ...]]:
    """The endpoints of a run of ``recipe`` (``launch: sglang`` or ``vllm``): its held server
    (started now if none is), stopped when the block ends, however it ends."""
    server = hold(recipe, api_key)
    try:
        yield (server.url,)
    finally:
        release(launch_section(recipe))


def release(section: LaunchSection | None) -> None:
    """Stop the server held for ``section`` (nothing if none is)."""
    if section is None:
        return
    with _lock:
        server = _held.pop(section_digest(section), None)
    if server is not None:
        _stop(server)


def release_all() -> None:
    """Stop every held server."""
    with _lock:
        servers = list(_held.values())
        _held.clear()
    for server in servers:
        _stop(server)


def _stop(server: LaunchedServer) -> None:
    log.info("stopping the %s server at %s", server.spec.name, server.url)
    server.stop()
    server.discard_log()
