"""``eagle3-raw serve-reference`` (also ``python -m eagle3_raw.reference``): the reference server's CLI."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3_raw.reference import READY
from eagle3_raw.reference.capacity import Timing
from eagle3_raw.reference.faults import FaultSpec
from eagle3_raw.reference.options import add_reference_options, protocol_of, redacted
from eagle3_raw.reference.server import ServerConfig, build_app
from eagle3_raw.reference.server import serve as run_server
from eagle3_raw.reference.vllm_cli import add_vllm_arguments, vllm_config_from_args
from eagle3_raw.reference.vllmapi.app import build_vllm_app

if TYPE_CHECKING:
    from eagle3_raw.reference.server import ServerConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The server's options; SGLang's names where SGLang has the option."""
    sglang = parser.add_argument_group("SGLang server options")
    sglang.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    sglang.add_argument("--port", type=int, default=30000, help="port to bind (default: 30000)")
    sglang.add_argument(
        "--api-key",
        help="require 'Authorization: Bearer KEY' (health checks stay open); every local user can read a "
        "command line: prefer --api-key-env",
    )
    sglang.add_argument(
        "--api-key-env", metavar="NAME",
        help="like --api-key, with the key read from environment variable NAME (kept off the command line)",
    )  # fmt: skip
    sglang.add_argument(
        "--model-path", type=Path,
        help="model folder (default: the packaged tiny model) or a tokenizer folder",
    )  # fmt: skip
    sglang.add_argument("--served-model-name", help="name reported by /model_info and /v1/models")
    sglang.add_argument(
        "--weight-version", default="default", help="reported in /model_info and replies (default: default)"
    )
    sglang.add_argument("--context-length", type=int, help="context length (default: the model's)")
    sglang.add_argument("--skip-tokenizer-init", action="store_true", help="no tokenizer: ids in, ids out")
    sglang.add_argument("--max-running-requests", type=int, help="reported in /server_info")
    sglang.add_argument("--max-queued-requests", type=int, help="capacity mode: 503 beyond this queue length")
    sglang.add_argument(
        "--disable-radix-cache", action="store_true", help="no prefix cache (cached_tokens 0)"
    )
    sglang.add_argument(
        "--stream-interval", type=int, default=1, help="a chunk after id 1, then every N ids (default: 1)"
    )
    sglang.add_argument(
        "--preferred-sampling-params",
        help="JSON object applied to every request's sampling_params for the keys it leaves out",
    )
    sglang.add_argument(
        "--speculative-algorithm", choices=("EAGLE", "EAGLE3", "NEXTN"),
        help="reported in /server_info; its reserved output slots count against the context, and a "
        "simulated drafter (--draft-acceptance) adds SGLang's spec_* figures to each finished meta_info",
    )  # fmt: skip
    sglang.add_argument("--speculative-num-steps", type=int, help="with --speculative-algorithm")
    sglang.add_argument("--speculative-eagle-topk", type=int, help="with --speculative-algorithm")
    sglang.add_argument("--speculative-num-draft-tokens", type=int, help="with --speculative-algorithm")
    sglang.add_argument("--speculative-draft-model-path", help="reported in /server_info (nothing is loaded)")
    sglang.add_argument("--speculative-draft-model-revision", help="reported in /server_info")
    sglang.add_argument(
        "--chat-template", type=Path, help="a Jinja file replacing the tokenizer's chat template"
    )
    sglang.add_argument(
        "--trust-remote-code", action="store_true", help="run a tokenizer folder's own code to render chats"
    )
    sglang.add_argument("--reasoning-parser", help="reported in /model_info (/separate_reasoning)")
    sglang.add_argument("--tool-call-parser", help="reported in /model_info (/parse_function_call)")
    sglang.add_argument(
        "--tp-size", "--tensor-parallel-size", type=int, default=1, help="reported in /server_info"
    )
    sglang.add_argument(
        "--dp-size", "--data-parallel-size", type=int, default=1, help="reported in /server_info"
    )
    sglang.add_argument("--revision", help="reported in /server_info (the model folder is read as it is)")
    sglang.add_argument(
        "--enable-deterministic-inference", action="store_true",
        help="accepted as SGLang's flag; the reference engine is deterministic either way",
    )  # fmt: skip
    sglang.add_argument(
        "--config", type=Path, metavar="FILE",
        help="a YAML mapping of these options (e.g. api-key: KEY), under the command line as SGLang reads it",
    )  # fmt: skip
    add_reference_options(parser)


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    """A validated :class:`ServerConfig`; raises ``ValueError`` naming the bad option."""
    timing = None if args.ms_per_token is None else Timing(args.ms_per_token, args.prefill_ms_per_token)
    return ServerConfig(
        host=args.host, port=args.port, api_key=_api_key(args), model_path=args.model_path,
        served_model_name=args.served_model_name, weight_version=args.weight_version,
        context_length=args.context_length,
        skip_tokenizer_init=args.skip_tokenizer_init, max_running_requests=args.max_running_requests,
        max_queued_requests=args.max_queued_requests, disable_radix_cache=args.disable_radix_cache,
        stream_interval=args.stream_interval,
        faults=FaultSpec.parse(args.faults, args.fault_seed) if args.faults else None,
        slots=args.slots, timing=timing, ledger=args.ledger, launch_command=redacted(sys.argv),
        preferred_sampling_params=_json_object("--preferred-sampling-params", args.preferred_sampling_params),
        speculative_algorithm=args.speculative_algorithm, speculative_num_steps=args.speculative_num_steps,
        speculative_eagle_topk=args.speculative_eagle_topk,
        speculative_num_draft_tokens=args.speculative_num_draft_tokens,
        speculative_draft_model_path=args.speculative_draft_model_path,
        speculative_draft_model_revision=args.speculative_draft_model_revision,
        draft_acceptance=args.draft_acceptance,
        chat_template=args.chat_template, reasoning_parser=args.reasoning_parser,
        tool_call_parser=args.tool_call_parser, tp_size=args.tp_size, dp_size=args.dp_size,
        revision=args.revision, trust_remote_code=args.trust_remote_code,
    )  # fmt: skip


