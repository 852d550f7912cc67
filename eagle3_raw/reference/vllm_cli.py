"""``python -m eagle3_raw.reference --protocol vllm``: the reference server's vLLM mode, with vLLM's
own flag spellings, so it can stand in for ``python -m vllm.entrypoints.openai.api_server`` in a
launch (``executable: [python, -m, eagle3_raw.reference, --protocol, vllm]`` then the launcher's flags).

vLLM's flags map onto the same :class:`ServerConfig` as SGLang's (``--model`` is ``--model-path``,
``--max-model-len`` ``--context-length``, ...); the vLLM-only ones go to :class:`VLLMOptions`.
``--load-format`` is accepted and ignored (no weights are loaded); ``--dtype``,
``--generation-config``, ``--max-num-seqs`` and ``--seed`` are reported by dev-mode ``/server_info``.
The key: ``--api-key``, else ``--api-key-env NAME``, else vLLM's ``VLLM_API_KEY`` variable.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from eagle3_raw.reference.capacity import Timing
from eagle3_raw.reference.faults import FaultSpec
from eagle3_raw.reference.options import add_reference_options, redacted
from eagle3_raw.reference.server import ServerConfig
from eagle3_raw.reference.vllmapi.options import VLLMOptions

KEY_VARIABLE = "VLLM_API_KEY"


def add_vllm_arguments(parser: argparse.ArgumentParser) -> None:
    """vLLM 0.33's spellings of the options the reference honours or reports."""
    v = parser.add_argument_group("vLLM server options")
    v.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    v.add_argument("--port", type=int, default=8000, help="port to bind (default: 8000)")
    v.add_argument(
        "--api-key", help=f"require 'Authorization: Bearer KEY' on /v1 and /inference (else ${KEY_VARIABLE})"
    )
    v.add_argument(
        "--api-key-env", metavar="NAME", help="like --api-key, read from environment variable NAME"
    )
    v.add_argument(
        "--model", type=Path, help="model folder (default: the packaged tiny model) or a tokenizer folder"
    )
    v.add_argument("--served-model-name", help="the name /v1/models reports and requests may give")
    v.add_argument("--max-model-len", type=int, help="context length (default: the model's)")
    v.add_argument("--max-num-seqs", type=int, help="reported in dev-mode /server_info (scheduler_config)")
    v.add_argument("--tensor-parallel-size", "-tp", type=int, default=1, help="reported")
    v.add_argument("--data-parallel-size", "-dp", type=int, default=1, help="reported")
    v.add_argument("--revision", help="reported (the model folder is read as it is)")
    v.add_argument("--seed", type=int, default=0, help="reported (per-request seeds decide sampling)")
    v.add_argument("--reasoning-parser", help="qwen3 or deepseek_r1: splits derendered outputs")
    v.add_argument("--tool-call-parser", help="hermes (or its alias qwen3_json): tool calls in derender")
    v.add_argument(
        "--enable-auto-tool-choice", action="store_true", help="parse tool calls under tool_choice auto"
    )
    v.add_argument(
        "--enable-scale-out", action="store_true", help="serve /inference/v1/*, render and derender"
    )
    v.add_argument("--load-format", help="accepted and ignored (the reference loads no weights)")
    v.add_argument("--generation-config", default="auto", help="reported")
    v.add_argument("--dtype", default="auto", help="reported")
    v.add_argument("--tokenizer-mode", default="auto", help="reported")
    v.add_argument("--trust-remote-code", action="store_true", help="run a tokenizer folder's own code")
    v.add_argument("--chat-template", type=Path, help="a Jinja file replacing the tokenizer's chat template")
    v.add_argument("--vllm-version", default="0.32.0", help="what /version reports (default: 0.32.0)")
    add_reference_options(parser, speculative=False)
    parser.set_defaults(vllm_flags=True)


def vllm_config_from_args(args: argparse.Namespace) -> ServerConfig:
    """A validated vLLM-mode :class:`ServerConfig`; ``ValueError`` naming the bad option."""
    timing = None if args.ms_per_token is None else Timing(args.ms_per_token, args.prefill_ms_per_token)
    options = VLLMOptions(
        version=args.vllm_version, enable_scale_out=args.enable_scale_out,
        enable_auto_tool_choice=args.enable_auto_tool_choice, max_num_seqs=args.max_num_seqs,
        seed=args.seed, dtype=args.dtype, generation_config=args.generation_config,
        tokenizer_mode=args.tokenizer_mode,
    )  # fmt: skip
    return ServerConfig(
        host=args.host, port=args.port, api_key=_api_key(args), model_path=args.model,
        served_model_name=args.served_model_name, context_length=args.max_model_len,
        faults=FaultSpec.parse(args.faults, args.fault_seed) if args.faults else None,
        slots=args.slots, timing=timing, ledger=args.ledger, launch_command=redacted(sys.argv),
        chat_template=args.chat_template, reasoning_parser=args.reasoning_parser,
        tool_call_parser=args.tool_call_parser, tp_size=args.tensor_parallel_size,
        dp_size=args.data_parallel_size, revision=args.revision, trust_remote_code=args.trust_remote_code,
        max_running_requests=args.max_num_seqs, vllm=options,
    )  # fmt: skip


def _api_key(args: argparse.Namespace) -> str | None:
    if args.api_key is not None and args.api_key_env is not None:
        raise ValueError("--api-key and --api-key-env: give one of them")
    if args.api_key_env is not None:
        if not os.environ.get(args.api_key_env):
            raise ValueError(f"--api-key-env {args.api_key_env}: that environment variable is not set")
        return os.environ[args.api_key_env]
    return args.api_key or os.environ.get(KEY_VARIABLE) or None
