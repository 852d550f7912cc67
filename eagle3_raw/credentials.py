"""The server's API key: read from the environment variable the recipe names, never stored.

The key goes into ``Authorization`` headers and, for a launched reference server, into the child's
environment (:func:`eagle3_raw.launching.reference.launch_reference`); never into a command line,
a journal, a manifest or a message.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

from eagle3_raw.errors import RecipeError

if TYPE_CHECKING:
    from eagle3_raw.recipe import Recipe

_ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")


def server_api_key(recipe: Recipe) -> str | None:
    """The value of ``server.api_key_env``'s variable (None when the recipe names none).

    RecipeError when the variable is not set; a value that does not look like a variable name is
    never echoed (it may be the key itself, written in the wrong place).
    """
    name = recipe.server.api_key_env
    if name is None:
        return None
    if not os.environ.get(name):
        if not _ENV_NAME.fullmatch(name):  # perhaps the key itself: never echo it
            raise RecipeError(
                "server.api_key_env", "<not shown, in case it is the key>",
                "names no set environment variable; it takes the NAME of a variable holding the key "
                "(e.g. SGLANG_API_KEY), not the key itself",
            )  # fmt: skip
        raise RecipeError("server.api_key_env", name, "names an environment variable that is not set")
    return os.environ[name]
