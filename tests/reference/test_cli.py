"""``eagle3-raw serve-reference`` / ``python -m eagle3_raw.reference``: options and their validation."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from eagle3_raw.cli.main import build_parser
from eagle3_raw.reference.cli import add_arguments, config_from_args
from tests.support.pace import scaled


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def test_the_eagle3_raw_command_has_serve_reference() -> None:
    args = build_parser().parse_args(
        ["serve-reference", "--port", "31000", "--slots", "2", "--ms-per-token", "1.5"]
    )
    config = config_from_args(args)
    assert (config.port, config.slots, config.timing and config.timing.ms_per_token) == (31000, 2, 1.5)


def test_defaults_are_sglangs() -> None:
    config = config_from_args(parse())
    assert (config.host, config.port, config.stream_interval, config.context_length) == (
        "127.0.0.1",
        30000,
        1,
        None,
    )
    assert config.faults is None and config.slots is None and config.ledger is None


def test_fault_options_are_parsed_with_their_seed() -> None:
    config = config_from_args(parse("--faults", "http500=0.05,hang=0.01", "--fault-seed", "9"))
    assert config.faults is not None and dict(config.faults.rates) == {"http500": 0.05, "hang": 0.01}
    assert config.faults.seed == 9


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--slots", "2"], "--slots and --ms-per-token go together"),
        (["--ms-per-token", "2"], "--slots and --ms-per-token go together"),
        (["--slots", "0", "--ms-per-token", "1"], "--slots must be at least 1"),
        (["--faults", "http500=2"], "the rate must be a number in [0, 1]"),
        (["--faults", "boom=0.1"], "expected kind=rate"),
        (["--context-length", "4"], "--context-length must be at least 8"),
        (["--max-queued-requests", "3"], "--max-queued-requests needs capacity mode"),
    ],
)
def test_bad_options_are_refused_with_a_message(argv: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        config_from_args(parse(*argv))


def test_python_m_exits_2_on_bad_options() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "eagle3_raw.reference", "--slots", "3"],
        capture_output=True,
        text=True,
        timeout=scaled(30),
    )
    assert done.returncode == 2 and "--slots and --ms-per-token go together" in done.stderr


def test_a_context_length_beyond_the_model_is_refused_at_start() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "eagle3_raw.reference", "--context-length", "100000", "--port", "1"],
        capture_output=True,
        text=True,
        timeout=scaled(30),
    )
    assert done.returncode == 1 and "greater than the model's max_position_embeddings (4096)" in done.stderr
