"""``eagle3-raw inspect`` and ``eagle3-raw stats`` on a set built from a recipe (issue 14): the real
reference tokenizer decodes the rows, the real cache holds the set; styled output is checked in a
pseudo-terminal, plain output through a pipe."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from eagle3_raw.cli.main import main
from eagle3_raw.cli.stats import binned, drawn
from tests.helpers import (
    CHATS,
    reference_server,
    run_in_terminal,
    strip_terminal_codes,
    write_jsonl,
    write_recipe,
)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A recipe built into ``<folder>/c``: the CHATS conversations, every turn, two samples."""
    folder = tmp_path_factory.mktemp("built")
    write_jsonl(folder / "prompts.jsonl", CHATS)
    with reference_server(folder) as (server, _):
        recipe = write_recipe(folder, endpoints=[server.url], turns="all", sampling={"samples_per_prompt": 2})
        argv = [
            "build",
            str(recipe),
            "--quiet",
            "--journal-dir",
            str(folder / "j"),
            "--cache-dir",
            str(folder / "c"),
        ]
        assert main(argv) == 0
    return folder


def _cli(built: Path, *argv: str) -> list[str]:
    recipe = built / "recipe.yaml"
    return [
        sys.executable,
        "-m",
        "eagle3_raw.cli.main",
        argv[0],
        str(recipe),
        "--cache-dir",
        str(built / "c"),
        "--journal-dir",
        str(built / "j"),
        *argv[1:],
    ]


@pytest.mark.slow
def test_inspect_through_a_pipe_marks_the_generated_span_and_shows_special_tokens(built: Path) -> None:
    done = subprocess.run(_cli(built, "inspect", "--row", "tools-1:4:1"), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert re.match(r"recipe t \(t-[0-9a-f]{16}\): 12 rows\n", out)
    assert "── row " in out and ": tools-1:4:1 (source tools-1, turn 4, sample 1)" in out
    prompt, generated = out.split("⟦generated⟧")
    assert "<|im_start|>user\nWeather in Paris?<|im_end|>" in prompt  # special tokens as themselves
    assert "<tool_call>" in prompt and "get_weather" in prompt  # the tool call in the history
    assert generated.rstrip().endswith("⟦/generated⟧")
    assert "\x1b[" not in out  # no colour codes into a pipe


def test_inspect_selects_by_source_id_index_and_limit(
    built: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["--cache-dir", str(built / "c"), "--journal-dir", str(built / "j")]
    recipe = str(built / "recipe.yaml")
    assert main(["inspect", recipe, "--row", "share-1", "--limit", "10", *base]) == 0
    ids = re.findall(r"── row \d+: (\S+) ", capsys.readouterr().out)
    assert ids == ["share-1:1:0", "share-1:1:1", "share-1:3:0", "share-1:3:1"]
    assert main(["inspect", recipe, "--index", "2", "--limit", "2", *base]) == 0
    assert re.findall(r"── row (\d+):", capsys.readouterr().out) == ["2", "3"]
    assert main(["inspect", recipe, "--row", "nope", *base]) == 1
    assert "no row has id or source_id 'nope'" in capsys.readouterr().err
    assert main(["inspect", recipe, "--index", "999", *base]) == 1
    assert "--index 999: the set has" in capsys.readouterr().err


@pytest.mark.slow
def test_inspect_in_a_terminal_styles_the_spans_instead_of_marking_them(built: Path) -> None:
    code, raw = run_in_terminal(_cli(built, "inspect", "--limit", "1"), columns=100, raw=True)
    assert code == 0, raw
    text = strip_terminal_codes(raw)
    assert "⟦generated⟧" not in text and "<|im_end|>" in text  # styled, not marked; tokens visible
    assert re.search(r"\x1b\[2;7;36m<\|im_start\|>", raw)  # a special token of the prompt: dim, reversed
    assert re.search(r"\x1b\[1m[^\x1b]+\x1b\[0m", raw.split("assistant", 1)[1])  # the generated span: bold


def test_a_recipe_that_was_not_built_says_how_to_build_it(
    built: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = str(built / "recipe.yaml")
    where = ["--cache-dir", str(built / "c"), "--journal-dir", str(built / "j")]
    code = main(["stats", recipe, "--set", "sampling.max_new_tokens=5", *where])
    assert code == 1
    err = capsys.readouterr().err
    assert "is not built in the datasets cache" in err and f"`eagle3-raw build {recipe}`" in err


@pytest.mark.slow
def test_stats_through_a_pipe_are_plain_numbers(built: Path) -> None:
    done = subprocess.run(_cli(built, "stats"), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    rows = int(re.search(r": (\d+) rows", out.splitlines()[0])[1])  # type: ignore[index]
    assert re.search(r"^prompt +\d+ +\d+ +\d+ +\d+ +\d+ +[\d.]+$", out, re.MULTILINE)
    assert "generated tokens per row" in out and "▁" not in out and "█" not in out
    reasons = dict(re.findall(r"^  (stop|length) +(\d+) ", out, re.MULTILINE))
    assert sum(map(int, reasons.values())) == rows


@pytest.mark.slow
def test_stats_in_a_terminal_draw_the_histograms(built: Path) -> None:
    code, text = run_in_terminal(_cli(built, "stats"), columns=80)
    assert code == 0, text
    assert re.search(r"^  [ ▁▂▃▄▅▆▇█]{8,}\r?$", text, re.MULTILINE), text
    assert "tallest bin" in text and "█" in text


def test_histogram_lines() -> None:
    values = [10] * 5 + [20] * 10 + [30]
    bar, axis = drawn(values, width=24)
    assert bar.strip() and set(bar[2:]) <= set(" ▁▂▃▄▅▆▇█") and "█" in bar
    assert axis.strip().startswith("10") and "30 tokens (tallest bin: 10 rows)" in axis
    lines = binned(values, bins=3)
    assert [int(line.split()[-1]) for line in lines] == [5, 10, 1]
    assert binned([]) == drawn([], 80) == ["  (no rows)"]
    assert drawn([7, 7, 7], 80) == ["  █", "  every row: 7 tokens"]
