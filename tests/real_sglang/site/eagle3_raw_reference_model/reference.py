"""The reference model as a model class the real SGLang 0.5.23 runs (an out-of-tree model).

SGLang imports every module of the package that ``SGLANG_EXTERNAL_MODEL_PACKAGE`` names and
registers its ``EntryClass`` under the class name (``sglang/srt/models/registry.py``); the test
model folder's ``config.json`` names ``Eagle3RawReferenceForCausalLM`` in ``architectures``.

Random weights write random text, so reasoning blocks and tool calls would never come out of the
real server. This class writes the reference engine's answer instead
(:meth:`eagle3_raw.reference.engine.ReferenceEngine.greedy_stream`): for each request of a
forward batch it reads the request's own ids, finds how far its answer has got, and makes the
engine's next token the top logit by far, so the real scheduler, sampler, stop checks,
detokenizer and parsers produce the reference model's answers in its template's format.

How a request's ids are read: the forward pass only gets the new tokens of each step
(``input_ids``) with the KV-cache slots they go to (``out_cache_loc``), and the batch's
req-to-token table (``req_to_token[req_pool_indices[i], :seq_lens[i]]``) lists the slots of a
request's whole sequence. So the model keeps its own "KV cache": one token id per slot. The
prompt length of a request is its sequence length at its (last) prefill; every id after it is
the request's own output so far. A prefix-cache hit shares slots, and their ids, as SGLang
shares the KV rows. (A request retracted and prefilled again would count its output as prompt;
the tests' server has the memory never to retract.)

A speculative verify step (NGRAM, ``tests/real_sglang/test_speculative.py``) asks the logits
of every node of each request's draft tree (:meth:`Eagle3RawReferenceForCausalLM._verify`): a
node's position says how far into the answer it is.

Logits: the hidden state of a position is the chosen token's row of a fixed head of unit vectors
(64 wide, seeded), times 200; SGLang's own ``LogitsProcessor`` multiplies it by the head, so the
chosen token's logit is 200 and every other one at most about 120: greedy picks it exactly, and
so does sampling at any temperature the tests use. Positions that sample nothing get zeros.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from sglang.srt.layers.logits_processor import LogitsProcessor
from sglang.srt.model_executor.forward_context import get_req_to_token_pool
from torch import nn

from eagle3_raw.reference.engine import ReferenceEngine

_SCALE = 200.0
_HEAD_SEED = 20_23
_KEPT_ANSWERS = 512  # answers in progress kept (one per distinct prompt)
_KEPT_REQUESTS = 4096  # prompt lengths kept (one per request id)


class _Head(nn.Module):
    """A fixed lm_head: ``weight`` is a buffer outside the state dict, so the dummy loader
    (``--load-format dummy``) leaves it alone."""

    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(_HEAD_SEED)
        rows = torch.randn(vocab_size, hidden_size, generator=generator, dtype=torch.float32)
        self.register_buffer("weight", rows / rows.norm(dim=1, keepdim=True), persistent=False)


class _Answer:
    """The engine's greedy stream for one prompt, read as far as asked."""

    def __init__(self, stream: Iterator[int]) -> None:
        self.stream = stream
        self.ids: list[int] = []

    def at(self, index: int) -> int:
        while len(self.ids) <= index:
            self.ids.append(next(self.stream))
        return self.ids[index]


