"""The README's Quick start is what CI and new users run: keep it true to the code."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from eagle3_raw.recipe import ServerConfig

ROOT = Path(__file__).resolve().parent.parent


def _quick_start() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.+?)\n```", section)


def test_quick_start_has_the_two_commands_ci_runs_the_test_one() -> None:
    demo, tests = _quick_start()
    assert "pip install -e ." in demo and "eagle3-raw build builder_scripts/demo.yaml" in demo
    assert 'pip install -e ".[test,ray]"' in tests
    # CI runs the real-server tiers too, each in a process of its own (one real server per tier)
    assert tests.endswith(
        'pytest -n 3 -m "not real_sglang and not real_vllm" && pytest -m real_sglang && pytest -m real_vllm'
    )
    matching = [
        line
        for line in (ROOT / "README.md").read_text().splitlines()
        if re.match(r"^python3 -m venv .*pytest", line)
    ]
    assert matching == [tests]  # .ci/run greps exactly this line
    assert "grep -E '^python3 -m venv .*pytest' README.md" in (ROOT / ".ci" / "run").read_text()


def test_demo_recipe_and_cli_commands_in_the_readme_exist() -> None:
    from eagle3_raw.cli.main import build_parser

    assert (ROOT / "builder_scripts" / "demo.yaml").is_file()
    commands = set(re.findall(r"`eagle3-raw ([a-z][a-z-]+)", (ROOT / "README.md").read_text()))
    known = set(build_parser()._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
    assert commands <= known, commands - known


@pytest.mark.slow
def test_the_readmes_demo_numbers_are_what_the_demo_set_gives(tmp_path: Path) -> None:
    """Issue 21 finding 8: the Quick start's counts and the export example under "Training a draft
    model" are what the demo set gives now (built with the reference server, as the README says)."""
    text = (ROOT / "README.md").read_text()
    quick = re.search(r"build the demo set \((\d+) conversations, ([\d,]+) rows\)", text)
    example = re.search(r"```\n\$ (eagle3-raw export demo .+?)\n\.\.\.\n(.+?)\n```", text, re.S)
    assert quick is not None and example is not None
    environment = {
        **os.environ,
        "EAGLE3_RAW_JOURNAL_DIR": str(tmp_path / "j"),
        "HF_DATASETS_CACHE": str(tmp_path / "c"),
    }
    command = example[1].removeprefix("eagle3-raw ").split()
    done = subprocess.run(
        [sys.executable, "-m", "eagle3_raw.cli", *command], cwd=tmp_path, env=environment,
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    for line in example[2].splitlines():
        assert line in done.stdout.splitlines(), (line, done.stdout)
    rows = re.search(r"recipe demo as specforge: \d+ of ([\d,]+) rows", done.stdout)
    assert rows is not None and rows[1] == quick[2]
    prompts = (ROOT / "builder_scripts" / "prompts").glob("*.jsonl")
    assert sum(1 for path in prompts for line in path.open() if line.strip()) == int(quick[1])


def test_the_recipe_reference_lists_every_server_setting_with_its_default() -> None:
    """The README's recipe block is the users' reference: each ``server`` setting of the code is
    there with the code's default (``server.startup_timeout``, issue 21 finding 10, among them)."""
    text = (ROOT / "README.md").read_text().split("## The recipe", 1)[1]
    reference = yaml.safe_load(re.search(r"```yaml\n(.+?)\n```", text, re.S).group(1))  # type: ignore[union-attr]
    fields = {f.name: f.default for f in dataclasses.fields(ServerConfig)}
    assert set(reference["server"]) == set(fields)
    scalars = {k: v for k, v in fields.items() if k not in ("endpoints", "launch_args")}
    assert {k: reference["server"][k] for k in scalars} == scalars
