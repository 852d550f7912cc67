"""``eagle3-raw status`` (issue 16): per shard and in total, rows, failures, tokens, rate and ETA,
read from the shared journal while real shard processes write it."""

from __future__ import annotations

import re
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from eagle3_raw.journal import Journal
from tests.helpers import generations, reference_server, write_prompts, write_recipe
from tests.reference.wire import wait_until
from tests.support.pace import scaled


def _cli(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "eagle3_raw.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip


def _status(recipe: Path, journals: Path, *extra: str) -> str:
    command = [sys.executable, "-m", "eagle3_raw.cli", "status", str(recipe), "--journal-dir", str(journals)]
    done = subprocess.run([*command, *extra], capture_output=True, text=True, timeout=scaled(120))
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.slow
def test_status_follows_the_shards_while_they_run(tmp_path: Path) -> None:
    """While the shards run on a slow server (slower on a busy machine: no shard may finish while
    ``status`` starts and samples), then after they are stopped, one finished on a fast server, and
    while ``--watch`` follows the last one to its end."""
    write_prompts(tmp_path, 200)
    journals = tmp_path / "journals"
    slow = ("--slots", "2", "--ms-per-token", f"{scaled(15):.1f}")  # 100 rows a shard: >= 70 s idle
    with reference_server(tmp_path, *slow) as (server, ledger), reference_server(tmp_path) as (fast, _):
        recipe = write_recipe(tmp_path, endpoints=[server.url], sampling={"max_new_tokens": 48})
        shard = ("build", str(recipe), "--quiet", "--journal-dir", str(journals), "--shard")
        first, second = _cli(*shard, "0/2"), _cli(*shard, "1/2")
        wait_until(lambda: len(generations(ledger)) >= 4, timeout=90)
        running = _status(recipe, journals, "--sample", "1")
        assert running.count("running") == 2, running
        assert re.search(r"^total\s+0/2 done\s+\d+/~200\b", running, re.M), running  # the estimate
        assert not re.search(r"^0/2 .* -\s+-\s+-$", running, re.M), running  # a rate and an ETA
        for build in (first, second):
            build.send_signal(signal.SIGTERM)
            assert build.wait(scaled(60)) == 130, build.communicate()[1][-2000:]
        on_fast = ("--set", f"server.endpoints=[{fast.url}]")
        assert _cli(*shard, "0/2", *on_fast).wait(scaled(120)) == 0
        stopped = _status(recipe, journals, "--sample", "0")
        assert re.search(r"^0/2\s+done\s+100/100\s", stopped, re.M) and re.search(
            r"^1/2\s+stopped\s", stopped, re.M
        ), stopped
        watch = _cli("status", str(recipe), "--journal-dir", str(journals), "--watch", "--interval", "0.5")
        again = _cli(*shard, "1/2", *on_fast)
        assert again.wait(scaled(120)) == 0
        out, err = watch.communicate(timeout=scaled(60))  # it ends by itself once every shard is done
    assert watch.returncode == 0, err[-2000:]
    final = out.strip().split("\n\n")[-1]
    assert re.search(r"^total\s+2/2 done\s+200/200\s+0\s+0\s", final, re.M), final
    (directory,) = (journals / "sets").iterdir()
    with Journal.read_dir(directory) as journal:
        tokens = journal.stats()["generated_tokens"]
    assert f" {tokens:,} " in final.splitlines()[-1], final  # the tokens the journal holds


@pytest.mark.slow
def test_status_of_a_recipe_nobody_built_says_so(tmp_path: Path) -> None:
    write_prompts(tmp_path, 3)
    recipe = write_recipe(tmp_path, endpoints=["http://127.0.0.1:9"])
    journals = str(tmp_path / "j")
    command = [sys.executable, "-m", "eagle3_raw.cli", "status", str(recipe), "--journal-dir", journals]
    done = subprocess.run(command, capture_output=True, text=True, timeout=scaled(60))
    assert done.returncode == 1 and "holds no set of recipe 't'" in done.stderr


@pytest.mark.slow
def test_status_allocates_nothing_per_shard_a_planted_file_claims(tmp_path: Path) -> None:
    """Issue 22, finding 8: an empty file named ``out-0-of-50000000-...`` took 4.7 GB, never finished."""
    write_prompts(tmp_path, 3)
    journals = tmp_path / "journals"
    with reference_server(tmp_path) as (server, _):
        recipe = write_recipe(tmp_path, endpoints=[server.url])
        built = subprocess.run(
            [
                sys.executable,
                "-m",
                "eagle3_raw.cli",
                "build",
                str(recipe),
                "--quiet",
                "--journal-dir",
                str(journals),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert built.returncode == 0, built.stderr[-2000:]
        (directory,) = (journals / "sets").iterdir()
        for name in (
            "out-0-of-50000000-evil.bin",
            "out-0-of-50000000-evil.idx",
            "complete-3-of-99999999.json",
            f"out-{'9' * 200}-of-2-evil.bin",
            "out-5-of-2-evil.bin",
        ):
            (directory / name).write_bytes(b"")
        done = subprocess.run(
            [sys.executable, "-m", "eagle3_raw.cli", "status", str(recipe), "--journal-dir", str(journals),
             "--sample", "0"], capture_output=True, text=True, timeout=120,
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30)),
        )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert re.search(r"^0/1\s+done\s+3/3\s", done.stdout, re.M), done.stdout
    assert "50000000" not in done.stdout and "99999999" not in done.stdout
