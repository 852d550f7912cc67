"""What a reference server started with some options would report about itself, without starting it.

A recipe with ``server.launch: reference`` names its target before any server runs (the set's
config id is known when ``load_dataset`` is called): this builds the same :class:`ServerState` the
server would, from the same options, and reads its ``/model_info``, ``/server_info`` and
``/v1/models`` answers off it (:func:`reported_identity`; for the vLLM mode,
:func:`reported_vllm_identity`).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from typing import Any

from eagle3_raw.reference.cli import add_arguments, config_from_args
from eagle3_raw.reference.server.info import Info
from eagle3_raw.reference.server.model import Model
from eagle3_raw.reference.server.state import ServerState
from eagle3_raw.reference.vllm_cli import add_vllm_arguments, vllm_config_from_args
from eagle3_raw.reference.vllmapi.info import VLLMInfo


def reported_identity(args: Sequence[str]) -> tuple[dict[str, Any], dict[str, Any], int]:
    """(``/model_info``, ``/server_info``, ``/v1/models`` ``max_model_len``) of a reference server
    started with ``args``; ``ValueError`` for options the server would refuse."""
    parser = argparse.ArgumentParser(exit_on_error=False, add_help=False)
    add_arguments(parser)
    try:
        namespace = parser.parse_args(list(args))
    except (argparse.ArgumentError, SystemExit) as exc:
        raise ValueError(f"reference server options {list(args)}: {exc}") from None
    if namespace.protocol != "sglang":
        raise ValueError(
            f"reference server options {list(args)}: --protocol vllm: see reported_vllm_identity"
        )
    config = dataclasses.replace(config_from_args(namespace), ledger=None, faults=None)
    model = Model(
        config.model_path, tokenizer=False, context_length=config.context_length,
        weight_version=config.weight_version,
    )  # fmt: skip
    info = Info(ServerState(config, model))
    return info.model_info_dict(), info.server_info_dict(), model.context_len


def reported_vllm_identity(args: Sequence[str]) -> dict[str, Any]:
    """What a vLLM-mode reference server started with ``args`` (``--protocol vllm`` and vLLM's
    flags) would answer on ``/v1/models``, ``/version`` and dev-mode ``/server_info`` (its
    ``vllm_env`` left empty), keyed by route; ``ValueError`` for options the server would refuse."""
    parser = argparse.ArgumentParser(exit_on_error=False, add_help=False)
    add_vllm_arguments(parser)
    try:
        namespace = parser.parse_args(list(args))
    except (argparse.ArgumentError, SystemExit) as exc:
        raise ValueError(f"reference server options {list(args)}: {exc}") from None
    config = dataclasses.replace(vllm_config_from_args(namespace), ledger=None, faults=None)
    model = Model(config.model_path, tokenizer=False, context_length=config.context_length)
    info = VLLMInfo(ServerState(config, model))
    assert config.vllm is not None
    server_info = {**info.server_info_dict(), "vllm_env": {}}  # the server's environment is not known here
    return {"/v1/models": info.models_dict(), "/version": {"version": config.vllm.version},
            "/server_info": server_info}  # fmt: skip
