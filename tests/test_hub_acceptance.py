"""A speculating set's push (issue 24): the manifest's acceptance summary is what the pushed rows
give, the card shows it with the drafter, and the plot is a PNG beside the recipe; a set without a
drafter publishes none of it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import datasets
import orjson
import pytest
import yaml

from eagle3_raw import hub
from eagle3_raw.acceptance import records_of_table, summarize
from eagle3_raw.resources import builder_scripts_dir

try:
    from tests.support.hub_server import HubServer
    from tests.support.hub_server import hub as hub_fixture
except ModuleNotFoundError:  # `tests` is a package only when the repo root is on sys.path
    from support.hub_server import HubServer  # type: ignore[no-redef]
    from support.hub_server import hub as hub_fixture  # type: ignore[no-redef]

emulator = hub_fixture
__all__ = ["emulator"]  # a fixture used by name

REPO = "alice/eagle"
SPECULATE = [
    "--speculative-algorithm", "EAGLE3", "--speculative-num-draft-tokens", "4",
    "--speculative-draft-model-path", "drafts/v1", "--draft-acceptance", "0.5",
]  # fmt: skip


def _recipe(folder: Path, launch_args: list[str], **prompts: Any) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rows = [
        orjson.loads(line)
        for line in (builder_scripts_dir() / "prompts" / "plain.jsonl").read_bytes().splitlines()
    ]
    (folder / "plain.jsonl").write_bytes(
        b"".join(
            orjson.dumps({**row, "level": ["easy", "hard"][i % 2]}) + b"\n" for i, row in enumerate(rows[:6])
        )
    )
    raw = {
        "name": "spec",
        "prompts": {"source": "plain.jsonl", "id_column": "id", **prompts},
        "server": {"launch": "reference", "launch_args": launch_args},
        "sampling": {"max_new_tokens": 40, "temperature": 0},
    }
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _push(recipe: Path, tmp_path: Path) -> hub.PushResult:
    options = {"journal_dir": tmp_path / "journals", "progress": "none"}
    return hub.push(str(recipe), REPO, run_options=options)


@pytest.fixture()
def token(emulator: HubServer, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("HF_TOKEN", emulator.tokens.write)
    return emulator.tokens.write


@pytest.mark.slow
def test_a_speculating_sets_card_shows_its_drafters_acceptance(
    emulator: HubServer, token: str, tmp_path: Path
) -> None:
    result = _push(_recipe(tmp_path / "r", SPECULATE, category_column="level"), tmp_path)
    files = emulator.files(REPO)
    manifest = orjson.loads(files["recipes/spec.manifest.json"])
    rows = datasets.load_dataset(REPO, "spec", revision=result.commit, split="train", token=token)
    categories = {
        row["id"]: row["level"]
        for row in map(orjson.loads, (tmp_path / "r" / "plain.jsonl").read_bytes().splitlines())
    }
    expected = summarize(records_of_table(rows.data.table, categories))
    assert manifest["acceptance"]["summary"] == orjson.loads(orjson.dumps(expected.to_dict()))
    assert expected.overall.measured == len(rows) == 6
    assert set(manifest["acceptance"]["summary"]["groups"]["category"]) == {"easy", "hard"}
    assert manifest["target"]["drafter"]["speculative_draft_model_path"] == "drafts/v1"
    assert files[manifest["acceptance"]["plot"]].startswith(b"\x89PNG\r\n\x1a\n")
    card = files["README.md"].decode()
    assert "### Acceptance" in card and "`speculative_draft_model_path=drafts/v1`" in card
    assert f"]({manifest['acceptance']['plot']})" in card
    overall = expected.overall
    assert f"| **all rows** | 6 | 6 | {overall.accept_length:.3f} | {overall.accept_rate:.3f} |" in card
    assert "| category easy |" in card and "| finish reason " in card


@pytest.mark.slow
def test_a_set_without_a_drafter_publishes_no_acceptance(
    emulator: HubServer, token: str, tmp_path: Path
) -> None:
    _push(_recipe(tmp_path / "r", []), tmp_path)
    files = emulator.files(REPO)
    manifest = orjson.loads(files["recipes/spec.manifest.json"])
    assert manifest["acceptance"] is None and "drafter" not in manifest["target"]
    assert "### Acceptance" not in files["README.md"].decode()
    assert "recipes/spec.acceptance.png" not in files
