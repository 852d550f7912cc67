"""The reference server's tiny "model": chat-shaped token streams stitched from a segment library.

No neural network: at load time the engine reads the packaged model folder (``config.json``,
``tokenizer.json``, ``segments.json``, written by ``scripts/build_reference_model.py``); generating
is cheap selection and concatenation of pre-tokenized segments, so a client benchmark never waits
on it. What it produces looks like a chat model's output, in the chat template's layout:
``<think>\\n…\\n</think>\\n\\n`` (only when the prompt left thinking on), text paragraphs, lists or
code, ``\\n<tool_call>\\n{json}\\n</tool_call>`` blocks (likelier when the prompt offers tools), then
``<|im_end|>``. A tool call names one of the tools the prompt's ``<tools>`` block lists, with
arguments that fit its schema (:mod:`eagle3_raw.reference.toolargs`); without such a block it is
one of the library's calls. The ``qwen3`` reasoning parser and the ``qwen25`` tool-call parser of
:mod:`eagle3_raw.sglang.parsers` split every output into reasoning, content and calls.
Every id is a real vocabulary id; many outputs use non-canonical splits (a token replaced by the
two tokens its BPE merge joined), so ``encode(decode(ids)) != ids`` is common.

Determinism: the prompt ids seed the "model" (which candidates it proposes, with what scores);
``temperature < 1e-6`` (or ``top_k == 1``) takes the best candidate every time, whatever the seed;
otherwise a sampler seeded from (prompt, sampling params, ``sampling_seed``) picks among them with
temperature, top-k, top-p, min-p and the three penalties. ``max_new_tokens``, ``min_new_tokens``,
``stop_token_ids`` and ``ignore_eos`` only cut or filter the same stream, so a shorter
``max_new_tokens`` gives a prefix of a longer one's output.

Finding a stop id for a test: generate once with ``min_new_tokens=0`` and no ``stop_token_ids``,
take any id ``x`` of that output; generating again with ``stop_token_ids={x}`` returns the first
output cut right after the first occurrence of ``x``, with ``finish == "stop"`` and ``matched == x``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from eagle3_raw.reference.model_files import reference_model_dir
from eagle3_raw.reference.toolargs import OfferedTool, call_text, offered_tools

GREEDY_TEMPERATURE = 1e-6
_T = TypeVar("_T")
# Model scores of the candidates proposed at each choice point, best first (softmax at T=1: 41%, 22%, ...).
_CANDIDATE_LOGITS = (1.2, 0.6, 0.2, -0.2, -0.6, -1.0)
_LENGTH_SCALES = (0.5, 1.0, 2.0)
_LENGTH_LOGITS = (-1.0, 0.0, -1.5)
_MAX_SECTION_TOKENS = 3000
_SPLIT_RATE = 0.3


@dataclass(frozen=True)
class EngineParams:
    """Sampling parameters, as SGLang names them; the server validates and clips them first.

    ``max_new_tokens`` may be 0 (no ids, finish ``length``). ``min_new_tokens`` keeps EOS and
    ``stop_token_ids`` from being produced before that many ids. ``ignore_eos`` disables EOS and
    ``stop_token_ids`` (EOS may then appear mid-output, as in SGLang). ``sampling_seed=None`` draws
    a fresh seed per call (greedy ignores it).
    """

    max_new_tokens: int
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    ignore_eos: bool = False
    stop_token_ids: frozenset[int] = frozenset()
    sampling_seed: int | None = None

    def __post_init__(self) -> None:
        if self.max_new_tokens < 0 or self.min_new_tokens < 0:
            raise ValueError("max_new_tokens and min_new_tokens must be >= 0")
        if self.temperature < 0 or self.repetition_penalty <= 0:
            raise ValueError("temperature must be >= 0 and repetition_penalty > 0")

    @property
    def greedy(self) -> bool:
        """SGLang's rule: temperature below 1e-6 means top-1; so does ``top_k == 1``."""
        return self.temperature < GREEDY_TEMPERATURE or self.top_k == 1

    @property
    def penalized(self) -> bool:
        return bool(self.frequency_penalty or self.presence_penalty or self.repetition_penalty != 1.0)


