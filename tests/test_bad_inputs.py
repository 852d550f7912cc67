"""No traceback from any input (issue 21, finding 7): URLs aiohttp or urllib would raise on, dates
PyYAML would raise on, and repeated YAML keys PyYAML would silently resolve, each refused through
the command line as one ``error: ...`` line naming the field (or the line), with exit code 1.

Driven through ``eagle3_raw.cli.main.main``; nothing here needs a server (the recipe is refused before
one is asked).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from eagle3_raw.cli.main import main
from tests.helpers import write_prompts, write_recipe


def _error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code = main(list(argv))
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == 1 and len(lines) == 1, (code, err)
    return lines[0]


BAD_URLS = [
    ("http://127.0.0.1:99999", "Port out of range"),
    ("http://127.0.0.1:abc", "Port could not be cast"),
    ("http://[::1:30000", "Invalid IPv6 URL"),
    ("http://[zz]:30000", "does not appear to be an IPv4 or IPv6 address"),
    ("http://:30000", "expected a host"),
    ("http://127.0.0.1:0", "port from 1 to 65535"),
]


@pytest.mark.parametrize(("url", "why"), BAD_URLS)
def test_a_bad_endpoint_url_in_the_recipe_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], url: str, why: str
) -> None:
    write_prompts(tmp_path, 2)
    recipe = write_recipe(tmp_path, endpoints=[url])
    line = _error(capsys, "build", str(recipe), "--quiet", "--journal-dir", str(tmp_path / "j"))
    assert "server.endpoints" in line and url in line and why in line


@pytest.mark.parametrize(("url", "why"), BAD_URLS)
def test_a_bad_endpoint_url_given_with_set_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], url: str, why: str
) -> None:
    write_prompts(tmp_path, 2)
    recipe = write_recipe(tmp_path, endpoints=["http://127.0.0.1:30000"])
    line = _error(capsys, "build", str(recipe), "--quiet", "--journal-dir", str(tmp_path / "j"),
                  "--set", f"server.endpoints=['{url}']")  # fmt: skip
    assert "server.endpoints" in line and url in line and why in line


def test_ipv6_endpoints_are_accepted(tmp_path: Path) -> None:
    from eagle3_raw.recipe import load_recipe

    write_prompts(tmp_path, 2)
    recipe = load_recipe(write_recipe(tmp_path, endpoints=["http://[::1]:30000", "https://[fe80::1%25eth0]"]))
    assert recipe.server.endpoints == ("http://[::1]:30000", "https://[fe80::1%25eth0]")


@pytest.mark.parametrize("how", ["recipe", "set"])
def test_an_impossible_render_date_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], how: str
) -> None:
    write_prompts(tmp_path, 2)
    model = {"render_date": "2024-13-45"} if how == "recipe" else {}
    recipe = write_recipe(tmp_path, endpoints=["http://127.0.0.1:30000"], model=model)
    if how == "recipe":  # unquoted, as a user writes it: YAML's timestamp form
        recipe.write_text(recipe.read_text().replace("'2024-13-45'", "2024-13-45"))
        assert "render_date: 2024-13-45\n" in recipe.read_text()
    extra = ["--set", "model.render_date=2024-13-45"] if how == "set" else []
    line = _error(capsys, "build", str(recipe), "--quiet", "--journal-dir", str(tmp_path / "j"), *extra)
    assert "model.render_date" in line and "2024-13-45" in line and "YYYY-MM-DD" in line


def test_a_repeated_top_level_key_is_refused_with_the_line_of_the_second(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_prompts(tmp_path, 2)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "name: t\n"
        "prompts: {source: prompts.jsonl, id_column: id}\n"
        "server: {endpoints: [http://127.0.0.1:30000]}\n"
        "sampling:\n"
        "  max_new_tokens: 64\n"
        "  temperature: 0.7\n"
        "sampling:\n"  # line 7: silently replaced the whole first section before
        "  temperature: 0\n"
    )
    line = _error(capsys, "build", str(recipe), "--quiet", "--journal-dir", str(tmp_path / "j"))
    assert "line 7" in line and "'sampling' is given twice (first on line 4)" in line and str(recipe) in line


def test_a_repeated_nested_key_is_refused_with_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_prompts(tmp_path, 2)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "name: t\nprompts: {source: prompts.jsonl, id_column: id}\n"
        "server: {endpoints: [http://127.0.0.1:30000]}\n"
        "sampling: {max_new_tokens: 64,\n  max_new_tokens: 8}\n"
    )
    line = _error(capsys, "build", str(recipe), "--quiet", "--journal-dir", str(tmp_path / "j"))
    assert "line 5" in line and "'max_new_tokens' is given twice" in line


def test_yaml_merge_keys_may_still_be_overridden(tmp_path: Path) -> None:
    """A ``<<`` merge followed by one of its keys is YAML's way of overriding: not a repeat."""
    from eagle3_raw.yaml_text import load_yaml

    assert load_yaml("base: &b {a: 1, b: 2}\nmine:\n  <<: *b\n  b: 3\n")["mine"] == {"a": 1, "b": 3}
