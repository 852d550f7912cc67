"""The served model: the reference engine, its tokenizer (unless ``--skip-tokenizer-init``), and
the facts the server reports about it (path, vocabulary, context length, ``config.json``).

``--model-path`` may also name a foreign tokenizer folder (:mod:`eagle3_raw.reference.foreign`):
the server then tokenizes, renders chats and generates in that tokenizer's vocabulary. The chat
template is the tokenizer's, or ``--chat-template FILE`` read as SGLang reads it
(:func:`eagle3_raw.sglang.chatpath.read_template_file`); the ``transformers`` tokenizer that renders chats
is loaded on the first chat request.

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

from eagle3_raw.reference import engine, toolargs
from eagle3_raw.reference.engine import ReferenceEngine
from eagle3_raw.reference.foreign import ForeignEngine, is_foreign
from eagle3_raw.reference.model_files import load_raw_tokenizer, load_tokenizer, reference_model_dir
from eagle3_raw.sglang.chatpath import read_template_file, resolve_template


class Model:
    """The engine, its tokenizer (unless ``--skip-tokenizer-init``) and what the server reports."""

    def __init__(
        self,
        model_path: Path | None,
        *,
        tokenizer: bool,
        context_length: int | None,
        chat_template: Path | None = None,
        weight_version: str = "default",
        trust_remote_code: bool = False,
    ) -> None:
        foreign = model_path is not None and is_foreign(model_path)
        self.engine: ReferenceEngine | ForeignEngine = (
            ForeignEngine(model_path) if model_path is not None and foreign else ReferenceEngine(model_path)
        )
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
        self.trust_remote_code = trust_remote_code
        self.chat_template_path = chat_template
        self.chat_template_override = _read_template(chat_template)
        self._chat_tokenizer: Any = None

    @property
    def chat_tokenizer(self) -> Any:
        """The ``transformers`` tokenizer that renders chats (loaded on first use, offline)."""
        if self._chat_tokenizer is None:
            self._chat_tokenizer = load_tokenizer(self.path, trust_remote_code=self.trust_remote_code)
        return self._chat_tokenizer

    @property
    def chat_template(self) -> str | None:
        """The template chats render with: ``--chat-template``'s, else the tokenizer's."""
        return resolve_template(self.chat_tokenizer, self.chat_template_override)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if self.trust_remote_code:  # the folder's tokenizer class may encode its own way: SGLang runs it
            return list(self.chat_tokenizer.encode(text, add_special_tokens=add_special_tokens))
        return self._encode(text, add_special_tokens)

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
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
    digest = hashlib.sha256(Path(engine.__file__).read_bytes() + Path(toolargs.__file__).read_bytes())
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


def _read_template(path: Path | None) -> str | None:
    """SGLang's ``--chat-template`` loading for a ``.jinja`` file (``template_manager.py:221``)."""
    if path is None:
        return None

    if not path.exists():
        raise ValueError(
            f"Chat template {path} is not a built-in template name or a valid chat template file path."
        )
    if path.suffix != ".jinja":
        raise ValueError(f"--chat-template {path}: the reference server reads Jinja files (.jinja) only")
    return read_template_file(path)


def _load_tokenizer(path: Path) -> Any:
    return load_raw_tokenizer(path)


def _clean_up_tokenization(text: str) -> str:
    """``transformers``' ``clean_up_tokenization`` (for tokenizers that ask for it)."""
    for before, after in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                          (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):  # fmt: skip
        text = text.replace(before, after)
    return text
