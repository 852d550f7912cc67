"""Scale-out past one client: shard completion markers and the check before a merge.

``eagle3-raw build RECIPE --shard i/N`` on N machines fills N shard files of one journal (a shared
folder, or folders copied together afterwards). Each shard that has an outcome for every row it
planned writes ``complete-<i>-of-<N>.json``; ``eagle3-raw merge`` assembles the dataset once all N
markers are there. The dataset is the same as a single-process build: the journal is read in
canonical order and deduplicated by row key, whatever shard wrote a row.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import orjson

from eagle3_raw.errors import FatalError
from eagle3_raw.journal.files import replace_durably
from eagle3_raw.plan import Shard

_MARKER = re.compile(r"^complete-(\d+)-of-(\d+)\.json$")


def mark_complete(journal_dir: Path, shard: Shard, counts: dict[str, Any]) -> Path:
    """Record that ``shard`` has an outcome for every row it planned (written atomically and
    durably: the caller has flushed the rows first)."""
    path = journal_dir / f"complete-{shard.name}.json"
    replace_durably(path, orjson.dumps({**counts, "shard": shard.name, "time": time.time()}))
    return path


def completed(journal_dir: Path) -> dict[int, set[int]]:
    """Completed shard indexes, by shard count N."""
    done: dict[int, set[int]] = {}
    for path in journal_dir.glob("complete-*-of-*.json"):
        match = _MARKER.match(path.name)
        if match:
            done.setdefault(int(match[2]), set()).add(int(match[1]))
    return done


def check_merge_ready(journal_dir: Path) -> int:
    """The shard count N if every shard 0..N-1 is complete; otherwise FatalError saying what is missing."""
    if not (journal_dir / "manifest.json").exists():
        raise FatalError(
            f"no journal at {journal_dir}: build the shards first (eagle3-raw build --shard i/N), "
            "or pass the --journal-dir (and --set options) the shards were built with"
        )
    done = completed(journal_dir)
    for count, indexes in sorted(done.items()):
        if indexes == set(range(count)):
            return count
    missing = {count: sorted(set(range(count)) - indexes) for count, indexes in done.items()}
    detail = "; ".join(f"of {n}: missing {m}" for n, m in missing.items()) or "no shard has finished"
    raise FatalError(
        f"the journal {journal_dir} is not complete ({detail}); finish the missing shards, "
        "or merge anyway with --force"
    )
