"""Shared helpers for end-to-end tests: recipes in temp folders, reference servers with ledgers."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from eagle3_raw.cli.main import main
from eagle3_raw.identity import Target, request_digest
from eagle3_raw.launching.reference import ReferenceProcess, launch_reference
from eagle3_raw.reference.ledger import read_ledger
from tests.support.pace import scaled

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
"""A tool the reference model calls (its rollouts and the real-SGLang ones share it)."""


def run_main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``eagle3-raw ARGV`` in this process: its exit code, stdout and stderr (never a traceback)."""
    code = main(list(argv))
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err, captured.err
    return code, captured.out, captured.err


def error_line(err: str) -> str:
    """The ``error: ...`` line, checked to be the only one: a message, not a traceback."""
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, err
    return lines[0]


def write_jsonl(path: Path, rows: Sequence[Mapping[str, Any]]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    return path


def write_prompts(folder: Path, count: int) -> Path:
    """``folder/prompts.jsonl`` with ``count`` plain prompts, ids ``p000``, ``p001``, ..."""
    topics = ["rivers", "stars", "bread", "trains", "owls", "glass", "maps", "tides", "clocks", "moss"]
    rows = [
        {"id": f"p{i:03d}", "prompt": f"Tell me about {topics[i % 10]} number {i}."} for i in range(count)
    ]
    return write_jsonl(folder / "prompts.jsonl", rows)


def write_recipe(
    folder: Path, *, endpoints: Sequence[str], source: str = "prompts.jsonl", **sections: Any
) -> Path:
    """A recipe file in ``folder`` (sections given as keyword mappings are merged over the defaults)."""
    raw: dict[str, Any] = {
        "name": "t",
        "prompts": {"source": source, "id_column": "id"},
        "server": {
            "endpoints": list(endpoints),
            "connect_timeout": round(scaled(5), 1),  # generous on an idle machine: stretched on a busy one
            "request_timeout": round(scaled(30)),
            "max_retries": 3,
        },
        "sampling": {"max_new_tokens": 64, "temperature": 0.7, "samples_per_prompt": 1, "seed": 1},
    }
    for key, value in sections.items():
        if isinstance(value, Mapping) and isinstance(raw.get(key), dict):
            raw[key] = {**raw[key], **value}
        else:
            raw[key] = value
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


CHATS: list[dict[str, Any]] = [
    {"id": "plain-1", "prompt": "Write a haiku about rivers."},
    {"id": "plain-2", "prompt": "Explain recursion to a child."},
    {
        "id": "share-1",
        "conversations": [
            {"from": "human", "value": "What is 2+2?"},
            {"from": "gpt", "value": "4."},
            {"from": "human", "value": "And times 3?"},
        ],
    },
    {
        "id": "tools-1",
        "tools": [
            {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
        ],
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": "The user wants the weather; call the tool.",
                "tool_calls": [
                    {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
                ],
            },
            {"role": "tool", "content": '{"temp_c": 21}'},
            {"role": "user", "content": "Thanks! And tomorrow?"},
        ],
    },
]


@contextlib.contextmanager
def reference_server(tmp_path: Path, *args: str) -> Iterator[tuple[ReferenceProcess, Path]]:
    """A reference server on a free port with a ledger in ``tmp_path``."""
    ledger = tmp_path / f"ledger-{len(list(tmp_path.glob('ledger-*')))}.jsonl"
    with launch_reference(args=["--ledger", str(ledger), *args]) as server:
        yield server, ledger


def generations(ledger: Path) -> list[dict[str, Any]]:
    """Ledger lines of generations the server delivered with HTTP 200."""
    if not ledger.exists():
        return []
    return [r for r in read_ledger(ledger) if r.get("status") == 200 and r.get("delivered") and "rid" in r]


def requested_rids(ledger: Path) -> list[str]:
    """The rid of every ledger line that names one (see :func:`line_rid`), in ledger order, whatever
    its status or delivery."""
    if not ledger.exists():
        return []
    return [rid for rid in map(line_rid, read_ledger(ledger)) if rid is not None]


def line_rid(record: Mapping[str, Any]) -> str | None:
    """The rid of a ledger line: a generation line carries ``rid``; a request refused before any
    generation (an injected 5xx, a hang, a 400) carries it in its ``body``."""
    body = record.get("body")
    rid = record.get("rid", body.get("rid") if isinstance(body, Mapping) else None)
    return rid if isinstance(rid, str) else None


def requested_digests(ledger: Path, target: Target) -> dict[str, bytes]:
    """rid -> request digest (:func:`eagle3_raw.identity.request_digest`) of every generation the
    ledger records, answered, aborted or cut off: what was really asked, by content."""
    if not ledger.exists():
        return {}
    return {
        r["rid"]: request_digest(target, r["input_ids"], r["sampling_params"])
        for r in read_ledger(ledger) if "input_ids" in r and "rid" in r
    }  # fmt: skip


def row_digests(root: Path, config_id: str) -> dict[int, bytes]:
    """Packed row key -> the digest of its generation, for every row the set's journal holds."""
    from eagle3_raw.journal import Journal

    with Journal.read(root, config_id) as journal:
        entries = journal.sets.entries()
        firsts = entries.first_rows()
        present = firsts[journal.generation_index().has(entries.digest[firsts])]
        return {
            int(key): bytes(digest).ljust(16, b"\0")
            for key, digest in zip(entries.packed[present], entries.digest[present], strict=True)
        }


def rid_row_id(rid: str) -> str:
    """The row id eagle3_raw put in front of a request id (``<row id>#<attempt>-<hex>``)."""
    return rid.rsplit("#", 1)[0]


def rid_attempt(rid: str) -> int:
    """The attempt number in a request id (``<row id>#<attempt>-<hex>``)."""
    return int(rid.rsplit("#", 1)[1].split("-", 1)[0])


def rid_run(rid: str) -> str:
    """The part of a request id unique to the run that sent it (the first 8 hex digits after ``-``)."""
    return rid.rsplit("-", 1)[1][:8]


def run_in_terminal(
    command: list[str], *, columns: int = 80, timeout: float = 120, raw: bool = False
) -> tuple[int, str]:
    """Run ``command`` with a pseudo-terminal of ``columns`` columns as stdout and stderr (as a user
    at a shell would); its exit code and output with the terminal control sequences removed
    (kept with ``raw``)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    env = {**os.environ, "COLUMNS": str(columns), "LINES": "24"}
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=env)
    os.close(slave)
    output, deadline = b"", time.monotonic() + timeout
    while time.monotonic() < deadline:
        if select.select([master], [], [], 0.5)[0]:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            output += chunk
        elif process.poll() is not None:
            break
    os.close(master)
    code = process.wait(timeout=scaled(10))
    text = output.decode(errors="replace")
    return code, text if raw else strip_terminal_codes(text)


def strip_terminal_codes(text: str) -> str:
    """``text`` without ANSI control sequences: a cursor move or a line erase (a redrawn frame)
    becomes a line break, colours and the rest go."""
    text = re.sub(r"\x1b\[[0-9]*[ABK]", "\n", text)
    return re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", text)


def standin_sglang(ledgers: Path) -> list[str]:
    """``server.sglang.executable`` for the reference server standing in for ``python -m
    sglang.launch_server`` (it takes the flags the launcher passes); each server process it starts
    keeps its own ledger, ``<ledgers>/ledger-<pid>.jsonl`` (the recipe's ``server.sglang.env``
    must set ``E3_LEDGERS`` to ``ledgers``: :func:`sglang_section` does)."""
    script = 'exec "$0" -m eagle3_raw.reference --ledger "$E3_LEDGERS/ledger-$$.jsonl" "$@"'
    return ["/bin/sh", "-c", script, sys.executable]


def sglang_section(ledgers: Path, *extra_args: str, **fields: Any) -> dict[str, Any]:
    """A recipe's ``server`` section launching the stand-in SGLang (:func:`standin_sglang`)."""
    from eagle3_raw.resources import reference_model_dir

    ledgers.mkdir(parents=True, exist_ok=True)
    sglang = {
        "model_path": str(reference_model_dir()), "executable": standin_sglang(ledgers),
        "env": {"E3_LEDGERS": str(ledgers)}, "extra_args": list(extra_args),
        "startup_timeout": round(scaled(60)), "stop_timeout": 5, **fields,
    }  # fmt: skip
    return {"endpoints": None, "launch": "sglang", "sglang": sglang}


def ledgers_in(folder: Path) -> list[Path]:
    """The stand-in servers' ledgers in ``folder``, one per server started (in name order: tell a
    later server's from the ones before by set difference)."""
    return sorted(folder.glob("ledger-*.jsonl"))


def processes_with(*words: str) -> list[int]:
    """Pids of the processes whose command line holds ``words`` as consecutive arguments."""
    wanted = b"\0" + "\0".join(words).encode() + b"\0"
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if wanted in b"\0" + cmdline.rstrip(b"\0") + b"\0":
            found.append(int(entry.name))
    return found


def launched_port(text: str) -> int:
    """The port of the SGLang server a build's log says it started."""
    match = re.search(r"starting the SGLang server: .* --port (\d+)", text)
    assert match, text[-3000:]
    return int(match.group(1))
