"""What each trainer reads: the files of one export layout, their fields, and the trainer's limits.

Read in the trainers' own code (versions named; file:line in the installed wheels):

- ``specforge`` (SpecForge 0.2.0, online training): a JSONL file given as ``data.prompts_path``;
  a first record with ``input_ids`` and ``loss_mask`` makes the whole file pre-tokenized, other
  keys are ignored (``specforge/data/prompt_builder.py:57-83,219-252``); JSON only, no Parquet.
  Draft vocabulary: ``model.vocab_mapping_path``, a ``torch.save({"d2t", "t2d"})`` file
  (``specforge/modeling/draft/base.py:193-206``), required by online (disaggregated) EAGLE-3 runs
  (``specforge/application/planning.py:171-185``).
- ``speculators`` (speculators 0.9.0 ``prepare-data``): ``--data`` takes a ``.jsonl`` file or a
  folder of ``.json``/``.jsonl`` files read recursively (``speculators/data_generation/
  preprocessing.py:751-765``), so the rows go to ``data/`` and nothing else may be in it; rows with
  ``input_ids`` and ``loss_mask`` pass through, other columns dropped (``preprocessing.py:877,
  457-482``). Draft vocabulary: ``token_freq.pt`` (``torch.save({id: count})``,
  ``speculators/train/vocab_mapping.py:54-56``) and ``d2t-N.npy``/``t2d-N.npy``
  (``speculators/train/cli.py:343-392``).
- ``modelopt`` (NVIDIA Model-Optimizer): 0.47.0 reads only text/messages; its streaming dataset's
  tokenized sample is ``{"cid", "token_ids", "loss_mask"}`` with the row id from
  ``conversation_id`` (``modelopt/torch/speculative/plugins/hf_streaming_dataset.py:283-310``),
  and its draft vocabulary cache (``data.draft_vocab_cache``) is ``torch.save(d2t)``, int64
  (``hf_eagle.py:318-338``). The pre-tokenized ``token_ids`` + ``loss_mask`` input of its open PRs
  2338/2340 could not be read here (no GitHub access): this layout follows 0.47.0's names.
- ``jsonl`` / ``parquet``: every column of the set, nothing renamed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from eagle3_raw.errors import ExportError

VocabFormat = Literal["specforge", "speculators", "modelopt"]
_ROW_FIELDS = {"id": "id", "input_ids": "input_ids", "loss_mask": "loss_mask"}


@dataclass(frozen=True)
class TrainerLimit:
    """A trainer's length limit: its option name and default."""

    option: str
    default: int


@dataclass(frozen=True)
class Layout:
    """One export target: the rows file, its fields (output key -> set column), the vocabulary files."""

    name: str
    trainer: str
    data_file: str
    file_format: Literal["jsonl", "parquet"]
    fields: Mapping[str, str] | None
    vocab_formats: tuple[VocabFormat, ...]
    limit: TrainerLimit | None = None

    def data_path(self, config: str) -> str:
        """The rows file's path inside the output folder."""
        return self.data_file.format(name=config)

    def validation_path(self, config: str) -> str:
        """The held-out split's rows file: beside the train file, never inside a folder the trainer
        reads whole (speculators' ``data/``: ``validation/<name>.jsonl``)."""
        path = self.data_path(config)
        if "/" in path:  # a folder of rows: the validation file goes to a sibling folder
            return f"validation/{path.rsplit('/', 1)[1]}"
        stem, _, suffix = path.rpartition(".")
        return f"{stem}-validation.{suffix}"


LAYOUTS: Mapping[str, Layout] = {
    "specforge": Layout(
        "specforge", "SpecForge 0.2.0", "{name}.jsonl", "jsonl", _ROW_FIELDS, ("specforge",),
        TrainerLimit("data.max_length", 2048),
    ),
    "speculators": Layout(
        "speculators", "speculators 0.9.0", "data/{name}.jsonl", "jsonl", _ROW_FIELDS, ("speculators",),
        TrainerLimit("prepare-data --seq-length", 8192),
    ),
    "modelopt": Layout(
        "modelopt", "Model-Optimizer", "{name}.jsonl", "jsonl",
        {"conversation_id": "id", "token_ids": "input_ids", "loss_mask": "loss_mask"}, ("modelopt",),
    ),
    "jsonl": Layout("jsonl", "any", "{name}.jsonl", "jsonl", None, ("specforge", "speculators", "modelopt")),
    "parquet": Layout(
        "parquet", "any", "{name}.parquet", "parquet", None, ("specforge", "speculators", "modelopt")
    ),
}  # fmt: skip


def get_layout(name: str) -> Layout:
    """The layout called ``name``; ExportError listing them otherwise."""
    if name not in LAYOUTS:
        raise ExportError(f"layout {name!r}: expected one of {', '.join(LAYOUTS)}")
    return LAYOUTS[name]


def vocab_file_names(vocab_format: VocabFormat, size: int) -> list[str]:
    """The files of one draft size's mapping in one trainer's format (``token_freq.pt`` is common)."""
    if vocab_format == "speculators":
        return [f"d2t-{size}.npy", f"t2d-{size}.npy"]
    return [f"vocab_mapping-{size}.pt"] if vocab_format == "specforge" else [f"d2t-{size}.pt"]