@dataclass(frozen=True)
class EngineOutput:
    """One generation. ``finish == "stop"``: the last id is ``matched`` (EOS or a stop id).

    ``finish == "length"``: exactly ``max_new_tokens`` ids; like SGLang, this wins even when the
    last of them happens to be a stop id.
    """

    output_ids: list[int]
    finish: Literal["stop", "length"]
    matched: int | None


@dataclass(frozen=True)
class _Specials:
    eos: int
    im_start: int
    think: int
    think_end: int
    tool_call: int
    tool_call_end: int


@dataclass(frozen=True)
class _Library:
    """Pre-tokenized segments. ``think``/``answer`` hold (ids at line start, ids after a space)."""

    think: list[tuple[list[int], list[int]]]
    answer: list[tuple[list[int], list[int]]]
    list_items: list[list[int]]
    code: list[list[int]]
    tool_calls: list[list[int]]
    newline: list[int]
    paragraph: list[int]
    parents: dict[int, tuple[int, int]]


@dataclass(frozen=True)
class _Prompt:
    """What the engine reads from a prompt: a digest and where the last turn stands."""

    digest: bytes
    has_tools: bool
    thinking: Literal["allowed", "disabled", "open"]
    ends_with_think_tag: bool


class _Text:
    """The reference tokenizer for the rare text work (reading a prompt's tools, writing a call)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._tokenizer: Any = None

    def _loaded(self) -> Any:
        if self._tokenizer is None:
            import tokenizers

            self._tokenizer = tokenizers.Tokenizer.from_file(str(self.path))
        return self._tokenizer

    def decode(self, ids: Sequence[int]) -> str:
        text: str = self._loaded().decode([i for i in ids if 0 <= i < 1 << 31], skip_special_tokens=False)
        return text

    def encode(self, text: str) -> list[int]:
        ids: list[int] = self._loaded().encode(text, add_special_tokens=False).ids
        return ids


def _read_json(path: Path) -> Any:
    with path.open("rb") as f:
        return json.load(f)


def _merge_parents(model: dict[str, Any]) -> dict[int, tuple[int, int]]:
    """Token id -> the ids of the pair its BPE merge joined (decoding both gives the same bytes)."""
    vocab: dict[str, int] = model["vocab"]
    parents: dict[int, tuple[int, int]] = {}
    for merge in model["merges"]:
        left, right = merge if isinstance(merge, list) else merge.split(" ")
        parents[vocab[left + right]] = (vocab[left], vocab[right])
    return parents


def _specials(tokenizer: dict[str, Any], eos: int) -> _Specials:
    ids = {token["content"]: token["id"] for token in tokenizer["added_tokens"]}
    return _Specials(
        eos=eos,
        im_start=ids["<|im_start|>"],
        think=ids["<think>"],
        think_end=ids["</think>"],
        tool_call=ids["<tool_call>"],
        tool_call_end=ids["</tool_call>"],
    )


def _library(segments: dict[str, Any], parents: dict[int, tuple[int, int]]) -> _Library:
    return _Library(
        think=[(first, spaced) for first, spaced in segments["think"]],
        answer=[(first, spaced) for first, spaced in segments["answer"]],
        list_items=segments["list_item"],
        code=segments["code"],
        tool_calls=segments["tool_call"],
        newline=segments["glue"]["newline"],
        paragraph=segments["glue"]["paragraph"],
        parents=parents,
    )


def _prompt_bytes(input_ids: Sequence[int]) -> bytes:
    try:
        return array("q", input_ids).tobytes()
    except (OverflowError, TypeError):  # ids beyond int64 are not range-checked at ingress
        return repr(list(input_ids)).encode()


def _read_prompt(input_ids: Sequence[int], specials: _Specials) -> _Prompt:
    """Tools are on offer if ``<tool_call>`` occurs; thinking is read from the last turn's header."""
    ids = input_ids if isinstance(input_ids, list) else list(input_ids)
    last_turn = ids[len(ids) - 1 - ids[::-1].index(specials.im_start) :] if specials.im_start in ids else ids
    thinking: Literal["allowed", "disabled", "open"] = "allowed"
    if specials.think_end in last_turn:
        thinking = "disabled"
    elif specials.think in last_turn:
        thinking = "open"
    digest = hashlib.blake2b(_prompt_bytes(ids), digest_size=16).digest()
    return _Prompt(digest, specials.tool_call in ids, thinking, bool(ids) and ids[-1] == specials.think)


