"""The reference engine behind a foreign tokenizer: ``serve-reference --model-path DIR`` where DIR is a
tokenizer folder (``tokenizer.json``, ``tokenizer_config.json``, optionally ``config.json`` /
``generation_config.json``) rather than the packaged model (no ``segments.json``).

Generation goes through the packaged engine and back: the prompt ids are decoded with the folder's
tokenizer and encoded with the reference one, the reference engine writes its stream (with
``ignore_eos``, so it runs past each answer), every answer's text is encoded with the folder's
tokenizer and ended with the folder's EOS id, and that foreign stream is cut exactly as the packaged
engine cuts its own (stop ids from ``min_new_tokens`` on, ``max_new_tokens``). Same prompt, params
and seed give the same ids; every id is inside the folder's vocabulary.

Facts the server reports: ``vocab_size`` is ``config.json``'s, else the tokenizer's length;
``context_length`` is ``config.json``'s ``max_position_embeddings``, else ``tokenizer_config.json``'s
``model_max_length`` when it is a real limit (at most 2**24), else 4096; the EOS id is
``generation_config.json``'s, else ``config.json``'s (the first of a list), else the tokenizer's
``eos_token``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from eagle3_raw.reference.engine import EngineOutput, EngineParams, ReferenceEngine, collect

_DEFAULT_CONTEXT = 4096
_MAX_REAL_LIMIT = 1 << 24


def is_foreign(model_dir: Path | None) -> bool:
    """A folder other than a reference model folder (which has ``segments.json``)."""
    return model_dir is not None and not (model_dir / "segments.json").exists()


class ForeignEngine:
    """:class:`ReferenceEngine`'s interface over a foreign tokenizer folder (see the module docs)."""

    def __init__(self, model_dir: Path) -> None:
        import tokenizers

        if not (model_dir / "tokenizer.json").is_file():
            raise ValueError(f"--model-path {model_dir}: no tokenizer.json (a tokenizer folder is needed)")
        self.model_dir = model_dir
        self.inner = ReferenceEngine()
        self._tokenizer = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self._reference = tokenizers.Tokenizer.from_file(str(self.inner.model_dir / "tokenizer.json"))
        config = _json(model_dir / "config.json")
        tokenizer_config = _json(model_dir / "tokenizer_config.json")
        size = config.get("vocab_size")
        self.vocab_size: int = size if isinstance(size, int) else self._tokenizer.get_vocab_size(True)
        self.context_length: int = _context_length(config, tokenizer_config)
        self.eos_token_id: int = self._eos(config, tokenizer_config)

    def _eos(self, config: dict[str, Any], tokenizer_config: dict[str, Any]) -> int:
        generation = _json(self.model_dir / "generation_config.json")
        for value in (generation.get("eos_token_id"), config.get("eos_token_id")):
            first = value[0] if isinstance(value, list) and value else value
            if isinstance(first, int):
                return first
        token = tokenizer_config.get("eos_token")
        token = token.get("content") if isinstance(token, dict) else token
        eos = self._tokenizer.token_to_id(token) if isinstance(token, str) else None
        if eos is None:
            raise ValueError(f"--model-path {self.model_dir}: no EOS id found")
        return eos

    def generate(self, input_ids: Sequence[int], params: EngineParams) -> EngineOutput:
        """The packaged engine's answer, in this tokenizer's ids (see the module docs)."""
        if params.max_new_tokens == 0:
            return EngineOutput([], "length", None)
        prompt = self._to_reference(input_ids)
        return collect(self._stream(prompt, params), params, self.eos_token_id)

    def _to_reference(self, input_ids: Sequence[int]) -> list[int]:
        ids = [i for i in input_ids if 0 <= i < self.vocab_size]
        text = self._tokenizer.decode(ids, skip_special_tokens=False)
        encoded: list[int] = self._reference.encode(text, add_special_tokens=False).ids
        return encoded

    def _stream(self, prompt: list[int], params: EngineParams) -> Iterator[list[int]]:
        """Foreign answers, each ended by EOS, from ever longer reference streams (never repeats ids)."""
        budget, done = max(64, 2 * params.max_new_tokens + 16), 0
        while True:
            answers = self._answers(prompt, params, budget)
            for answer in answers[done:-1]:  # the last one may be cut short by the budget
                yield [*self._tokenizer.encode(answer, add_special_tokens=False).ids, self.eos_token_id]
            done, budget = max(done, len(answers) - 1), budget * 2

    def _answers(self, prompt: list[int], params: EngineParams, budget: int) -> list[str]:
        wide = replace(
            params, max_new_tokens=budget, min_new_tokens=0, ignore_eos=True, stop_token_ids=frozenset()
        )
        ids = self.inner.generate(prompt, wide).output_ids
        eos, answers, start = self.inner.eos_token_id, [], 0
        for at, token in enumerate(ids):
            if token == eos:
                answers.append(self._reference.decode(ids[start:at], skip_special_tokens=False))
                start = at + 1
        answers.append(self._reference.decode(ids[start:], skip_special_tokens=False))
        return answers


def _context_length(config: dict[str, Any], tokenizer_config: dict[str, Any]) -> int:
    positions = config.get("max_position_embeddings")
    if isinstance(positions, int) and positions > 0:
        return positions
    limit = tokenizer_config.get("model_max_length")
    if isinstance(limit, int) and 0 < limit <= _MAX_REAL_LIMIT:
        return limit
    return _DEFAULT_CONTEXT


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}
