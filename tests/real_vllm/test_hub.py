"""A set built on the real vLLM goes to the Hub and back unchanged, its card and manifest name the
engine, and ``eagle3-raw reproduce --set server.endpoints=[<the real vLLM>]`` regenerates it there
with every row identical."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import datasets
import huggingface_hub
import pytest

from eagle3_raw import hub
from eagle3_raw.cli import hub as hub_cli
from eagle3_raw.recipe import load_recipe
from tests.helpers import write_jsonl, write_recipe
from tests.real_vllm.server import RealVLLM
from tests.support.hub_server import HubServer
from tests.test_rendering import ROWS

REPO = "alice/real-vllm"


@pytest.fixture
def emulator(hub_server: HubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HubServer]:
    """The Hub test server, this process's ``huggingface_hub`` and ``datasets`` pointed at it."""
    with hub_server.pointed_at(tmp_path / "hf-home"):
        monkeypatch.setenv("HF_TOKEN", hub_server.tokens.write)
        yield hub_server


def test_a_set_built_on_the_real_vllm_round_trips_the_hub_and_reproduces_identically_on_it(
    emulator: HubServer,
    real_vllm: RealVLLM,
    vllm_model: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    folder = tmp_path / "r"
    folder.mkdir()
    write_jsonl(folder / "prompts.jsonl", ROWS[:4])
    recipe = write_recipe(
        folder, endpoints=[real_vllm.url], turns="all", license="apache-2.0",
        model={"tokenizer": str(vllm_model)}, sampling={"max_new_tokens": 16, "temperature": 0.0},
    )  # fmt: skip
    options = {"journal_dir": tmp_path / "j", "progress": "none"}
    pushed = hub.push(str(recipe), REPO, tag="v1", run_options=options)
    built = hub.build(load_recipe(recipe), run_options=options)
    assert not built.generated and pushed.rows == len(built.dataset) >= 4
    published = datasets.load_dataset(REPO, "t", revision="v1", split="train", token=emulator.tokens.write)
    assert isinstance(published, datasets.Dataset) and published.to_list() == built.dataset.to_list()
    card = huggingface_hub.hf_hub_download(REPO, "README.md", repo_type="dataset", revision="v1")
    assert "**Server**: vLLM `0.32.0` serving" in Path(card).read_text()

    parser = argparse.ArgumentParser(prog="eagle3-raw")
    hub_cli.add_reproduce(parser.add_subparsers(dest="command", required=True))
    # a local tokenizer folder is not uploaded: the reproduction names it again
    args = parser.parse_args(["reproduce", f"{REPO}@v1", "--quiet", "--strict",
                              "--set", f"server.endpoints=[{real_vllm.url}]",
                              "--set", f"model.tokenizer={vllm_model}"])  # fmt: skip
    before = real_vllm.log().count('"POST /v1/completions HTTP/1.1" 200')
    assert args.handler(args) == 0
    out = capsys.readouterr().out
    assert f"identical         {pushed.rows} of {pushed.rows} (100.0%)" in out and "full agreement" in out
    assert real_vllm.log().count('"POST /v1/completions HTTP/1.1" 200') - before == pushed.rows  # asked again