class Eagle3RawReferenceForCausalLM(nn.Module):
    def __init__(self, config: Any, quant_config: Any = None, prefix: str = "") -> None:
        super().__init__()
        self.config = config
        self.engine = ReferenceEngine(Path(config.name_or_path))
        self.head = _Head(config.vocab_size, config.hidden_size)
        self.logits_processor = LogitsProcessor(config)
        self.slot_ids = torch.zeros(0, dtype=torch.int64)
        self.prompt_lens: OrderedDict[Any, int] = OrderedDict()
        self.answers: OrderedDict[tuple[int, ...], _Answer] = OrderedDict()

    def load_weights(self, weights: Any) -> None:
        for _ in weights:  # nothing to load: the model is the engine
            pass

    @torch.no_grad()
    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: Any, **kwargs: Any
    ) -> Any:
        self._remember_ids(forward_batch.out_cache_loc, input_ids)
        hidden = torch.zeros(input_ids.shape[0], self.head.weight.shape[1], dtype=self.head.weight.dtype)
        mode = forward_batch.forward_mode
        if input_ids.shape[0] and mode.is_target_verify():
            self._verify(positions, forward_batch, hidden)
        elif input_ids.shape[0] and (mode.is_extend() or mode.is_decode()):
            seq_lens = _as_list(forward_batch.seq_lens_cpu, forward_batch.seq_lens)
            rows = _sampled_rows(forward_batch, len(seq_lens), mode.is_decode())
            table = get_req_to_token_pool().req_to_token
            pool = forward_batch.req_pool_indices.tolist()
            rids = forward_batch.rids or [None] * len(seq_lens)
            for i, (row, seq_len) in enumerate(zip(rows, seq_lens, strict=True)):
                key = rids[i] if rids[i] is not None else ("pool", pool[i])
                if not mode.is_decode():
                    self._remember(self.prompt_lens, key, seq_len, _KEPT_REQUESTS)
                prompt_len = min(self.prompt_lens.get(key, seq_len), seq_len)
                ids = self._sequence(table[pool[i], :seq_len])
                token = self._answer(ids[:prompt_len]).at(seq_len - prompt_len)
                hidden[row] = self.head.weight[token] * _SCALE
        return self.logits_processor(input_ids, hidden, self.head, forward_batch)

    def _verify(self, positions: torch.Tensor, forward_batch: Any, hidden: torch.Tensor) -> None:
        """A speculative verify step (``ForwardMode.TARGET_VERIFY``): each request's rows are its
        draft tree's nodes, node 0 the last token generated, every node at ``position`` = the
        request's length before it + its depth in the tree. The target's next token after a node
        is the answer's token at ``position + 1 - prompt length`` (what the path's tokens are
        matters not: a node whose path left the answer is never accepted, so its prediction is
        never read)."""
        table = get_req_to_token_pool().req_to_token
        pool = forward_batch.req_pool_indices.tolist()
        rids = forward_batch.rids or [None] * len(pool)
        where = positions.tolist()
        width = len(where) // max(len(pool), 1)
        for i, row in enumerate(pool):
            key = rids[i] if rids[i] is not None else ("pool", row)
            prompt_len = self.prompt_lens.get(key, where[i * width])
            answer = self._answer(self._sequence(table[row, :prompt_len]))
            for node in range(i * width, (i + 1) * width):
                hidden[node] = self.head.weight[answer.at(where[node] + 1 - prompt_len)] * _SCALE

    def _remember_ids(self, slots: torch.Tensor, ids: torch.Tensor) -> None:
        if slots.numel() == 0:
            return
        self._grow(int(slots.max()) + 1)
        self.slot_ids[slots.long()] = ids.long()

    def _grow(self, size: int) -> None:
        if size > self.slot_ids.numel():
            grown = torch.zeros(max(size, 2 * self.slot_ids.numel()), dtype=torch.int64)
            grown[: self.slot_ids.numel()] = self.slot_ids
            self.slot_ids = grown

    def _sequence(self, slots: torch.Tensor) -> list[int]:
        if slots.numel() == 0:
            return []
        self._grow(int(slots.max()) + 1)
        ids: list[int] = self.slot_ids[slots.long()].tolist()
        return ids

    def _answer(self, prompt: list[int]) -> _Answer:
        key = tuple(prompt)
        answer = self.answers.get(key)
        if answer is None:
            answer = _Answer(self.engine.greedy_stream(prompt))
        self._remember(self.answers, key, answer, _KEPT_ANSWERS)
        return answer

    @staticmethod
    def _remember(store: OrderedDict[Any, Any], key: Any, value: Any, limit: int) -> None:
        store[key] = value
        store.move_to_end(key)
        while len(store) > limit:
            store.popitem(last=False)


def _as_list(cpu: torch.Tensor | None, tensor: torch.Tensor) -> list[int]:
    values: list[int] = (cpu if cpu is not None else tensor).tolist()
    return values


def _sampled_rows(forward_batch: Any, batch_size: int, decode: bool) -> list[int]:
    """The row of ``input_ids`` whose logits sample each request's next token: its last one."""
    if decode:
        return list(range(batch_size))
    lengths = forward_batch.extend_seq_lens_cpu
    if lengths is None:
        lengths = forward_batch.extend_seq_lens.tolist()
    rows, end = [], 0
    for length in lengths:
        end += int(length)
        rows.append(end - 1)
    return rows


EntryClass = Eagle3RawReferenceForCausalLM
