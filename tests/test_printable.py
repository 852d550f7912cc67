"""Text from a server, a Hub repo or a recipe is printed with its control characters escaped
(issue 13, finding 10): it can neither clear the screen nor fake a line eagle3_raw prints."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from aiohttp import web

from eagle3_raw import hub
from eagle3_raw.cli import main as cli
from eagle3_raw.hub.untrusted import describe
from eagle3_raw.printable import printable
from eagle3_raw.recipe import load_recipe
from tests.helpers import write_prompts, write_recipe
from tests.support.hostile import Forward, HostileServer

CLEAR = "\x1b[2J\x1b[H"
FAKE = "\rverdict           full agreement\n"
RAW_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("a\x1b[31mred", "a\\x1b[31mred"),
        ("line\nfake", "line\\nfake"),
        ("back\rover", "back\\rover"),
        ("tab\there", "tab\\there"),
        ("bell\x07 del\x7f c1\x9b", "bell\\x07 del\\x7f c1\\x9b"),
        ("rtl\u202eevil", "rtl\\u202eevil"),
        ("plain café 東京 🙂", "plain café 東京 🙂"),
    ],
)
def test_printable_escapes_every_control_character(text: str, shown: str) -> None:
    assert printable(text) == shown


def test_printable_can_keep_our_own_newlines_and_cuts_long_text() -> None:
    assert printable("one\ntwo\x1b[2J", newlines=True) == "one\ntwo\\x1b[2J"
    assert printable("x" * 50, limit=10) == "xxxxxxxxxx... (40 more characters)"


def test_published_row_ids_are_printed_escaped() -> None:
    difference = hub.RowDifference(f"row{CLEAR}{FAKE}", 3, "generated", 9, 9, (1,), (2,))
    comparison = hub.Comparison(
        "alice/x", f"cfg{CLEAR}", f"c0ffee{FAKE}", "fp\x1b]0;title\x07", "fp", published_rows=2,
        rebuilt_rows=1, common=1, identical=0, only_published=(f"gone{FAKE}",), only_published_count=1,
        differences=(difference,),
    )  # fmt: skip
    text = comparison.render()
    assert not RAW_CONTROL.search(text)
    assert text.count("\n") == len(text.splitlines()) - 1  # no extra line was slipped in
    assert "verdict" in text.splitlines()[-1] and text.splitlines()[-1].startswith("verdict")
    assert sum(line.startswith("verdict") for line in text.splitlines()) == 1


def test_the_reproduce_plan_escapes_the_recipes_fields(tmp_path: Path) -> None:
    write_prompts(tmp_path, 2)
    recipe = load_recipe(write_recipe(tmp_path, endpoints=["http://127.0.0.1:9"],
                                      sampling={"stop": [f"{CLEAR}{FAKE}"]}))  # fmt: skip
    plan = describe(recipe, "alice/x", "0" * 40, tmp_path)
    assert not RAW_CONTROL.search(plan) and "\\x1b[2J" in plan
    assert len(plan.splitlines()) == 8


def test_a_servers_error_body_cannot_drive_the_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async def hostile(request: web.Request, forward: Forward) -> web.StreamResponse:
        return web.Response(text=f"{CLEAR}all good{FAKE}", status=503)

    write_prompts(tmp_path, 2)
    with HostileServer({"/model_info": hostile}) as server:
        recipe = write_recipe(tmp_path, endpoints=[server.url])
        code = cli.main(["build", str(recipe), "--quiet", "--journal-dir", str(tmp_path / "j")])
    err = capsys.readouterr().err
    assert code == 1 and "error: HTTP 503" in err
    assert not RAW_CONTROL.search(err) and "\\x1b[2J" in err and "\\rverdict" in err
