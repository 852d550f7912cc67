"""The served model: the reference engine, its tokenizer (unless ``--skip-tokenizer-init``), and
the facts the server reports about it (path, vocabulary, context length, ``config.json``).

Decoding reproduces ``PreTrainedTokenizerFast.decode``, including the optional space clean-up a
tokenizer config can ask for, so ``text`` matches what SGLang's detokenizer would send.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from eagle3_raw.reference.engine import ReferenceEngine


class Model:
    """The engine, its tokenizer (unless ``--skip-tokenizer-init``) and what the server reports."""

    def __init__(
        self,
        model_path: Path | None,
        *,
        tokenizer: bool,
        context_length: int | None,
        weight_version: str = "default",
    ) -> None:
        self.engine = ReferenceEngine(model_path)
        self.path = Path(self.engine.model_dir).resolve()
        self.weight_version = weight_version
        self.reported_path = str(model_path) if model_path is not None else packaged_model_name()
        """What ``/model_info`` says ``model_path`` is: the ``--model-path`` as given (SGLang's way),
        else a name of the packaged model that is the same on every install and changes with it."""
        self.vocab_size = self.engine.vocab_size
        if context_length is not None and context_length > self.engine.context_length:
            raise ValueError(
                f"--context-length {context_length} is greater than the model's max_position_embeddings "
                f"({self.engine.context_length})"
            )
        self.context_len = context_length or self.engine.context_length
        self.config = _read_json(self.path / "config.json")
        tokenizer_config = _read_json(self.path / "tokenizer_config.json")
        self._clean_up_spaces = bool(tokenizer_config.get("clean_up_tokenization_spaces", False))
        self.model_max_length = tokenizer_config.get("model_max_length")
        self.tokenizer = _load_tokenizer(self.path) if tokenizer else None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        assert self.tokenizer is not None
        ids: list[int] = self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool) -> str:
        """``PreTrainedTokenizerFast.decode`` (including its optional space clean-up)."""
        assert self.tokenizer is not None
        text: str = self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
        return _clean_up_tokenization(text) if self._clean_up_spaces else text

    def decode_raw(self, ids: Sequence[int]) -> str:
        """The text the scheduler matches stop strings against (special tokens kept)."""
        return self.decode(ids, False)


@functools.cache
def packaged_model_name() -> str:
    """``eagle3-raw-reference@<12 hex>``: the packaged model's name, with a digest of its files and of
    the engine's code, so a reference whose outputs could differ reports another model."""
    from eagle3_raw.reference import engine
    from eagle3_raw.resources import reference_model_dir

    digest = hashlib.sha256(Path(engine.__file__).read_bytes())
    for path in sorted(reference_model_dir().iterdir()):
        if path.is_file():
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return f"eagle3-raw-reference@{digest.hexdigest()[:12]}"


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    return data


def _load_tokenizer(path: Path) -> Any:
    from eagle3_raw.reference.model_files import load_raw_tokenizer

    return load_raw_tokenizer(path)


def _clean_up_tokenization(text: str) -> str:
    """``transformers``' ``clean_up_tokenization`` (for tokenizers that ask for it)."""
    for before, after in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                          (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):  # fmt: skip
        text = text.replace(before, after)
    return text
