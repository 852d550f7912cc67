"""A set built on the real SGLang goes to the Hub and back unchanged, and ``eagle3-raw reproduce
--set server.endpoints=[<the real server>]`` regenerates it there with every row identical."""

from __future__ import annotations

import argparse
import shutil
from collections.abc import Iterator
from pathlib import Path

import datasets
import pytest
import yaml

from eagle3_raw import hub
from eagle3_raw.cli import hub as hub_cli
from eagle3_raw.recipe import load_recipe
from eagle3_raw.resources import builder_scripts_dir
from tests.helpers import rid_run
from tests.real_sglang.server import RealSGLang
from tests.support.hub_server import HubServer

REPO = "alice/real-sglang"


def _recipe(folder: Path, url: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(builder_scripts_dir() / "prompts" / "openai.jsonl", folder / "openai.jsonl")
    raw = {
        "name": "real", "license": "apache-2.0",
        "prompts": {"source": "openai.jsonl", "limit": 6},
        "turns": "all",
        "model": {"tokenizer": "reference"},  # the files the real server's model folder has
        "server": {"endpoints": [url]},
        "sampling": {"max_new_tokens": 32, "temperature": 0.0},
    }  # fmt: skip
    path = folder / "real.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.fixture
def emulator(hub_server: HubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HubServer]:
    """The Hub test server, this process's ``huggingface_hub`` and ``datasets`` pointed at it."""
    with hub_server.pointed_at(tmp_path / "hf-home"):
        monkeypatch.setenv("HF_TOKEN", hub_server.tokens.write)
        yield hub_server


def test_a_set_built_on_the_real_server_round_trips_the_hub_and_reproduces_identically_on_it(
    emulator: HubServer, real_server: RealSGLang, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = _recipe(tmp_path / "r", real_server.url)
    options = {"journal_dir": tmp_path / "j", "progress": "none"}
    pushed = hub.push(str(recipe), REPO, tag="v1", run_options=options)
    built = hub.build(load_recipe(recipe), run_options=options)
    assert not built.generated and pushed.rows == len(built.dataset) > 6
    published = datasets.load_dataset(REPO, "real", revision="v1", split="train", token=emulator.tokens.write)
    assert isinstance(published, datasets.Dataset) and published.to_list() == built.dataset.to_list()

    runs_before = {rid_run(rid) for rid in real_server.received_rids()}
    parser = argparse.ArgumentParser(prog="eagle3-raw")
    hub_cli.add_reproduce(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["reproduce", f"{REPO}@v1", "--quiet", "--strict",
                              "--set", f"server.endpoints=[{real_server.url}]"])  # fmt: skip
    assert args.handler(args) == 0
    out = capsys.readouterr().out
    assert f"identical         {pushed.rows} of {pushed.rows} (100.0%)" in out and "full agreement" in out
    received = [rid_run(rid) for rid in real_server.received_rids()]
    (run,) = set(received) - runs_before  # the reproduction really asked the real server, once per row
    assert received.count(run) == pushed.rows
