"""Issue 21, finding 9: with no network, a recipe naming a Hub tokenizer id took 100 s and 44
retry warnings of ``huggingface_hub`` before its error. Now one short connect says the Hub cannot
be reached, and the build stops with one message naming the id and what to do instead."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eagle3_raw.launching.reference import free_port
from tests.helpers import reference_server, write_prompts, write_recipe
from tests.support.pace import scaled


@pytest.mark.slow
def test_an_unreachable_hub_tokenizer_id_fails_at_once_with_one_clear_message(tmp_path: Path) -> None:
    write_prompts(tmp_path, 2)
    hub = f"http://127.0.0.1:{free_port()}"  # nothing listens: the Hub does not answer
    env = {**os.environ, "HF_ENDPOINT": hub, "HF_HOME": str(tmp_path / "hf")}  # an empty cache
    env.pop("HF_HUB_OFFLINE", None)
    with reference_server(tmp_path) as (server, _):
        recipe = write_recipe(tmp_path, endpoints=[server.url], model={"tokenizer": "org/some-tokenizer"})
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "eagle3_raw.cli", "build", str(recipe),
             "--journal-dir", str(tmp_path / "j"), "--cache-dir", str(tmp_path / "cache"), "--quiet"],
            capture_output=True, text=True, timeout=scaled(120), env=env,
        )  # fmt: skip
        took = time.monotonic() - started
    print(f"failed after {took:.1f} s")
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Retry" not in done.stderr and "Traceback" not in done.stderr, done.stderr[-3000:]
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert "'org/some-tokenizer'" in line and "the Hub cannot be reached" in line, line
    assert "local tokenizer folder" in line and "HF_HUB_OFFLINE" in line, line
