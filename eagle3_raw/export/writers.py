"""Writing an export: rows batch by batch (JSONL or Parquet), then the draft-vocabulary files.

JSONL rows are serialized by orjson straight from numpy views of the Arrow buffers (a list
column never becomes Python ints); a file is written under a temporary name and renamed when
complete, so a failed export leaves no file that looks finished.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import orjson

from eagle3_raw.export import torchfile
from eagle3_raw.export.layouts import Layout, VocabFormat, vocab_file_names
from eagle3_raw.export.lengths import flat_values
from eagle3_raw.export.vocab import TokenFrequencies, mapping

if TYPE_CHECKING:
    import pyarrow as pa

TIE_BREAK = (
    "highest count first; equal counts: smaller id first; fewer generated ids than the size: "
    "the smallest ungenerated ids fill the rest (speculators 0.9.0's rule)"
)


class RowWriter(Protocol):
    def write(self, table: pa.Table) -> None: ...


@contextlib.contextmanager
def row_writer(layout: Layout, path: Path) -> Iterator[RowWriter]:
    """A writer of ``layout``'s rows into ``path`` (renamed into place only when it completes)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    try:
        if layout.file_format == "parquet":
            _private(partial)
            with _ParquetWriter(partial) as parquet:
                yield parquet
        else:
            with _private(partial).open("wb") as handle:
                yield _JsonlWriter(handle, layout.fields)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def _private(path: Path) -> Path:
    """``path`` created empty, readable by the user only (0600: the rows are the user's data)."""
    path.unlink(missing_ok=True)
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    return path


def write_private(path: Path, content: bytes) -> None:
    """``content`` into ``path``, created 0600 (see :func:`_private`)."""
    with _private(path).open("wb") as handle:
        handle.write(content)


class _JsonlWriter:
    def __init__(self, handle: Any, fields: Mapping[str, str] | None) -> None:
        self._handle = handle
        self._fields = fields

    def write(self, table: pa.Table) -> None:
        import pyarrow as pa

        fields = self._fields or {name: name for name in table.column_names}
        columns: dict[str, Any] = {}
        for key, name in fields.items():
            column = table[name]
            flat = pa.types.is_list(column.type) and pa.types.is_integer(column.type.value_type)
            columns[key] = flat_values(column) if flat else column.to_pylist()  # ids flat; spans as dicts
        self._handle.write(b"".join(_lines(columns, table.num_rows)))


def _lines(columns: Mapping[str, Any], rows: int) -> Iterator[bytes]:
    option = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_APPEND_NEWLINE
    for i in range(rows):
        row = {
            key: value[0][value[1][i] : value[1][i + 1]] if isinstance(value, tuple) else value[i]
            for key, value in columns.items()
        }
        yield orjson.dumps(row, option=option)


class _ParquetWriter:
    def __init__(self, path: Path) -> None:
        self._path = path
        self._writer: Any = None

    def __enter__(self) -> _ParquetWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._writer is not None:
            self._writer.close()

    def write(self, table: pa.Table) -> None:
        import pyarrow.parquet as pq

        if self._writer is None:
            self._writer = pq.ParquetWriter(str(self._path), table.schema)
        self._writer.write_table(table)


# --- draft vocabulary ------------------------------------------------------------------------------


def write_vocab_files(
    folder: Path, frequencies: TokenFrequencies, sizes: Sequence[int], formats: Sequence[VocabFormat]
) -> list[Path]:
    """Write :func:`vocab_files` into ``folder``; returns the paths."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    paths = []
    for name, content in vocab_files(frequencies, sizes, formats).items():
        write_private(folder / name, content)
        paths.append(folder / name)
    return paths


def vocab_names(sizes: Sequence[int], formats: Sequence[VocabFormat]) -> list[str]:
    """The names :func:`vocab_files` gives its files, known before anything is counted."""
    names = ["token_freq.pt", "draft_vocab.json"]
    return names + [name for size in sizes for f in formats for name in vocab_file_names(f, size)]


def vocab_files(
    frequencies: TokenFrequencies, sizes: Sequence[int], formats: Sequence[VocabFormat]
) -> dict[str, bytes]:
    """``token_freq.pt``, each size's mapping in each of ``formats``, and ``draft_vocab.json``, by name."""
    files = {"token_freq.pt": torchfile.int_dict_file("token_freq", frequencies.as_dict())}
    for size in sizes:
        drafted = mapping(frequencies, size)
        for vocab_format in formats:
            files.update(_mapping_files(vocab_format, size, drafted.d2t, drafted.t2d))
    summary = vocab_summary(frequencies, sizes)
    files["draft_vocab.json"] = orjson.dumps(summary, option=orjson.OPT_INDENT_2) + b"\n"
    return files


def _mapping_files(
    vocab_format: VocabFormat, size: int, d2t: np.ndarray, t2d: np.ndarray
) -> dict[str, bytes]:
    names = vocab_file_names(vocab_format, size)
    stem = names[0].removesuffix(".pt")
    if vocab_format == "specforge":
        return {names[0]: torchfile.tensors_file(stem, {"d2t": d2t, "t2d": t2d})}
    if vocab_format == "modelopt":
        return {names[0]: torchfile.tensor_file(stem, d2t)}
    return {names[0]: _npy(d2t), names[1]: _npy(t2d)}


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def vocab_summary(frequencies: TokenFrequencies, sizes: Sequence[int]) -> dict[str, Any]:
    """What ``draft_vocab.json`` says: the counts behind the files and the coverage of each size."""
    shown = sorted({*sizes, *(size for size, _ in frequencies.coverage_table())})
    return {
        "target_vocab_size": frequencies.vocab_size,
        "generated_tokens": frequencies.total,
        "distinct_generated_ids": frequencies.distinct,
        "counted": "input_ids where loss_mask == 1 (the generated ids, stop token included)",
        "tie_break": TIE_BREAK,
        "mapping_sizes": list(sizes),
        "coverage": {str(size): round(frequencies.coverage(size), 6) for size in shown},
    }