def _api_key(args: argparse.Namespace) -> str | None:
    """``--api-key``, or the value of the variable ``--api-key-env`` names (ValueError if unset)."""
    name = getattr(args, "api_key_env", None)
    if name is None:
        return args.api_key  # type: ignore[no-any-return]
    if args.api_key is not None:
        raise ValueError("--api-key and --api-key-env: give one of them")
    if not os.environ.get(name):
        raise ValueError(f"--api-key-env {name}: that environment variable is not set")
    return os.environ[name]


def _json_object(option: str, text: str | None) -> dict[str, Any]:
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{option}: not JSON ({exc})") from exc
    if not isinstance(value, dict):
        raise ValueError(f"{option}: expected a JSON object, got {text!r}")
    return value


def apply_config_file(args: argparse.Namespace) -> None:
    """Fill in ``args`` from the YAML mapping ``--config`` names, as SGLang does: a key is an
    option's long name (``api-key`` or ``api_key``), and an option given on the command line (not
    left at its default) wins. ValueError for a file that cannot be read or an unknown key."""
    import yaml

    if getattr(args, "config", None) is None:
        return
    try:
        data = yaml.safe_load(Path(args.config).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"--config {args.config}: cannot read it ({exc})") from exc
    if not isinstance(data, dict):
        raise ValueError(f"--config {args.config}: expected a YAML mapping of options")
    parser = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    add_arguments(parser)
    for key, value in data.items():
        dest = str(key).replace("-", "_")
        if not hasattr(args, dest) or dest == "config":
            raise ValueError(f"--config {args.config}: {key!r} is not a serve-reference option")
        if getattr(args, dest) == parser.get_default(dest):
            setattr(args, dest, _option_value(parser, dest, value))


def _option_value(parser: argparse.ArgumentParser, dest: str, value: Any) -> Any:
    """``value`` as the option ``dest`` would have parsed it from the command line."""
    if isinstance(value, bool):
        return value
    flag = "--" + dest.replace("_", "-")
    try:
        return getattr(parser.parse_args([flag, str(value)]), dest)
    except (argparse.ArgumentError, SystemExit) as exc:
        raise ValueError(f"--config: {dest}: {exc}") from None


def serve(args: argparse.Namespace) -> int:
    """Run the server until SIGINT/SIGTERM; returns the process exit code (2: bad options)."""
    started = time.monotonic()
    try:
        config = _config(args)
    except ValueError as exc:
        print(f"serve-reference: {exc}", file=sys.stderr)
        return 2

    def ready(url: str) -> None:
        print(
            f"{READY}{url} in {time.monotonic() - started:.2f} s",
            file=sys.stderr,
            flush=True,
        )

    try:
        asyncio.run(_serve_until_signalled(config, ready, exit_with_stdin=args.exit_with_stdin))
    except (ValueError, OSError) as exc:
        print(f"serve-reference: {exc}", file=sys.stderr)
        return 1
    return 0


def _config(args: argparse.Namespace) -> ServerConfig:
    """The configuration of ``args``, parsed with vLLM's flags (``--protocol vllm``) or SGLang's."""
    if getattr(args, "vllm_flags", False):
        return vllm_config_from_args(args)
    apply_config_file(args)
    if args.protocol != "sglang":
        raise ValueError(
            "--protocol vllm takes vLLM's own flags: run python -m eagle3_raw.reference --protocol vllm ..."
        )
    return config_from_args(args)


async def _serve_until_signalled(
    config: ServerConfig, ready: Callable[[str], None], *, exit_with_stdin: bool = False
) -> None:
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, task.cancel)
    if exit_with_stdin:
        threading.Thread(target=_cancel_at_stdin_eof, args=(loop, task), daemon=True).start()
    try:
        build = build_app if config.vllm is None else build_vllm_app
        await run_server(config, ready=ready, build=build)
    except asyncio.CancelledError:
        return


def _cancel_at_stdin_eof(loop: asyncio.AbstractEventLoop, task: asyncio.Task[None]) -> None:
    """Read and discard stdin until end of file, then cancel ``task`` as SIGTERM would."""
    # os.read on the raw descriptor, not sys.stdin.buffer: a daemon thread blocked inside a buffered
    # reader holds its lock, and interpreter shutdown then aborts with "could not acquire lock".
    try:
        while os.read(0, 65536):
            pass
    except OSError:
        pass  # no usable stdin counts as end of file
    with contextlib.suppress(RuntimeError):  # the loop already closed: the server is stopping anyway
        loop.call_soon_threadsafe(task.cancel)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m eagle3_raw.reference [options]`` (``--protocol vllm``: vLLM's API and flags)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    vllm = protocol_of(argv) == "vllm"
    api = "vLLM 0.33's token-exact API" if vllm else "SGLang 0.5.23's native API"
    parser = argparse.ArgumentParser(
        prog="python -m eagle3_raw.reference",
        description=f"Serve {api} with the built-in tiny reference model.",
        allow_abbrev=False,  # an option is the one its full name says (see launch.check_launch_args)
    )
    (add_vllm_arguments if vllm else add_arguments)(parser)
    return serve(parser.parse_args(argv))