def _sampler_rng(prompt: _Prompt, params: EngineParams) -> random.Random | None:
    """None for greedy; else seeded from the prompt, the sampling params and the seed."""
    if params.greedy:
        return None
    seed = params.sampling_seed if params.sampling_seed is not None else int.from_bytes(os.urandom(8), "big")
    knobs = (params.temperature, params.top_p, params.top_k, params.min_p, params.frequency_penalty)
    text = repr((knobs, params.presence_penalty, params.repetition_penalty, seed)).encode()
    return random.Random(hashlib.blake2b(prompt.digest + text, digest_size=16).digest())


class _Sampler:
    """Picks one of a few scored candidates the way a token sampler picks from logits."""

    def __init__(self, params: EngineParams, rng: random.Random | None) -> None:
        self.params = params
        self.rng = rng

    def choose(self, logits: Sequence[float]) -> int:
        """Index of the chosen candidate: the first best one when greedy."""
        if self.rng is None:
            return max(range(len(logits)), key=logits.__getitem__)
        top = max(logits)
        weights = [math.exp((x - top) / self.params.temperature) for x in logits]
        order = sorted(range(len(weights)), key=weights.__getitem__, reverse=True)
        kept = order[: self._kept([weights[i] for i in order])]
        threshold = self.rng.random() * sum(weights[i] for i in kept)
        for index in kept:
            threshold -= weights[index]
            if threshold < 0:
                return index
        return kept[-1]

    def _kept(self, weights: list[float]) -> int:
        """How many of the descending ``weights`` survive top-k, top-p and min-p (at least one)."""
        count = len(weights) if self.params.top_k < 1 else min(len(weights), self.params.top_k)
        total, mass = sum(weights), 0.0
        for i in range(count):
            mass += weights[i]
            if mass >= self.params.top_p * total:
                count = i + 1
                break
        floor = self.params.min_p * weights[0]
        while count > 1 and weights[count - 1] < floor:
            count -= 1
        return count


