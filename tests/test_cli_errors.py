"""First contact (issue 14): every bad input a one-line message with exit code 1, whole-run problems
refused before the first /generate, nothing generated lost, and the exit codes of a build.

Driven through ``eagle3_raw.cli.main.main`` (and ``eagle3_raw.load`` where it applies) against the
reference server; "nothing was sent" and "every request went there" are read from its ledger. Full
disks are tiny tmpfs mounts and read-only folders read-only bind mounts (root), or chmod (others);
a test that needs a mount it cannot make is skipped.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import eagle3_raw
from eagle3_raw.cli.main import main
from eagle3_raw.journal import Journal
from eagle3_raw.recipe import load_recipe
from eagle3_raw.run.build import journal_dir_for
from tests.helpers import (
    error_line,
    generations,
    reference_server,
    rid_row_id,
    run_main,
    write_prompts,
    write_recipe,
)


def _build(tmp_path: Path, recipe: Path, *extra: str) -> list[str]:
    return ["build", str(recipe), "--quiet", "--journal-dir", str(tmp_path / "j"), *extra]


def _journal_rows(tmp_path: Path, recipe: Path) -> set[str]:
    with Journal.read_dir(journal_dir_for(load_recipe(recipe), tmp_path / "j")) as journal:
        return {row.id for row in journal.iter_rows()}


# --- disks ---------------------------------------------------------------------------------------


def _mount(*args: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting needs root")
    result = subprocess.run(["mount", *args], capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount here: {result.stderr.strip()}")


@contextlib.contextmanager
def tiny_disk(folder: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` at ``folder``: a disk that really fills up (ENOSPC)."""
    folder.mkdir(parents=True)
    _mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder))
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)


@contextlib.contextmanager
def read_only(folder: Path) -> Iterator[str]:
    """``folder`` made unwritable by a real mechanism; yields the errno name writes get."""
    folder.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        folder.chmod(0o555)
        try:
            yield "EACCES"
        finally:
            folder.chmod(0o755)
        return
    _mount("--bind", str(folder), str(folder))
    try:
        _mount("-o", "remount,bind,ro", str(folder))
        yield "EROFS"
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def _big_rows_recipe(tmp_path: Path, url: str, rows: int = 30) -> Path:
    """Rows of ~1k tokens each (ignore_eos), so a few of them overflow a tiny disk."""
    write_prompts(tmp_path, rows)
    sampling = {"max_new_tokens": 1024, "ignore_eos": True, "temperature": 0}
    return write_recipe(tmp_path, endpoints=[url], sampling=sampling)


@pytest.mark.slow
def test_a_full_cache_disk_is_a_message_and_the_journal_keeps_every_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with reference_server(tmp_path) as (server, ledger), tiny_disk(tmp_path / "full", "64k") as full:
        recipe = _big_rows_recipe(tmp_path, server.url)
        code, _, err = run_main(capsys, *_build(tmp_path, recipe, "--cache-dir", str(full)))
        assert code == 1
        line = error_line(err)
        assert f"cannot write the datasets cache {full}: No space left on device (ENOSPC)" in line
        assert "the journal keeps every generated row" in line
        assert len(_journal_rows(tmp_path, recipe)) == 30  # nothing generated was lost
        sent = len(generations(ledger))
        code, out, _ = run_main(capsys, *_build(tmp_path, recipe, "--cache-dir", str(tmp_path / "cache")))
        assert code == 0 and "rows              30" in out
        assert len(generations(ledger)) == sent == 30  # the rerun sent nothing


