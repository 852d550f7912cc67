"""``eagle3-raw inspect``: rows of a set decoded with its tokenizer, for a person to read.

Each row is shown with its id, lengths, finish reason and seed, then its ids decoded: the prompt,
then the generated span (``loss_mask`` 1), with every special or added token (``<|im_end|>``,
``<think>``) shown as itself. In a terminal the prompt is dim, the generated span bold and the
special tokens highlighted; otherwise (a pipe, a file, ``--plain``) the generated span is between
``⟦generated⟧`` and ``⟦/generated⟧``. Decoding is for display only: the set's ids are never
re-tokenized.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3_raw.card import GENERATED_END, GENERATED_START
from eagle3_raw.errors import FatalError
from eagle3_raw.opening import open_set
from eagle3_raw.printable import printable
from eagle3_raw.recipe import parse_set_args

if TYPE_CHECKING:
    import datasets
    from rich.console import Console
    from rich.text import Text
    from transformers import PreTrainedTokenizerBase

    SubParsers = argparse._SubParsersAction[argparse.ArgumentParser]

PROMPT_STYLE = "dim"
GENERATED_STYLE = "bold"
SPECIAL_STYLE = "reverse cyan"


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    """The set to open: a recipe or ``org/name[@rev]``, and how (shared with ``stats``)."""
    add = parser.add_argument
    add("target", metavar="RECIPE|ORG/NAME[@REV]", help="a recipe (as built) or a published set")
    add("--config", help="config of a published set (required when it has several)")
    add(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="recipe override, as for build (the set must have been built with it)",
    )  # fmt: skip
    add("--cache-dir", type=Path, help="datasets cache folder (default: HF_DATASETS_CACHE)")
    add(
        "--journal-dir", type=Path,
        help="journal root the recipe was built with (it names the set's target when the server is down)",
    )  # fmt: skip
    add(
        "--split", choices=("train", "validation"), default="train",
        help="which split (validation: the rows a recipe's splits section holds out; default train)",
    )  # fmt: skip


def add_inspect(sub: SubParsers) -> argparse.ArgumentParser:
    """Register ``inspect TARGET [--row ID | --index N] [--limit K] [--plain] [--tokenizer T]``."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "inspect",
        help="show rows decoded: the prompt and the generated span, special tokens visible",
        description="Decode rows of a built or published set with its tokenizer (display only).",
    )
    add_target_arguments(parser)
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--row", metavar="ID", help="the row with this id, or every row of this source_id")
    which.add_argument("--index", type=int, metavar="N", help="start at row position N (default 0)")
    parser.add_argument("--limit", type=int, default=3, metavar="K", help="rows to show (default 3)")
    parser.add_argument("--plain", action="store_true", help="plain text with markers, even in a terminal")
    parser.add_argument("--tokenizer", help="decode with this tokenizer (folder or Hub id) instead")
    parser.add_argument(
        "--trust-remote-code", action="store_true",
        help="let a published recipe's trust_remote_code: true run its tokenizer's Python code (needs a "
        "commit: model.revision, or ORG/NAME@COMMIT), as for reproduce",
    )  # fmt: skip
    parser.set_defaults(handler=run_inspect)
    return parser


def run_inspect(args: argparse.Namespace) -> int:
    """Handler of ``inspect``."""
    from rich.console import Console

    if args.limit < 1:
        raise FatalError(f"--limit {args.limit}: expected at least 1")
    opened = open_set(
        args.target, config=args.config, overrides=parse_set_args(args.overrides), cache_dir=args.cache_dir,
        tokenizer=args.tokenizer, journal_dir=args.journal_dir, trust_remote_code=args.trust_remote_code,
        split=args.split,
    )  # fmt: skip
    rows = select_rows(opened.dataset, row=args.row, index=args.index, limit=args.limit)
    console = Console(highlight=False, soft_wrap=True)
    styled = console.is_terminal and not args.plain
    show(console, opened.label, len(opened.dataset), rows, Decoder(opened.tokenizer()), styled=styled)
    return 0


