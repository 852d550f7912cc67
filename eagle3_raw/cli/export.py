"""``eagle3-raw export``: argument parsing for :func:`eagle3_raw.export.export`."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from eagle3_raw.cli.common import add_run_arguments, run_kwargs
from eagle3_raw.errors import ExportError
from eagle3_raw.export import export
from eagle3_raw.export.layouts import LAYOUTS
from eagle3_raw.export.lengths import OVERFLOWS
from eagle3_raw.recipe import parse_set_args

if TYPE_CHECKING:
    SubParsers = argparse._SubParsersAction[argparse.ArgumentParser]


def add_export(sub: SubParsers) -> argparse.ArgumentParser:
    """Register ``export (RECIPE | --hub ORG/NAME[@REV]) --layout L --output DIR [...]``."""

    parser: argparse.ArgumentParser = sub.add_parser(
        "export",
        help="write a set in a trainer's input layout, with token frequencies and draft-vocabulary files",
        description="Read a recipe's set (built or reused) or a published set in batches and write it in "
        "the layout a trainer reads, optionally cut to --max-length, with token_freq.pt, d2t/t2d files "
        "for each --draft-vocab-size and what the length limit costs.",
    )
    add = parser.add_argument
    add("recipe", nargs="?", help="recipe YAML file or bundled recipe name (or use --hub)")
    add("--hub", metavar="ORG/NAME[@REVISION]", help="export a published set instead of a recipe's")
    add("--config", help="with --hub: which config (required when the repo has several)")
    add("--layout", choices=sorted(LAYOUTS), default="specforge", help="trainer layout (default specforge)")
    add("--output", type=Path, required=True, metavar="DIR", help="folder to write into")
    add("--max-length", type=int, help="cut rows to this many tokens (default: keep them whole)")
    add("--overflow", choices=OVERFLOWS, default="truncate", help="rows over --max-length: truncate or drop")
    add(
        "--extend-boundary",
        action="store_true",
        help="specforge: also supervise the last prompt position (SpecForge issue 885)",
    )
    add(
        "--draft-vocab-size", dest="draft_vocab_sizes", type=int, action="append", metavar="N",
        help="write d2t/t2d for a draft vocabulary of N ids (repeatable; default: the recipe's "
        "export.draft_vocab_sizes)",
    )  # fmt: skip
    add("--target-vocab-size", type=int, help="t2d length (default: the target model's config.json)")
    add(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override a recipe field (repeatable; VALUE is YAML)",
    )  # fmt: skip
    add("--cache-dir", type=Path, help="datasets cache folder (default: HF_DATASETS_CACHE)")
    add_run_arguments(parser)
    parser.set_defaults(handler=run_export)
    return parser


def run_export(args: argparse.Namespace) -> int:
    """Handler of ``export``: prints what was written, what the length limit costs, the trainer commands."""
    if (args.recipe is None) == (args.hub is None):
        raise ExportError("give a RECIPE or --hub ORG/NAME[@REVISION] (one of them)")
    result = export(
        recipe=args.recipe, hub=args.hub, config=args.config, layout=args.layout, output_dir=args.output,
        max_length=args.max_length, overflow=args.overflow, extend_boundary=args.extend_boundary,
        draft_vocab_sizes=args.draft_vocab_sizes, target_vocab_size=args.target_vocab_size,
        overrides=parse_set_args(args.overrides), cache_dir=args.cache_dir, run_options=run_kwargs(args),
    )  # fmt: skip
    print(result.render())
    return 0