def test_a_read_only_cache_is_refused_before_any_request(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with reference_server(tmp_path) as (server, ledger), read_only(tmp_path / "ro") as error:
        write_prompts(tmp_path, 3)
        recipe = write_recipe(tmp_path, endpoints=[server.url])
        cache = tmp_path / "ro" / "cache"
        code, _, err = run_main(capsys, *_build(tmp_path, recipe, "--cache-dir", str(cache)))
        assert code == 1 and f"cannot write the datasets cache {cache}:" in error_line(err)
        assert f"({error})" in err
        with pytest.raises(eagle3_raw.Eagle3RawError, match="cannot write the datasets cache"):
            eagle3_raw.load(str(recipe), cache_dir=str(tmp_path / "ro"), progress="none")
    assert generations(ledger) == []


def test_a_read_only_output_folder_is_refused_before_the_build(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with reference_server(tmp_path) as (server, ledger), read_only(tmp_path / "out") as error:
        write_prompts(tmp_path, 3)
        recipe = write_recipe(tmp_path, endpoints=[server.url])
        argv = _build(
            tmp_path, recipe, "--cache-dir", str(tmp_path / "c"), "--output-dir", str(tmp_path / "out")
        )
        code, _, err = run_main(capsys, *argv)
    assert code == 1 and f"cannot write the output folder {tmp_path / 'out'}:" in error_line(err)
    assert f"({error})" in err
    assert generations(ledger) == []  # checked before the build, not after it


@pytest.mark.slow
def test_a_full_output_disk_leaves_no_truncated_parquet_and_loses_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with reference_server(tmp_path) as (server, ledger), tiny_disk(tmp_path / "out", "64k") as out:
        recipe = _big_rows_recipe(tmp_path, server.url, rows=100)  # about 200 KB of Parquet
        argv = _build(tmp_path, recipe, "--cache-dir", str(tmp_path / "c"), "--output-dir", str(out))
        code, stdout, err = run_main(capsys, *argv)
        assert code == 1 and "rows              100" in stdout  # built; only the Parquet copy failed
        line = error_line(err)
        assert f"cannot write {out / 't.parquet'}: No space left on device (ENOSPC)" in line
        assert list(out.iterdir()) == []  # no truncated .parquet, no leftover temporary file
        code, stdout, _ = run_main(capsys, *_build(tmp_path, recipe, "--cache-dir", str(tmp_path / "c"),
                                               "--output-dir", str(tmp_path / "roomy")))  # fmt: skip
        assert code == 0 and "loaded from the datasets cache" in stdout
        assert len(generations(ledger)) == 100  # nothing regenerated
    import pyarrow.parquet as pq

    written = tmp_path / "roomy" / "t.parquet"
    assert pq.read_table(written).num_rows == 100
    assert written.stat().st_mode & 0o777 == 0o600  # the rows are the user's only (issue 22), whole


# --- the recipe and the command line -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv_tail", "fragment"),
    [
        (["--set", "sampling.temperature=["], "got 'sampling.temperature=['; VALUE is not valid YAML"),
        (["--set", "model.chat_template=missing.jinja"], "no such file: does not exist; give a Jinja"),
        (["--set", "model.tokenizer=./models/mine"], "no tokenizer folder: "),
        (["--set", "model.chat_template_kwargs={enable_thinkin: 0}"], "(did you mean 'enable_thinking'?)"),
        (["--shard", "2/2"], "error: recipe field '--shard': got '2/2'"),
        (["--shard", "0/100000000"], "expected at most 65,536 shards"),
        # issue 22, finding 8: inputs that still ended in a raw traceback
        (["--set", f"prompts.limit={10**30}"], "'prompts.limit': got 1000000000000000000000000000000; "
         "expected an integer within 64 bits"),
        (["--set", f"sampling.seed={10**30}"], "'sampling.seed': got 1000"),
        (["--set", f"prompts.shuffle_seed={10**30}"], "'prompts.shuffle_seed': got 1000"),
        (["--set", f"sampling.stop_token_ids=[{10**30}]"], "'sampling.stop_token_ids[0]': got 1000"),
        (["--set", "model.chat_template_kwargs={a: !!binary aGVsbG8=}"],
         "'model.chat_template_kwargs.a': got 'bytes'; expected plain data, not a bytes"),
        (["--set", "sampling.logit_bias={5: -1.0}"],
         "'sampling.logit_bias': got '5'; expected text keys, not int"),
        (["--set", "model.chat_template_kwargs={s: !!set {a: null}}"], "expected plain data, not a set"),
        (["--set", f"sampling.seed={'9' * 5000}"], "VALUE is not valid YAML"),
    ],
)  # fmt: skip
def test_bad_command_line_values_are_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv_tail: list[str], fragment: str
) -> None:
    write_prompts(tmp_path, 2)  # a launched reference server: its target is known without starting it
    recipe = write_recipe(tmp_path, endpoints=[], server={"launch": "reference"})
    code, _, err = run_main(capsys, *_build(tmp_path, recipe, *argv_tail))
    assert code == 1 and fragment in error_line(err)


@pytest.mark.parametrize(
    ("content", "fragment"),
    [(None, "no such file, and no bundled recipe has that name (bundled: deepseek-v3, deepseek-v3-vllm"),
     (b"name: caf\xe9\n", "not UTF-8 text (byte 0xe9 at offset 9)")],
)  # fmt: skip
def test_a_bad_recipe_file_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes | None, fragment: str
) -> None:
    path = tmp_path / "mine.yaml"
    if content is not None:
        path.write_bytes(content)
    code, _, err = run_main(capsys, "build", str(path))
    assert code == 1 and error_line(err).startswith(f"error: recipe file {path}: {fragment}")


