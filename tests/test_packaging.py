"""An installed wheel carries what a user needs: the reference model, the card templates, the demo."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from eagle3_raw.identity import set_config_id
from eagle3_raw.recipe import load_recipe
from eagle3_raw.run.target import reference_target

ROOT = Path(__file__).resolve().parent.parent

CHECK = """
import eagle3_raw, eagle3_raw.resources as r
import eagle3_raw.builder, eagle3_raw.hub, eagle3_raw.journal, eagle3_raw.reference.server
import eagle3_raw.cli.main
from eagle3_raw.identity import set_config_id
from eagle3_raw.recipe import load_recipe
from eagle3_raw.run.target import reference_target
assert "site" in eagle3_raw.__file__ or "target" in eagle3_raw.__file__, eagle3_raw.__file__
print(sorted(p.name for p in r.dataset_cards_dir().iterdir()))
from eagle3_raw.identity import set_config_id
from eagle3_raw.run.target import reference_target
print(set_config_id(load_recipe("demo"), reference_target(load_recipe("demo").server.launch_args)))
print((r.reference_model_dir() / "tokenizer.json").is_file())
"""


@pytest.mark.slow
def test_wheel_ships_cards_recipes_and_reference_model(tmp_path: Path) -> None:
    pip = [sys.executable, "-m", "pip"]
    subprocess.run([*pip, "wheel", "-q", "--no-deps", "-w", str(tmp_path / "dist"), str(ROOT)], check=True)
    [wheel] = (tmp_path / "dist").glob("eagle3_raw-*.whl")
    target = tmp_path / "target"
    subprocess.run([*pip, "install", "-q", "--no-deps", "--target", str(target), str(wheel)], check=True)
    result = subprocess.run(
        [sys.executable, "-c", CHECK], cwd=tmp_path, capture_output=True, text=True,
        env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    cards, config_id, tokenizer = result.stdout.splitlines()
    assert "config_section.md.j2" in cards and "intro.md.j2" in cards
    assert tokenizer == "True"
    demo = load_recipe("demo")
    # same files and code, same reference model: the same config id wherever installed
    assert config_id == set_config_id(demo, reference_target(demo.server.launch_args))
