"""The ``sglang.launch_server`` command a recipe's ``server.sglang`` section stands for.

::

    <executable> --model-path M [--revision R] --host 127.0.0.1 --port P --tp-size T --dp-size D
        [--context-length C] [--served-model-name S] [--reasoning-parser X] [--tool-call-parser Y]
        [--trust-remote-code] [--enable-deterministic-inference] [--config KEYFILE] <extra_args>

``executable`` defaults to this Python's ``-m sglang.launch_server``. Where the server listens, the
model and the flags the section has a field for are eagle3_raw's to write: ``extra_args`` may not
give them again (:func:`check_sglang_launch`), nor abbreviate them (SGLang's argparse would take
``--po`` for ``--port``), nor put a secret on the command line, which every local user can read
(``ps``). An API key reaches the server in a private YAML file named by ``--config``
(SGLang merges it under the command line: ``sglang/srt/server_args.py:682``,
``sglang/srt/utils/server_args_config_parser.py``).

This module imports nothing heavy: the recipe is validated with it.
"""

from __future__ import annotations

import hashlib
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from eagle3_raw.errors import RecipeError
from eagle3_raw.redact import is_secret_name, scrub_args

if TYPE_CHECKING:
    from eagle3_raw.recipe import SGLangLaunch

HOST = "127.0.0.1"
"""A launched server listens on loopback only: the client runs on the same node."""

DEFAULT_EXECUTABLE = ("-m", "sglang.launch_server")
"""After this Python's path, when ``server.sglang.executable`` is empty."""

#: Flags ``extra_args`` may not give, with where their value comes from instead.
MANAGED_FLAGS: Mapping[str, str] = {
    "--host": "the launched server listens on 127.0.0.1",
    "--port": "a free port is chosen for it",
    "--model-path": "set server.sglang.model_path",
    "--model": "set server.sglang.model_path",
    "--revision": "set server.sglang.revision",
    "--tp-size": "set server.sglang.tp_size",
    "--tensor-parallel-size": "set server.sglang.tp_size",
    "--dp-size": "set server.sglang.dp_size",
    "--data-parallel-size": "set server.sglang.dp_size",
    "--context-length": "set server.sglang.context_length",
    "--served-model-name": "set server.sglang.served_model_name",
    "--reasoning-parser": "set server.sglang.reasoning_parser",
    "--tool-call-parser": "set server.sglang.tool_call_parser",
    "--trust-remote-code": "set server.sglang.trust_remote_code: true",
    "--enable-deterministic-inference": "set server.sglang.deterministic",
    "--config": "eagle3_raw passes the server's key in it",
    "--api-key": "the key comes from server.api_key_env, through a private file",
}

#: Fields that do not change what the server is (how long to wait, where its log goes).
_NOT_IDENTITY = frozenset({"startup_timeout", "stop_timeout", "log_dir"})


def check_sglang_launch(launch: SGLangLaunch) -> None:
    """RecipeError for an ``extra_args`` flag eagle3_raw sets itself, an abbreviation of one, or a
    flag that would put a secret on the command line; for an empty ``model_path``."""
    if not launch.model_path.strip():
        raise RecipeError(
            "server.sglang.model_path", launch.model_path, "expected a Hub model id or a folder"
        )
    for arg in launch.extra_args:
        name = arg.partition("=")[0]
        if not name.startswith("--"):
            continue
        problem = _flag_problem(name)
        if problem:
            raise RecipeError("server.sglang.extra_args", list(launch.extra_args), f"{name}: {problem}")


def _flag_problem(name: str) -> str | None:
    if name in MANAGED_FLAGS:
        return f"eagle3_raw sets it ({MANAGED_FLAGS[name]})"
    longer = sorted(flag for flag in MANAGED_FLAGS if flag.startswith(name))
    if longer:
        return f"SGLang would read it as {longer[0]}, which eagle3_raw sets; spell options in full"
    if is_secret_name(name.replace("token", "")):  # not "token": --ms-per-token, --max-...-token
        return "a secret on a command line is readable by every local user (ps); pass it another way"
    return None


def executable(launch: SGLangLaunch) -> list[str]:
    """The command before the flags."""
    return list(launch.executable) if launch.executable else [sys.executable, *DEFAULT_EXECUTABLE]


def sglang_command(launch: SGLangLaunch, port: int, *, key_file: Path | None = None) -> list[str]:
    """The full command line that starts ``launch`` on ``127.0.0.1:port``."""
    command = [*executable(launch), "--model-path", launch.model_path]
    command += ["--revision", launch.revision] if launch.revision else []
    command += ["--host", HOST, "--port", str(port)]
    command += ["--tp-size", str(launch.tp_size), "--dp-size", str(launch.dp_size)]
    for flag, value in (
        ("--context-length", launch.context_length), ("--served-model-name", launch.served_model_name),
        ("--reasoning-parser", launch.reasoning_parser), ("--tool-call-parser", launch.tool_call_parser),
    ):  # fmt: skip
        command += [flag, str(value)] if value is not None else []
    command += ["--trust-remote-code"] if launch.trust_remote_code else []
    command += ["--enable-deterministic-inference"] if launch.deterministic else []
    command += ["--config", str(key_file)] if key_file is not None else []
    return [*command, *launch.extra_args]


def shown(command: Sequence[str]) -> str:
    """``command`` as one shell line, secrets redacted (for the manifest, logs and errors)."""
    return shlex.join(scrub_args(command))


def launch_digest(launch: SGLangLaunch) -> str:
    """16 hex digits for everything in ``launch`` that decides what server it starts (not how long
    to wait for it, nor where its log goes): the key of a set's record of its launches."""
    from dataclasses import asdict

    data = {k: v for k, v in asdict(launch).items() if k not in _NOT_IDENTITY}
    payload = orjson.dumps(data, option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(b"eagle3_raw/sglang-launch/1\0" + payload).hexdigest()[:16]
