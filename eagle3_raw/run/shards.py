"""Scale-out past one client: shard completion markers, and when a set is whole.

``eagle3-raw build RECIPE --shard i/N`` on N machines fills one set journal (a shared folder, or
folders copied together afterwards: every file name carries its host). Each shard that has an
outcome for every row it planned writes ``complete-<i>-of-<N>.json`` with how many row keys it
covered; the set is whole once all N markers are there and every key they count is readable
(:func:`check_whole`). The assembled set is the same as a single-process build: outcomes are read
in key order and deduplicated, whatever shard wrote them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from eagle3_raw.errors import FatalError, JournalError
from eagle3_raw.journal.files import read_bytes, replace_durably
from eagle3_raw.journal.sets import SetJournal
from eagle3_raw.limits import MAX_SHARDS
from eagle3_raw.run.plan import Shard

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

_MARKER = re.compile(r"^complete-(\d{1,9})-of-(\d{1,9})\.json$")


def mark_complete(set_dir: Path, shard: Shard, counts: dict[str, Any]) -> Path:
    """Record that ``shard`` has an outcome for every row it planned (``counts["keys"]`` of them),
    atomically and durably: the caller has flushed the outcomes first."""
    path = set_dir / f"complete-{shard.name}.json"
    replace_durably(path, orjson.dumps({**counts, "shard": shard.name}))
    return path


def completed(set_dir: Path) -> dict[int, dict[int, dict[str, Any]]]:
    """The markers found, by shard count N then shard index."""
    done: dict[int, dict[int, dict[str, Any]]] = {}
    for path in set_dir.glob("complete-*-of-*.json"):
        match = _MARKER.match(path.name)
        if match and is_shard(int(match[1]), int(match[2])):
            try:
                marker = orjson.loads(read_bytes(path))
            except (OSError, orjson.JSONDecodeError):
                continue  # a marker that cannot be read does not count
            done.setdefault(int(match[2]), {})[int(match[1])] = marker if isinstance(marker, dict) else {}
    return done


def is_shard(index: int, count: int) -> bool:
    """Whether a file name's ``<index>-of-<count>`` can be a shard (a planted
    ``out-0-of-50000000-...`` is not: nothing allocates per shard it claims)."""
    return 0 <= index < count <= MAX_SHARDS


def whole_count(set_dir: Path) -> int | None:
    """The shard count N whose N markers are all there (the smallest such N), or None."""
    for count, markers in sorted(completed(set_dir).items()):
        if set(markers) == set(range(count)):
            return count
    return None


def _few(indexes: list[int]) -> str:
    shown = ", ".join(map(str, indexes[:20]))
    return f"[{shown}]" if len(indexes) <= 20 else f"[{shown}, ... ({len(indexes) - 20:,} more)]"


def missing(set_dir: Path) -> str:
    """What keeps the set from being whole, for messages (``of 4: missing [1, 3]``)."""
    done = completed(set_dir)
    parts = [f"of {n}: missing {_few(sorted(set(range(n)) - set(m)))}" for n, m in sorted(done.items())]
    return "; ".join(parts) or "no shard has finished"


def check_whole(set_dir: Path, keys: npt.NDArray[np.int64] | None = None) -> int:
    """The shard count N if the set is whole; FatalError saying what is missing otherwise.

    Whole: every shard 0..N-1 has its marker, and for each the outcomes readable now cover at least
    the row keys its marker counts (a shard whose files were not copied, or not all of them, is
    caught here rather than merged short). ``keys``: the packed keys with an outcome that counts
    (:meth:`~eagle3_raw.journal.Journal.outcome_keys`); without it, every key with an outcome.
    """
    if not (set_dir / "manifest.json").exists():
        raise FatalError(
            f"no set journal at {set_dir}: build the shards first (eagle3-raw build --shard i/N), "
            "or pass the --journal-dir (and --set options) the shards were built with"
        )
    count = whole_count(set_dir)
    if count is None:
        raise FatalError(
            f"the journal {set_dir} is not complete ({missing(set_dir)}); finish the missing shards, "
            "or merge anyway with --force (the set is then marked partial)"
        )
    _check_counts(set_dir, count, keys)
    return count


def _check_counts(set_dir: Path, count: int, keys: npt.NDArray[np.int64] | None) -> None:
    import numpy as np

    if keys is None:
        keys = np.unique(SetJournal.read(set_dir).entries().packed)
    indexes = keys >> 24
    for shard, marker in completed(set_dir)[count].items():
        expected = int(marker.get("keys", 0))
        readable = int(np.count_nonzero(indexes % count == shard))
        if readable < expected:
            raise JournalError(
                f"shard {shard}/{count} of {set_dir} finished with {expected} rows, but only {readable} "
                "can be read here: were all of its files (out-*, and generations/) copied? Missing rows "
                "are generated again by a build of the recipe"
            )
