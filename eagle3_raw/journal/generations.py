"""The generation store: every ``/generate`` exchange made for one target, kept once, by request digest.

``<root>/generations/<model>/`` holds the logs (:mod:`.log`) of every process that generated for
that model (:attr:`~eagle3_raw.identity.Target.model_digest`), whatever set or recipe it worked
for, and ``target.json`` saying which model that is. A generation is found by its request digest;
an input key (the memo of :mod:`eagle3_raw.identity`) leads to the digest of the request it
produced, so a rerun with unchanged inputs needs no rendering.

:class:`GenerationIndex` is a snapshot of the store's index files: sorted numpy columns, about 60
bytes per generation, no row data. Lookups are binary searches.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from eagle3_raw.journal.files import make_private_dir, replace_durably
from eagle3_raw.journal.log import LogKind, LogWriter, RecordReader, entry_columns, log_files
from eagle3_raw.journal.records import (
    ALIAS,
    GEN_FIXED,
    GENERATION,
    MAGIC_GENERATION,
    Generation,
    decode_generation,
    encode_alias,
    encode_generation,
    generation_keys,
)

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from eagle3_raw.identity import Target

GENERATION_LOG = LogKind(MAGIC_GENERATION, GEN_FIXED.size, generation_keys)
_PREFIX = "gen"


def generations_dir(root: Path, target: Target) -> Path:
    """The folder of ``target``'s model's generations under the journal root ``root``."""
    return root / "generations" / target.model_digest.hex()


@dataclass(frozen=True)
class Location:
    """Where a generation's record is."""

    path: Path
    offset: int
    length: int


class GenerationIndex:
    """A snapshot of a generation folder's index files (see the module docstring).

    Columns, about 62 bytes a record: generations sorted by digest (first record wins: lowest file,
    then offset) with their locations, and every record's input key sorted, with its digest.
    """

    def __init__(self, directory: Path) -> None:
        import numpy as np

        self.files = log_files(directory, _PREFIX) if directory.is_dir() else []
        c = entry_columns(self.files)
        generated = np.flatnonzero(c["kind"] == GENERATION)
        order = generated[np.argsort(c["key1"][generated], kind="stable")]
        self._digests = c["key1"][order]
        self._file, self._offset, self._length = c["file"][order], c["offset"][order], c["length"][order]
        del order, generated, c["file"], c["offset"], c["length"], c["kind"]
        by_key = np.argsort(c["key2"], kind="stable")
        self._keys, self._key_digests = c["key2"][by_key], c["key1"][by_key]

    def __len__(self) -> int:
        return len(self._digests)

    @property
    def nbytes(self) -> int:
        arrays = (self._digests, self._file, self._offset, self._length, self._keys, self._key_digests)
        return sum(a.nbytes for a in arrays)

    def locate(self, digest: bytes) -> Location | None:
        """Where the generation of ``digest`` is, or None if the store has none."""
        at = _find(self._digests, digest)
        if at is None:
            return None
        return Location(self.files[int(self._file[at])], int(self._offset[at]), int(self._length[at]))

    def locate_all(self, digests: npt.NDArray[Any]) -> list[Location]:
        """Where the generations of ``digests`` (an ``S16`` array, every one in the store) are: one
        binary search for them all."""
        import numpy as np

        at = np.searchsorted(self._digests, digests)
        assert bool((self._digests[at] == digests).all()), "locate_all: a digest is not in the store"
        columns = (self._file[at].tolist(), self._offset[at].tolist(), self._length[at].tolist())
        return [Location(self.files[f], o, n) for f, o, n in zip(*columns, strict=True)]

    def has(self, digests: npt.NDArray[Any]) -> npt.NDArray[np.bool_]:
        """For each of ``digests`` (an ``S16`` array), whether the store has its generation."""
        import numpy as np

        order = np.argsort(digests, kind="stable")  # not np.isin: it sorts a copy of both
        at = np.empty(len(digests), np.intp)
        at[order] = np.searchsorted(self._digests, digests[order])  # in order: each search resumes
        found = at < len(self._digests)
        found[found] = self._digests[at[found]] == digests[found]
        return found

    def memo(self, input_key: bytes) -> bytes | None:
        """The digest of the request ``input_key`` produced, if one is journaled with its generation."""
        at = _find(self._keys, input_key)
        if at is None:
            return None
        digest = bytes(self._key_digests[at]).ljust(16, b"\0")  # numpy drops trailing NULs of S16
        return digest if self.locate(digest) is not None else None


def _find(ordered: npt.NDArray[Any], value: bytes) -> int | None:
    """The position of ``value`` in the sorted ``S16`` column ``ordered``, or None."""
    import numpy as np

    sought = np.array(value, dtype="S16")
    at = int(np.searchsorted(ordered, sought))
    return at if at < len(ordered) and ordered[at] == sought else None


class GenerationStore:
    """Writing a target's generations (one log per process) and reading them back."""

    def __init__(self, directory: Path, target: Target | None = None) -> None:
        """``directory`` is ``generations_dir(root, target)``."""
        self.directory = directory
        self._target = target
        self._writer: LogWriter | None = None
        self._reader = RecordReader(MAGIC_GENERATION)

    def open_writer(self, *, flush_interval: float = 1.0) -> None:
        """Become a writer of this store (a log of this process's own)."""
        make_private_dir(self.directory, self.directory.parent.parent)
        if self._target is not None and not (self.directory / "target.json").exists():
            data = orjson.dumps(self._target.to_dict(), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)
            replace_durably(self.directory / "target.json", data)
        self._writer = LogWriter(self.directory, _PREFIX, GENERATION_LOG, flush_interval=flush_interval)

    @property
    def writer(self) -> LogWriter:
        assert self._writer is not None, "open_writer() first"
        return self._writer

    @property
    def writer_or_none(self) -> LogWriter | None:
        return self._writer

    def put(
        self, digest: bytes, input_key: bytes, prompt_ids: Sequence[int], output_ids: Sequence[int],
        info: Mapping[str, Any],
    ) -> None:  # fmt: skip
        """Journal one generation (durable with the next flush)."""
        record = encode_generation(digest, input_key, prompt_ids, output_ids, info)
        self.writer.append(record, digest, input_key, GENERATION)

    def alias(self, digest: bytes, input_key: bytes) -> None:
        """Journal that ``input_key`` produced the request already journaled under ``digest``."""
        self.writer.append(encode_alias(digest, input_key), digest, input_key, ALIAS)

    def index(self) -> GenerationIndex:
        """A snapshot of everything journaled here (this process's records flushed first)."""
        if self._writer is not None:
            self._writer.flush()
        return GenerationIndex(self.directory)

    def read(self, location: Location) -> Generation:
        return decode_generation(self._reader.read(location.path, location.offset, location.length))

    def read_bytes(self, path: Path, length: int, offset: int) -> bytes:
        """``length`` bytes of the log ``path`` at ``offset``, unchecked (descriptors kept open until
        :meth:`close_readers`)."""
        return self._reader.pread(path, length, offset)

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close_readers(self) -> None:
        self._reader.close()

    def close(self) -> None:
        try:
            if self._writer is not None:
                self._writer.close()
        finally:
            self._reader.close()
