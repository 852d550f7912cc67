"""The reference server's own options, shared by its SGLang and vLLM modes: ``--protocol``, faults,
capacity mode, the ledger, ``--exit-with-stdin``; and the command line as the server reports it.
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Sequence
from pathlib import Path

PROTOCOLS = ("sglang", "vllm")


def protocol_of(argv: Sequence[str]) -> str:
    """The ``--protocol`` a command line asks for (``sglang`` when it names none)."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--protocol", choices=PROTOCOLS, default="sglang")
    known, _ = parser.parse_known_args(list(argv))
    return str(known.protocol)


def add_reference_options(parser: argparse.ArgumentParser, *, speculative: bool = True) -> None:
    """The reference's own options (faults, capacity mode, ledger, ``--protocol``), in both modes;
    ``--draft-acceptance`` only where a drafter can be simulated (SGLang mode)."""
    ref = parser.add_argument_group("reference server options")
    ref.add_argument(
        "--protocol", choices=PROTOCOLS, default="sglang",
        help="whose HTTP API to speak: sglang (SGLang 0.5.23's, the default) or vllm (vLLM 0.33's "
        "token-exact routes, with vLLM's flag spellings: python -m eagle3_raw.reference --protocol vllm -h)",
    )  # fmt: skip
    ref.add_argument(
        "--faults", help='fault rates per /generate request, e.g. "http500=0.05,reset=0.02,hang=0.01"'
    )
    ref.add_argument("--fault-seed", type=int, help="seed of the fault sequence (default: random)")
    ref.add_argument("--slots", type=int, help="capacity mode: simulated decode slots")
    ref.add_argument("--ms-per-token", type=float, help="capacity mode: milliseconds per generated token")
    ref.add_argument(
        "--prefill-ms-per-token", type=float, default=0.0, help="capacity mode: ms per uncached prompt token"
    )
    if speculative:
        ref.add_argument(
            "--draft-acceptance", type=float, default=0.7,
            help="with --speculative-algorithm: how good the simulated drafter is, in (0, 1] (default 0.7)",
        )  # fmt: skip
    ref.add_argument("--ledger", type=Path, help="append one JSON line per /generate outcome to this file")
    ref.add_argument(
        "--exit-with-stdin",
        action="store_true",
        help="shut down (as on SIGTERM) when stdin reaches end of file, e.g. when the launching process dies",
    )


def redacted(argv: Sequence[str]) -> str:
    """The command line as ``/server_info`` reports it, with the API key masked."""
    words = list(argv)
    for i, word in enumerate(words):
        if word == "--api-key" and i + 1 < len(words):
            words[i + 1] = "***"
        elif word.startswith("--api-key="):
            words[i] = "--api-key=***"
    return shlex.join(words)
