"""Run inside the speculators 0.9.0 environment by ``scripts/prove_trainers.py``; prints one JSON line.

Argument: a JSON file with ``model`` (the target model folder), ``vocab_size``, ``size`` (draft
vocabulary), ``export`` (the speculators export folder), ``outputs`` (name -> {"dir": prepare-data
--output, "expect": JSONL of the rows it must hold}; ``full`` must be one) and ``no_freq_output`` (a
prepare-data output made without --no-skip-token-freq).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from importlib.metadata import version
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from datasets import load_from_disk
from speculators.model import DraftVocabMixin
from speculators.train.cli import _load_mappings, parse_vocab_mappings
from speculators.train.config import TrainConfig
from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution


def rows(path: Path) -> Counter[tuple[tuple[int, ...], tuple[int, ...]]]:
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return Counter((tuple(r["input_ids"]), tuple(r["loss_mask"])) for r in lines)


def prepared(folder: Path) -> Counter[tuple[tuple[int, ...], tuple[int, ...]]]:
    data = load_from_disk(str(folder))
    assert set(data.column_names) == {"input_ids", "loss_mask", "seq_len"}, data.column_names
    return Counter((tuple(r["input_ids"]), tuple(r["loss_mask"])) for r in data.with_format(None))


def check_outputs(config: dict[str, Any]) -> dict[str, Any]:
    results = {}
    for name, case in config["outputs"].items():
        got, want = prepared(Path(case["dir"])), rows(Path(case["expect"]))
        results[name] = {"rows": sum(got.values()), "expected": sum(want.values()), "identical": got == want}
    return results


def check_frequencies(config: dict[str, Any]) -> dict[str, Any]:
    ours = torch.load(Path(config["export"]) / "token_freq.pt", weights_only=True)
    theirs = torch.load(Path(config["outputs"]["full"]["dir"]) / "token_freq.pt", weights_only=True)
    return {"ours_loads": isinstance(ours, dict), "equal_to_prepare_data": ours == theirs, "ids": len(ours)}


def train_args(*flags: str) -> argparse.Namespace:
    cfg = TrainConfig.resolve(list(flags))
    return argparse.Namespace(**cfg.flatten())


def check_mappings(config: dict[str, Any]) -> dict[str, Any]:
    size, vocab, export = config["size"], config["vocab_size"], Path(config["export"])
    d2t, t2d, drafted = _load_mappings(export / f"d2t-{size}.npy", export / f"t2d-{size}.npy", size)
    ours = torch.load(export / "token_freq.pt", weights_only=True)
    rebuilt = build_vocab_mappings_from_distribution(ours, size, vocab)
    base = ["--verifier-name-or-path", config["model"], "--draft-vocab-size", str(size)]
    given = parse_vocab_mappings(
        train_args(
            *base,
            "--data-path",
            str(export),
            "--d2t-path",
            str(export / f"d2t-{size}.npy"),
            "--t2d-path",
            str(export / f"t2d-{size}.npy"),
        )
    )
    full = config["outputs"]["full"]["dir"]
    from_freq = parse_vocab_mappings(train_args(*base, "--data-path", full))
    no_freq = parse_vocab_mappings(train_args(*base, "--data-path", config["no_freq_output"]))
    return {
        "loaded": drafted == size and d2t.dtype == torch.int64 and t2d.dtype == torch.bool,
        "equal_to_speculators_rule": torch.equal(rebuilt[0], d2t) and torch.equal(rebuilt[1], t2d),
        "train_loads_given_files": torch.equal(given[0], d2t) and torch.equal(given[1], t2d),
        "train_rebuilds_same_from_prepare_data": torch.equal(from_freq[0], d2t)
        and torch.equal(from_freq[1], t2d),
        "full_vocabulary_without_no_skip_token_freq": no_freq[0] is None and no_freq[2] == vocab,
        "model_accepts": model_accepts(d2t, t2d, size, vocab),
    }


def model_accepts(d2t: torch.Tensor, t2d: torch.Tensor, size: int, vocab: int) -> bool:
    """speculators' own checks of a draft's buffers (``speculators/model.py:81-121``)."""

    class Draft(DraftVocabMixin):
        def __init__(self) -> None:
            super().__init__()
            layer = SimpleNamespace(vocab_size=vocab, hidden_size=8, pad_token_id=None)
            self._init_vocab(SimpleNamespace(transformer_layer_config=layer, draft_vocab_size=size))

    draft = Draft()
    draft.load_vocab_mappings(t2d, d2t)
    return bool(torch.equal(draft.d2t, d2t) and torch.equal(draft.t2d, t2d))


def main() -> None:
    config = json.loads(Path(sys.argv[1]).read_text())
    result = {
        "versions": {name: version(name) for name in ("speculators", "torch", "transformers", "datasets")},
        "outputs": check_outputs(config),
        "token_freq": check_frequencies(config),
        "mappings": check_mappings(config),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