class _Writer:
    """One request's endless token stream, as chunks; the collector decides where it ends."""

    def __init__(
        self, lib: _Library, specials: _Specials, prompt: _Prompt, params: EngineParams, text: _Text,
        input_ids: Sequence[int],
    ) -> None:  # fmt: skip
        self.lib = lib
        self.text = text
        self.input_ids = input_ids
        self.offered: list[OfferedTool] | None = None
        self.specials = specials
        self.prompt = prompt
        self.model = random.Random(prompt.digest)
        self.sampler = _Sampler(params, _sampler_rng(prompt, params))
        self.params = params
        self.uses: dict[int, int] = {}

    def stream(self) -> Iterator[list[int]]:
        """The first assistant turn, then (read only if EOS is ignored or suppressed) more answers."""
        yield from self._reasoning()
        calls = self._tool_call_count()
        wrote_text = calls == 0 or self._decide(0.5)
        if wrote_text:
            yield from self._body(self._length(3.8, 1.1), self._answer_paragraph)
        for i in range(calls):
            yield self._tool_call(newline_first=wrote_text or i > 0)
        while True:
            yield [self.specials.eos]
            yield self.lib.paragraph
            yield from self._body(self._length(3.8, 1.1), self._answer_paragraph)

    def _decide(self, logit: float) -> bool:
        return self.sampler.choose((logit, 0.0)) == 0

    def _length(self, mu: float, sigma: float) -> int:
        """A long-tailed token budget: log-normal from the model, scaled by a sampled factor."""
        base = math.exp(self.model.gauss(mu, sigma))
        scale = _LENGTH_SCALES[self.sampler.choose(_LENGTH_LOGITS)]
        return max(1, min(_MAX_SECTION_TOKENS, int(base * scale)))

    def _reasoning(self) -> Iterator[list[int]]:
        thinking = self.prompt.thinking
        if thinking == "disabled" or (thinking == "allowed" and not self._decide(self.model.gauss(1.0, 1.5))):
            return
        if thinking == "allowed":
            yield [self.specials.think, *self.lib.newline]
        elif self.prompt.ends_with_think_tag:
            yield self.lib.newline
        yield from self._body(self._length(4.3, 1.0), lambda: self._prose(self.lib.think))
        yield [*self.lib.newline, self.specials.think_end, *self.lib.paragraph]

    def _tool_call_count(self) -> int:
        logit = self.model.gauss(0.5, 1.5) if self.prompt.has_tools else self.model.gauss(-3.5, 1.0)
        if not self._decide(logit):
            return 0
        return 1 + self._decide(-1.0) + self._decide(-2.5)

    def _tool_call(self, newline_first: bool) -> list[int]:
        newline, call = self.lib.newline, self._split(self._call_ids())
        head = [*newline, self.specials.tool_call] if newline_first else [self.specials.tool_call]
        return [*head, *newline, *call, *newline, self.specials.tool_call_end]

    def _call_ids(self) -> list[int]:
        """A call of one of the prompt's tools (arguments from its schema), else a library call."""
        if self.offered is None:
            self.offered = offered_tools(self.text.decode(self.input_ids)) if self.prompt.has_tools else []
        if not self.offered:
            return self._pick(self.lib.tool_calls)
        return self.text.encode(call_text(self._pick(self.offered), self.model))

    def _body(self, target: int, paragraph: Callable[[], list[list[int]]]) -> Iterator[list[int]]:
        """Paragraphs separated by blank lines until at least ``target`` tokens are out."""
        produced = 0
        while True:
            for chunk in paragraph():
                yield chunk
                produced += len(chunk)
            if produced >= target:
                return
            yield self.lib.paragraph

    def _answer_paragraph(self) -> list[list[int]]:
        gauss = self.model.gauss
        kind = self.sampler.choose((gauss(1.5, 1.0), gauss(0.0, 1.0), gauss(-0.5, 1.0)))
        if kind == 1:
            return self._list()
        if kind == 2:
            return [self._split(self._pick(self.lib.code))]
        return self._prose(self.lib.answer)

    def _list(self) -> list[list[int]]:
        """2-6 list items, one per line."""
        chunks = [self._split(self._pick(self.lib.list_items))]
        for _ in range(self._count(1, 5)):
            chunks += [self.lib.newline, self._split(self._pick(self.lib.list_items))]
        return chunks

    def _prose(self, pool: list[tuple[list[int], list[int]]]) -> list[list[int]]:
        """1-5 sentences: the first in its line-start form, the rest after a space."""
        picks = [self._pick(pool) for _ in range(self._count(1, 5))]
        return [self._split(pair[0] if i == 0 else pair[1]) for i, pair in enumerate(picks)]

    def _count(self, low: int, high: int) -> int:
        return low + int(self.model.random() * (high - low + 1))

    def _pick(self, pool: Sequence[_T]) -> _T:
        """A segment: the model proposes candidates, penalties rescore them, the sampler picks."""
        rand = self.model.random
        candidates = [pool[int(rand() * len(pool))] for _ in _CANDIDATE_LOGITS]
        if not self.params.penalized:
            return candidates[self.sampler.choose(_CANDIDATE_LOGITS)]
        chosen = candidates[self.sampler.choose(self._penalize(candidates))]
        self.uses[id(chosen)] = self.uses.get(id(chosen), 0) + 1
        return chosen

    def _penalize(self, candidates: Sequence[object]) -> list[float]:
        """SGLang's three penalties, per segment (not per token) already used in this output."""
        p = self.params
        logits = []
        for segment, logit in zip(candidates, _CANDIDATE_LOGITS, strict=True):
            uses = self.uses.get(id(segment), 0)
            if uses:
                logit = logit / p.repetition_penalty if logit > 0 else logit * p.repetition_penalty
                logit -= p.frequency_penalty * uses + p.presence_penalty
            logits.append(logit)
        return logits

    def _split(self, segment: list[int]) -> list[int]:
        """Sometimes replace one token by its BPE parents: same text, non-canonical ids."""
        if self.model.random() >= _SPLIT_RATE:
            return segment
        at = int(self.model.random() * len(segment))
        pair = self.lib.parents.get(segment[at])
        return segment if pair is None else [*segment[:at], *pair, *segment[at + 1 :]]


