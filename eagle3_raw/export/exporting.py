"""One export: read the set in Arrow batches, reshape each batch for the layout, write, count.

Per batch, in this order: the SpecForge boundary variant (the mask extended one position left of
the first generated id), the length accounting at ``max_length`` (or at the trainer's default
limit, reported only), the cut itself, the count of generated ids, the write. Nothing else is
changed: the ids and the mask of every row written are the set's, position for position.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from eagle3_raw.errors import ExportError
from eagle3_raw.export import commands, folder, lengths
from eagle3_raw.export.layouts import Layout, get_layout
from eagle3_raw.export.lengths import LengthReport, LengthTally, Overflow
from eagle3_raw.export.sources import Source, from_hub, from_recipe
from eagle3_raw.export.vocab import FrequencyCounter, TokenFrequencies, check_sizes
from eagle3_raw.export.writers import row_writer, vocab_names, write_vocab_files
from eagle3_raw.hub.sets import arrow_batches

if TYPE_CHECKING:
    import pyarrow as pa

_GENERATED = "generated_mask"  # the set's own mask, kept beside an extended one for counting


@dataclass(frozen=True)
class ExportResult:
    """What :func:`export` wrote, what the length limit cost, and how to hand it to the trainer."""

    layout: str
    source: str
    output_dir: Path
    data_file: Path
    rows_read: int
    rows_written: int
    supervised_tokens: int
    longest_row: int
    lengths: LengthReport | None
    frequencies: TokenFrequencies
    vocab_from: str
    draft_vocab_sizes: tuple[int, ...]
    vocab_files: tuple[Path, ...]
    commands: tuple[str, ...]
    validation_file: Path | None = None
    """The held-out split's rows file (a recipe's ``splits``), or None."""
    validation_rows: int = 0
    """Rows written to ``validation_file`` (cut to ``max_length`` as the train rows are)."""
    validation_notes: tuple[str, ...] = ()
    """What the trainer can do with the held-out split, in its own option names."""

    def coverage(self) -> list[tuple[int, float]]:
        """``(size, share of generated tokens kept)`` for the common sizes and the sizes written."""
        sizes = sorted({*self.draft_vocab_sizes, *(s for s, _ in self.frequencies.coverage_table())})
        return [(size, self.frequencies.coverage(size)) for size in sizes]

    def render(self) -> str:
        """A plain-text summary for the terminal."""
        limit = get_layout(self.layout).limit
        written = f"{self.rows_written:,} of {self.rows_read:,} rows"
        written += " of the train split" if self.validation_file is not None else ""
        lines = [
            f"exported          {self.source} as {self.layout}: {written}",
            f"rows file         {self.data_file}",
            f"supervised tokens {self.supervised_tokens:,} (longest row {self.longest_row:,} tokens)",
        ]
        if self.lengths is not None:
            name = "max_length" if self.lengths.applied or limit is None else f"{limit.option} (default)"
            lines += ["lengths           " + line for line in self.lengths.render(name)]
        f = self.frequencies
        lines.append(
            f"generated ids     {f.total:,} tokens, {f.distinct:,} distinct of {f.vocab_size:,} "
            f"(target vocabulary from {self.vocab_from})"
        )
        lines += [
            f"coverage          {n:,} ids: {share:.2%} of generated tokens" for n, share in self.coverage()
        ]
        lines += [f"vocab file        {path}" for path in self.vocab_files]
        lines += [f"train with        {command}" for command in self.commands]
        if self.validation_file is not None:
            held = f"{self.validation_rows:,} rows, held out"
            lines.append(f"validation file   {self.validation_file} ({held})")
            lines += [f"validation        {note}" for note in self.validation_notes]
        return "\n".join(lines)


def export(
    *,
    output_dir: str | Path,
    recipe: Any = None,
    hub: str | None = None,
    config: str | None = None,
    layout: str = "specforge",
    max_length: int | None = None,
    overflow: Overflow = "truncate",
    extend_boundary: bool = False,
    draft_vocab_sizes: Sequence[int] | None = None,
    target_vocab_size: int | None = None,
    overrides: Mapping[str, Any] | Sequence[str] | None = None,
    cache_dir: str | Path | None = None,
    run_options: Mapping[str, Any] | None = None,
    token: str | None = None,
) -> ExportResult:
    """Write a set in ``layout`` (see :mod:`eagle3_raw.export`) into ``output_dir``; returns what it did.

    The rows come from ``recipe`` (built or reused, with ``overrides`` and ``run_options`` as in
    :func:`eagle3_raw.load`) or from the published ``hub`` set (``org/name[@revision]``, config
    ``config``). ``max_length`` cuts rows (``overflow``: ``truncate`` or ``drop``);
    ``extend_boundary`` (SpecForge only) sets the mask at the last prompt position.
    ``draft_vocab_sizes`` (default: the recipe's ``export.draft_vocab_sizes``) get mapping files.
    ``output_dir`` is new, empty, or an earlier export's holding only its files
    (:mod:`eagle3_raw.export.folder`): anything else is refused before the set is read.
    Raises ExportError for bad options and folders, RecipeError/HubError from the source.
    """
    chosen = get_layout(layout)
    lengths.check_max_length(max_length, overflow)
    if extend_boundary and chosen.name != "specforge":
        raise ExportError("extend_boundary is for SpecForge's mask shift (its issue 885): layout specforge")
    if (recipe is None) == (hub is None):
        raise ExportError("export needs exactly one source: recipe=... or hub='org/name[@revision]'")
    folder.check(Path(output_dir))  # before the set is built or fetched: refused, it costs nothing
    cache = Path(cache_dir) if cache_dir is not None else None
    source = (
        from_hub(hub, config=config, token=token, cache_dir=cache, target_vocab_size=target_vocab_size)
        if hub is not None
        else from_recipe(recipe, overrides=overrides, cache_dir=cache, run_options=run_options,
                         target_vocab_size=target_vocab_size)
    )  # fmt: skip
    sizes = check_sizes(draft_vocab_sizes if draft_vocab_sizes is not None else source.draft_vocab_sizes,
                        source.target_vocab_size)  # fmt: skip
    return _export(source, chosen, Path(output_dir), _Options(max_length, overflow, extend_boundary, sizes))


@dataclass(frozen=True)
class _Options:
    max_length: int | None
    overflow: Overflow
    extend_boundary: bool
    sizes: tuple[int, ...]


@dataclass
class _Totals:
    rows_read: int = 0
    rows_written: int = 0
    supervised: int = 0
    longest: int = 0


def _export(source: Source, layout: Layout, output_dir: Path, options: _Options) -> ExportResult:
    data_file = output_dir / layout.data_path(source.name)
    held = layout.validation_path(source.name) if source.validation is not None else None
    written = [layout.data_path(source.name), *([held] if held else []),
               *vocab_names(options.sizes, layout.vocab_formats)]  # fmt: skip
    folder.claim(output_dir, written)  # only the earlier export's own files are removed
    limit = options.max_length or (layout.limit.default if layout.limit else None)
    tally = LengthTally(limit) if limit is not None else None
    counter, totals = FrequencyCounter(source.target_vocab_size), _Totals()
    with row_writer(layout, data_file) as writer:
        for table in _batches(source.dataset, layout):
            table = _reshape(table, options, tally, totals)
            counter.add(table, _GENERATED if options.extend_boundary else "loss_mask")
            writer.write(table.drop_columns([c for c in (_GENERATED,) if c in table.column_names]))
    frequencies = counter.result()  # the train rows only: the draft vocabulary never sees validation
    validation_rows = _write_validation(source, layout, output_dir / held, options) if held else 0
    vocab_files = write_vocab_files(output_dir, frequencies, options.sizes, layout.vocab_formats)
    report = tally.report(options.overflow if options.max_length else None) if tally else None
    hub_ref = (source.repo_id, source.name) if source.repo_id else None
    handed = commands.for_layout(layout.name, str(data_file), options.max_length or totals.longest,
                                 options.sizes, str(output_dir), hub=hub_ref)  # fmt: skip
    seq, held_file = options.max_length or totals.longest, str(output_dir / held) if held else ""
    notes = commands.validation_notes(layout.name, str(data_file), held_file, seq) if held else ()
    return ExportResult(
        layout.name, source.label, output_dir, data_file, totals.rows_read, totals.rows_written,
        totals.supervised, totals.longest, report, frequencies, source.vocab_from, options.sizes,
        tuple(vocab_files), tuple(handed), output_dir / held if held else None, validation_rows, tuple(notes),
    )  # fmt: skip


def _write_validation(source: Source, layout: Layout, path: Path, options: _Options) -> int:
    """The held-out split into ``path``, reshaped as the train rows are (the boundary variant, the
    cut at ``max_length``); returns the rows written."""
    tally = LengthTally(options.max_length) if options.max_length is not None else None
    totals = _Totals()
    with row_writer(layout, path) as writer:
        for table in _batches(source.validation, layout):
            table = _reshape(table, options, tally, totals)
            writer.write(table.drop_columns([c for c in (_GENERATED,) if c in table.column_names]))
    return totals.rows_written


def _batches(dataset: Any, layout: Layout) -> Any:
    needed = ["id", "input_ids", "loss_mask", "prompt_len"]
    missing = [c for c in needed if c not in dataset.column_names]
    if missing:
        raise ExportError(f"the set has no column {missing[0]!r}: is it an eagle3_raw set?")
    wanted = list(dict.fromkeys([*(layout.fields or {}).values(), *needed]))
    return arrow_batches(dataset, dataset.column_names if layout.fields is None else wanted)


def _reshape(table: pa.Table, options: _Options, tally: LengthTally | None, totals: _Totals) -> pa.Table:
    totals.rows_read += table.num_rows
    if options.extend_boundary:
        prompt_len = table["prompt_len"].to_numpy().astype(np.int64)
        extended = lengths.extend_boundary(table["loss_mask"], prompt_len)
        table = table.append_column(_GENERATED, table["loss_mask"])
        table = table.set_column(table.schema.get_field_index("loss_mask"), "loss_mask", extended)
    if tally is not None:
        measured = lengths.measure(table["loss_mask"], tally.max_length)
        tally.add(measured)
        if options.max_length is not None:
            table = lengths.apply(table, measured, options.max_length, options.overflow)
    mask, offsets = lengths.flat_values(table["loss_mask"])
    totals.rows_written += table.num_rows
    totals.supervised += int(mask.sum(dtype=np.int64))
    totals.longest = max(totals.longest, int(np.diff(offsets).max(initial=0)))
    return table
