"""Whether the Hub can be reached, asked once with a short connect before a Hub tokenizer is fetched.

Without a network, ``transformers``/``huggingface_hub`` retry every file with backoff (100 s and 44
retry warnings for one tokenizer id before the error). A connect to the Hub's host (or the HTTPS
proxy's) that fails within ``PROBE_SECONDS`` means offline: a cached tokenizer then loads from the
cache alone, an uncached one is one clear error (:func:`hub_local_files_only`).
"""

from __future__ import annotations

import functools
import os
import socket
import urllib.parse

from eagle3_raw.errors import RecipeError

PROBE_SECONDS = 5.0
"""How long the connect to the Hub (or the proxy) may take before it counts as unreachable."""


def hub_local_files_only(field: str, repo_id: str, revision: str | None) -> bool:
    """``local_files_only`` for ``from_pretrained`` / ``hf_hub_download`` of Hub repo ``repo_id``:
    False when the Hub answers; True when it does not (or ``HF_HUB_OFFLINE`` is set) and the repo
    is cached. RecipeError on ``field`` naming the id when it is neither reachable nor cached."""
    from huggingface_hub import constants, try_to_load_from_cache

    offline = constants.HF_HUB_OFFLINE
    problem = None if offline else unreachable(constants.ENDPOINT)
    if not offline and problem is None:
        return False
    if isinstance(try_to_load_from_cache(repo_id, "tokenizer_config.json", revision=revision), str):
        return True
    why = "HF_HUB_OFFLINE is set" if offline else f"the Hub cannot be reached ({problem})"
    raise RecipeError(
        field, repo_id,
        f"a Hub model id, but {why} and it is not in the local cache: point {field} at a local "
        "tokenizer folder, or download it where the Hub answers (it is then used from the cache, "
        "also with HF_HUB_OFFLINE=1)",
    )  # fmt: skip


@functools.lru_cache(maxsize=8)
def unreachable(endpoint: str) -> str | None:
    """Why a TCP connect to ``endpoint``'s host (or the HTTPS proxy's) fails, or None when it
    connects. Asked once per process."""
    proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy") or os.environ.get("ALL_PROXY")
    target = urllib.parse.urlsplit(proxy or endpoint)
    host = target.hostname or ""
    port = target.port or (443 if target.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=PROBE_SECONDS).close()
    except OSError as exc:
        return f"{'proxy ' if proxy else ''}{host}:{port}: {exc.strerror or exc}"
    return None
