"""From set to trainer: the set in each trainer's input layout, and its draft-vocabulary files.

:func:`export` reads a recipe's set (built or reused) or a published one in Arrow batches and
writes, into one folder:

- the rows, in a layout (:mod:`.layouts`): ``specforge`` (JSONL for ``data.prompts_path``),
  ``speculators`` (a ``data/`` folder of JSONL for ``prepare-data --data``), ``modelopt``
  (``token_ids`` + ``loss_mask`` JSONL), ``jsonl`` or ``parquet`` (every column);
- optionally cut to ``max_length`` (``truncate`` or ``drop``), with what each choice costs in rows
  and supervised tokens (:mod:`.lengths`), since the trainers cut silently;
- ``token_freq.pt`` (generated-id counts), ``d2t``/``t2d`` for each draft vocabulary size in the
  layout's trainer formats, and ``draft_vocab.json`` (coverage, tie-break) (:mod:`.vocab`,
  :mod:`.writers`); the ``.pt`` files are written without torch (:mod:`.torchfile`).

The package, by concern: :mod:`.layouts`, :mod:`.lengths`, :mod:`.vocab`, :mod:`.torchfile`,
:mod:`.writers`, :mod:`.sources` (where the rows come from), :mod:`.commands` (the trainer commands
printed and put on the card), :mod:`.exporting` (:func:`export`), :mod:`.cli` (``eagle3-raw export``).

``eagle3_raw.export`` is both this package and the function :func:`eagle3_raw.export`: importing a
submodule binds the package over the function on ``eagle3_raw``, so the package is callable too
and calling it is calling :func:`export`.
"""

import sys
import types
from typing import TYPE_CHECKING, Any

from eagle3_raw.lazy import facade

if TYPE_CHECKING:
    from eagle3_raw.export.exporting import ExportResult, export
    from eagle3_raw.export.layouts import LAYOUTS, Layout
    from eagle3_raw.export.lengths import Cost, LengthReport
    from eagle3_raw.export.vocab import COMMON_SIZES, DraftMapping, TokenFrequencies, mapping

_EXPORTS = {
    "COMMON_SIZES": "vocab", "DraftMapping": "vocab", "TokenFrequencies": "vocab", "mapping": "vocab",
    "Cost": "lengths", "LengthReport": "lengths", "LAYOUTS": "layouts", "Layout": "layouts",
    "ExportResult": "exporting", "export": "exporting",
}  # fmt: skip
__getattr__, __dir__ = facade(__name__, _EXPORTS)


class _CallablePackage(types.ModuleType):
    def __call__(self, **options: Any) -> "ExportResult":
        exporting: Any = __getattr__("export")
        return exporting(**options)  # type: ignore[no-any-return]


sys.modules[__name__].__class__ = _CallablePackage

__all__ = [
    "COMMON_SIZES",
    "LAYOUTS",
    "Cost",
    "DraftMapping",
    "ExportResult",
    "Layout",
    "LengthReport",
    "TokenFrequencies",
    "export",
    "mapping",
]  # fmt: skip