@pytest.mark.slow
def test_name_is_the_recipe_name_from_the_cli_and_from_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_prompts(tmp_path, 2)
    with reference_server(tmp_path) as (server, _):
        recipe = write_recipe(tmp_path, endpoints=[server.url])
        code, out, _ = run_main(capsys, *_build(tmp_path, recipe, "--set", "name=renamed", "--cache-dir",
                                            str(tmp_path / "c")))  # fmt: skip
        assert code == 0 and f"journal           {tmp_path / 'j' / 'sets' / 'renamed-'}" in out
        rows = eagle3_raw.load(str(recipe), name="other", cache_dir=str(tmp_path / "c"),
                               journal_dir=tmp_path / "j", progress="none")  # fmt: skip
    assert rows.config_name == "other" and len(rows) == 2
    assert {p.name.split("-")[0] for p in (tmp_path / "j" / "sets").iterdir()} == {"renamed", "other"}


@pytest.mark.slow
def test_an_endpoints_override_sends_every_request_there_and_launches_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_prompts(tmp_path, 12)
    recipe = write_recipe(tmp_path, endpoints=[], server={"launch": "reference"})
    with reference_server(tmp_path) as (server, ledger):
        code, out, err = run_main(capsys, *_build(tmp_path, recipe, "--cache-dir", str(tmp_path / "c"),
                                              "--set", f"server.endpoints=[{server.url}]"))  # fmt: skip
    assert code == 0 and "rows              12" in out
    assert sorted(rid_row_id(g["rid"]) for g in generations(ledger)) == [f"p{i:03d}:1:0" for i in range(12)]
    assert "server.endpoints is overridden: the recipe's server.launch ('reference') is not used" in err
    both = write_recipe(tmp_path, endpoints=["http://127.0.0.1:9"], server={"launch": "reference"})
    code, _, err = run_main(capsys, *_build(tmp_path, both))
    assert code == 1 and "server.launch': got 'reference'; cannot be combined with server.endpoints" in err


# --- problems every row would have: refused before the first /generate ----------------------------------


def _parquet(path: Path, rows: list[dict[str, Any]]) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path.name


@pytest.mark.slow
@pytest.mark.parametrize("problem", ["template", "id_column", "parquet", "empty"])
def test_whole_run_problems_fail_up_front(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], problem: str
) -> None:
    write_prompts(tmp_path, 5)
    changes: dict[str, Any] = {}
    if problem == "template":
        (tmp_path / "chat.jinja").write_text("{% for m in messages %}{{ m.content }")
        changes = {"model": {"chat_template": "chat.jinja"}}
        fragment = "recipe field 'model.chat_template': got 'chat.jinja'; Jinja syntax error at line 1"
    elif problem == "id_column":
        changes = {"prompts": {"source": "prompts.jsonl", "id_column": "uid"}}
        fragment = (
            "prompts.id_column 'uid' is not in the first row (prompts.jsonl line 1; its fields: id, prompt)"
        )
    elif problem == "parquet":
        source = _parquet(tmp_path / "p.parquet", [{"id": "a", "text": "no prompt column"}])
        changes = {"prompts": {"source": source, "id_column": "id"}}
        fragment = "no 'messages' or 'conversations' or 'prompt' column for format 'auto' (columns: id, text)"
    else:
        (tmp_path / "empty.jsonl").write_text("")
        changes = {"prompts": {"source": "empty.jsonl", "id_column": "id"}}
        fragment = "prompt source empty.jsonl: holds no rows"
    with reference_server(tmp_path) as (server, ledger):
        recipe = write_recipe(tmp_path, endpoints=[server.url], **changes)
        code, _, err = run_main(capsys, *_build(tmp_path, recipe, "--cache-dir", str(tmp_path / "c")))
    line = error_line(err)
    assert code == 1 and fragment in line, line
    assert "journals rows" not in line
    assert generations(ledger) == []  # not once per row: not a single request