def select_rows(
    dataset: datasets.Dataset, *, row: str | None, index: int | None, limit: int
) -> list[Mapping[str, Any]]:
    """The rows to show: by id (or source id), else ``limit`` rows from position ``index``."""
    if row is not None:
        positions = _positions(dataset, row)[:limit]
    else:
        start = index or 0
        if not 0 <= start < len(dataset):
            raise FatalError(
                f"--index {start}: the set has {len(dataset):,} rows (0 to {len(dataset) - 1:,})"
            )
        positions = list(range(start, min(start + limit, len(dataset))))
    return [dataset[p] | {"position": p} for p in positions]


def _positions(dataset: datasets.Dataset, wanted: str) -> list[int]:
    import pyarrow.compute as pc

    for column in ("id", "source_id"):
        values = dataset.select_columns([column]).with_format("arrow")[:][column]
        found = pc.indices_nonzero(pc.equal(values, wanted)).to_pylist()
        if found:
            return [int(p) for p in found]
    raise FatalError(f"no row has id or source_id {wanted!r} (ids look like <source_id>:<turn>:<sample>)")


@dataclass(frozen=True)
class Piece:
    """A run of decoded text: ``special`` for one special or added token, shown as itself."""

    text: str
    special: bool


class Decoder:
    """Decodes ids for display, keeping each special or added token as its own piece."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self.special = frozenset(tokenizer.all_special_ids) | frozenset(tokenizer.added_tokens_decoder)
        self.size = len(tokenizer)

    def pieces(self, ids: Sequence[int]) -> Iterator[Piece]:
        """Runs of ordinary ids decoded together (so multi-byte characters stay whole), and each
        special id alone; an id outside the vocabulary (a stranger's set) is shown as such."""
        run: list[int] = []
        for token in ids:
            outside = not 0 <= token < self.size
            if token in self.special or outside:
                if run:
                    yield Piece(self._decode(run), False)
                    run = []
                shown = f"⟦id {token}: not in the vocabulary⟧" if outside else self._decode([token])
                yield Piece(shown, True)
            else:
                run.append(token)
        if run:
            yield Piece(self._decode(run), False)

    def _decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False))


def show(
    console: Console,
    label: str,
    total: int,
    rows: Sequence[Mapping[str, Any]],
    decoder: Decoder,
    *,
    styled: bool,
) -> None:
    """Print ``rows``: a header per row, then its text (styled, or plain with markers)."""
    console.print(f"{printable(label)}: {total:,} rows", markup=False)
    for row in rows:
        console.print(_header(row), markup=False, style="bold" if styled else None)
        console.print(row_text(row, decoder, styled=styled))


def _header(row: Mapping[str, Any]) -> str:
    """The row's header line; its fields are a stranger's in a published set: escaped."""
    prompt_len, total = int(row["prompt_len"]), len(row["input_ids"])
    shown = {key: printable(row.get(key), limit=200) for key in
             ("id", "source_id", "turn", "sample", "finish_reason", "sampling_seed")}  # fmt: skip
    return (
        f"\n── row {row['position']:,}: {shown['id']} (source {shown['source_id']}, turn {shown['turn']}, "
        f"sample {shown['sample']}) · prompt {prompt_len:,} tokens · generated {total - prompt_len:,} · "
        f"finish_reason {shown['finish_reason']} · sampling_seed {shown['sampling_seed']}"
    )


def row_text(row: Mapping[str, Any], decoder: Decoder, *, styled: bool) -> Text:
    """The row's ids decoded: prompt, then the generated span; special tokens marked by style."""
    from rich.text import Text

    ids, boundary = list(row["input_ids"]), int(row["prompt_len"])
    text = Text()
    _append(text, decoder.pieces(ids[:boundary]), PROMPT_STYLE if styled else None, styled)
    if not styled:
        text.append(GENERATED_START)
    _append(text, decoder.pieces(ids[boundary:]), GENERATED_STYLE if styled else None, styled)
    if not styled:
        text.append(GENERATED_END)
    return text


def _append(text: Text, pieces: Iterator[Piece], style: str | None, styled: bool) -> None:
    """Each piece, its control characters but newlines and tabs escaped (``\x1b``): a model's
    text, or a stranger's tokenizer, cannot move the cursor or fake a line of the report."""
    for piece in pieces:
        special = f"{style} {SPECIAL_STYLE}" if style else SPECIAL_STYLE
        text.append(printable(piece.text, newlines=True), special if piece.special and styled else style)