def collect(stream: Iterator[list[int]], params: EngineParams, eos: int) -> EngineOutput:
    """Cut ``stream`` at a stop id (at or after ``min_new_tokens``) or at ``max_new_tokens``."""
    stops = frozenset() if params.ignore_eos else params.stop_token_ids | {eos}
    out: list[int] = []
    for chunk in stream:
        if stops.isdisjoint(chunk):
            out += chunk
        else:
            matched = _extend_until_stop(out, chunk, stops, params.min_new_tokens)
            if matched is not None and len(out) < params.max_new_tokens:
                return EngineOutput(out, "stop", matched)
        if len(out) >= params.max_new_tokens:
            return EngineOutput(out[: params.max_new_tokens], "length", None)
    raise AssertionError("the stream is endless")


def _extend_until_stop(out: list[int], chunk: list[int], stops: frozenset[int], min_new: int) -> int | None:
    """Append ``chunk`` to ``out`` up to and including a stop id; stop ids before ``min_new`` are dropped."""
    for token in chunk:
        if token in stops:
            if len(out) < min_new:
                continue
            out.append(token)
            return token
        out.append(token)
    return None


class ReferenceEngine:
    """The tiny reference model. Loading reads three JSON files (well under a second).

    Nothing is mutated after loading: ``generate`` may run in several threads at once.
    """

    def __init__(self, model_dir: Path | None = None) -> None:
        if model_dir is None:
            model_dir = reference_model_dir()
        self.model_dir = model_dir
        config = _read_json(model_dir / "config.json")
        self.vocab_size: int = config["vocab_size"]
        self.eos_token_id: int = config["eos_token_id"]
        self.context_length: int = config["max_position_embeddings"]
        tokenizer = _read_json(model_dir / "tokenizer.json")
        self._specials = _specials(tokenizer, self.eos_token_id)
        self._library = _library(_read_json(model_dir / "segments.json"), _merge_parents(tokenizer["model"]))
        self._text = _Text(model_dir / "tokenizer.json")

    def generate(self, input_ids: Sequence[int], params: EngineParams) -> EngineOutput:
        """Generate for ``input_ids`` (taken verbatim, not range-checked); see the module docstring."""
        if params.max_new_tokens == 0:
            return EngineOutput([], "length", None)
        prompt = _read_prompt(input_ids, self._specials)
        writer = _Writer(self._library, self._specials, prompt, params, self._text, input_ids)
        return collect(writer.stream(), params, self.eos_token_id)

    def greedy_stream(self, input_ids: Sequence[int]) -> Iterator[int]:
        """The endless greedy token stream for ``input_ids``, one id at a time.

        A greedy :meth:`generate` with ``min_new_tokens == 0`` returns this stream's prefix up to
        and including the first stop id (EOS, or one of ``stop_token_ids``), or its first
        ``max_new_tokens`` ids; with ``ignore_eos`` the stream goes on past EOS as it does here.
        The model class the real SGLang serves in the tests writes it token by token.
        """
        params = EngineParams(max_new_tokens=1, temperature=0.0)
        prompt = _read_prompt(input_ids, self._specials)
        writer = _Writer(self._library, self._specials, prompt, params, self._text, input_ids)
        for chunk in writer.stream():
            yield from chunk