# --- exit codes ------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_build_with_rows_that_failed_for_good_exits_4_and_says_how_to_retry(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_prompts(tmp_path, 10)
    with reference_server(tmp_path, "--faults", "http500=0.5", "--fault-seed", "3") as (server, _):
        recipe = write_recipe(tmp_path, endpoints=[server.url], server={"max_retries": 0})
        code, out, _ = run_main(capsys, *_build(tmp_path, recipe, "--cache-dir", str(tmp_path / "c")))
    failed = 10 - len(_journal_rows(tmp_path, recipe))
    assert 0 < failed < 10
    assert code == 4 and f"not complete      {failed} rows failed for good" in out
    assert "--retry-failed to try them again" in out
    with reference_server(tmp_path) as (server, _):
        retry = [
            "--retry-failed",
            "--set",
            f"server.endpoints=[{server.url}]",
            "--cache-dir",
            str(tmp_path / "c"),
        ]
        code, out, _ = run_main(capsys, *_build(tmp_path, recipe, *retry))
    assert code == 0 and "rows              10" in out and "not complete" not in out


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out == f"eagle3-raw {eagle3_raw.__version__}\n"


def test_a_usage_error_is_argparse_s_exit_code_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["build"])
    assert exit_.value.code == 2 and "the following arguments are required: recipe" in capsys.readouterr().err


@pytest.mark.slow
def test_no_rows_without_failures_does_not_point_at_reasons_that_do_not_exist(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_prompts(tmp_path, 3)
    with reference_server(tmp_path) as (server, _):
        recipe = write_recipe(
            tmp_path, endpoints=[server.url], on_truncation="drop", sampling={"max_new_tokens": 1}
        )
        code, _, err = run_main(capsys, *_build(tmp_path, recipe, "--cache-dir", str(tmp_path / "c")))
    line = error_line(err)
    assert (
        code == 1 and "produced no rows: 3 generated (all ended on length and on_truncation is drop)" in line
    )
    assert line.endswith(", 0 skipped, 0 failed") and "journals rows" not in line


# --- the exception tree -------------------------------------------------------------------------


def _unanticipated_os_error(args: Any) -> int:
    raise PermissionError(13, "Permission denied", "/somewhere/it/cannot/write")


@pytest.mark.parametrize(
    "case", ["missing recipe", "bad --set", "bad source", "no credentials", "unknown set", "os error"]
)
def test_every_error_the_cli_reports_is_one_of_the_exception_tree(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    import eagle3_raw.cli.main as cli_main

    reported: list[BaseException] = []
    real_report = cli_main.report

    def report(exc: BaseException) -> int:
        reported.append(exc)
        return real_report(exc)  # type: ignore[arg-type]

    monkeypatch.setattr(cli_main, "report", report)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    recipe = write_recipe(tmp_path, endpoints=["http://127.0.0.1:9"])
    argv = {
        "missing recipe": ["build", str(tmp_path / "nope.yaml")],
        "bad --set": ["build", str(recipe), "--set", "sampling.temperature=-1"],
        "bad source": ["validate", str(recipe), "--local"],
        "no credentials": ["push", str(recipe), "--repo", "someone/set"],
        "unknown set": ["journals", "rows", "t-0000000000000000", "--journal-dir", str(tmp_path / "j")],
        "os error": ["build", str(recipe)],
    }[case]
    if case == "os error":
        monkeypatch.setattr(cli_main, "_build", _unanticipated_os_error)
    code, out, err = run_main(capsys, *argv)
    if case == "bad source":  # validate says FAIL on a line of its own per check, never an error
        assert code == 1 and any(line.startswith("FAIL") for line in out.splitlines()) and reported == []
        return
    assert code == 1
    assert len(reported) == 1 and isinstance(reported[0], eagle3_raw.Eagle3RawError), reported
    assert error_line(err) == f"error: {reported[0]}".splitlines()[0]
    if case == "os error":
        assert isinstance(reported[0], eagle3_raw.LocalFileError)
        assert "/somewhere/it/cannot/write" in err


def test_the_exception_tree_is_exported_and_sorts_what_a_run_does() -> None:
    import eagle3_raw.errors as errors

    tree = {name for name, value in vars(errors).items() if isinstance(value, type) and value.__module__ ==
            errors.__name__ and issubclass(value, BaseException)}  # fmt: skip
    assert tree <= set(eagle3_raw.__all__)
    for name in tree - {"Eagle3RawError", "Interrupted"}:
        cls = getattr(errors, name)
        kinds = [k for k in (errors.RetryableError, errors.RowError, errors.FatalError) if issubclass(cls, k)]
        assert len(kinds) == 1 or cls in (errors.RetryableError, errors.RowError, errors.FatalError), name
