"""Stand-in for ``sgl_kernel`` (PyPI ``sglang-kernel``), whose wheel holds CUDA libraries only.

SGLang's CPU engine imports two helpers from it and calls one of its compiled operators; this
module gives them in plain torch:

- ``assign_req_to_token_pool_cpu`` (``sglang/srt/mem_cache/allocation.py``): writes each
  request's new KV-cache slot indices into its row of the req-to-token table;
- ``copy_all_layer_kv_cache_cpu`` (``sglang/kernels/ops/kvcache/cache_move.py``): copies KV rows
  from one slot to another in every layer's buffer, buffers given by address;
- the operator ``torch.ops.sgl_kernel.murmur_hash32_cpu`` (``sglang/kernels/ops/sampling/
  murmur_hash.py``, called by ``sglang/srt/layers/sampler.py::multinomial_with_seed``): the hash
  behind seeded sampling (``sampling_seed`` with a temperature above 0). Without it the scheduler
  dies on the first such request (found by the real-SGLang tests).

NGRAM speculative decoding (``--speculative-algorithm NGRAM``, ``tests/real_sglang/test_speculative.py``)
calls four more on the CPU, each written here after the Triton kernel beside its call site:
``assign_extend_cache_locs_cpu`` (``kernels/ops/speculative/cache_locs.py``: the draft tokens'
KV slots), ``fill_bonus_tokens_cpu`` and ``fill_accept_out_cache_loc_cpu``
(``kernels/ops/speculative/eagle.py``: the last accepted id, the accepted slots) and
``verify_tree_greedy_cpu`` (``kernels/ops/speculative/spec_tree.py``: greedy tree verification,
which the CPU uses whatever the temperature: ``speculative/eagle_utils.py::_verify_uses_greedy``);
and ``sgl_kernel.speculative.reconstruct_indices_from_tree_mask`` (``./speculative``: the tree's
positions and links; without that module the scheduler stops at start-up importing
``speculative/ngram_worker.py``).

Other modules import further names at module level (``build_tree_kernel_efficient_cpu``,
``silu_and_mul``, ...); they are only called on paths a dense text model does not take on this
CPU (SGLang's compiled CPU ops run only when ``cpu_has_amx_support()`` is true; here every layer
takes ``forward_native``), so each is a function that fails loudly, naming itself, if it is ever
called.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import torch

__version__ = "0.0.0+eagle3-raw-stand-in"


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """``req_to_token[req_pool_indices[i], start[i]:end[i]] = out_cache_loc[<request i's part>]``,
    the requests' parts lying one after another in ``out_cache_loc`` (the Triton kernel's rule)."""
    offset = 0
    spans = zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist(), strict=True)
    for row, start, end in spans:
        count = end - start
        req_to_token[row, start:end] = out_cache_loc[offset : offset + count].to(req_to_token.dtype)
        offset += count


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor, strides: torch.Tensor, tgt_loc: torch.Tensor, src_loc: torch.Tensor
) -> None:
    """For every buffer (its address and its row size in bytes), copy row ``src_loc[j]`` onto row
    ``tgt_loc[j]``; all source rows are read before any is written, as the Triton kernel does."""
    targets, sources = tgt_loc.tolist(), src_loc.tolist()
    for base, stride in zip(data_ptrs.tolist(), strides.tolist(), strict=True):
        rows = [ctypes.string_at(base + s * stride, stride) for s in sources]
        for t, row in zip(targets, rows, strict=True):
            ctypes.memmove(base + t * stride, row, stride)


_U32 = 0xFFFFFFFF


def _rotl32(x: torch.Tensor, r: int) -> torch.Tensor:
    return ((x << r) | (x >> (32 - r))) & _U32


def _murmur3_mix(h: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    k = _rotl32((k * 0xCC9E2D51) & _U32, 15)
    h = h ^ ((k * 0x1B873593) & _U32)
    return (_rotl32(h, 13) * 5 + 0xE6546B64) & _U32


def _fmix32(h: torch.Tensor) -> torch.Tensor:
    h = h ^ (h >> 16)
    h = (h * 0x85EBCA6B) & _U32
    h = h ^ (h >> 13)
    h = (h * 0xC2B2AE35) & _U32
    return h ^ (h >> 16)


@torch.library.custom_op("sgl_kernel::murmur_hash32_cpu", mutates_args=())
def murmur_hash32_cpu(seed: torch.Tensor, positions: torch.Tensor, col_indices: torch.Tensor) -> torch.Tensor:
    """MurmurHash3 (32-bit) of (seed low, seed high, position, column) per row and column, as the
    Triton kernel ``murmur_hash32_kernel`` computes it: uint32 of shape (rows, columns). int64
    arithmetic masked to 32 bits (products wrap modulo 2**64, which keeps their low 32 bits)."""
    bits = seed.view(torch.int64) if seed.dtype == torch.uint64 else seed.to(torch.int64)
    low, high = (bits & _U32)[:, None], ((bits >> 32) & _U32)[:, None]
    position = (positions.to(torch.int64) & _U32)[:, None]
    column = (col_indices.to(torch.int64) & _U32)[None, :]
    h = torch.zeros((seed.shape[0], 1), dtype=torch.int64)
    for k in (low, high, position):
        h = _murmur3_mix(h, k)
    h = _fmix32(_murmur3_mix(h, column) ^ 16)
    return h.to(torch.uint32)


@murmur_hash32_cpu.register_fake
def _(seed: torch.Tensor, positions: torch.Tensor, col_indices: torch.Tensor) -> torch.Tensor:
    return seed.new_empty((seed.shape[0], col_indices.shape[0]), dtype=torch.uint32)


# --- speculative decoding (NGRAM verify on the CPU): sglang/kernels/ops/speculative/{cache_locs,
# eagle,spec_tree}.py call these on the CPU; each follows the Triton kernel beside its call site.


def assign_extend_cache_locs_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """``out_cache_loc`` = each request's ``req_to_token[row, start:end]``, one after another
    (``cache_locs.py::assign_extend_cache_locs``, the reverse of ``assign_req_to_token_pool_cpu``)."""
    offset = 0
    spans = zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist(), strict=True)
    for row, start, end in spans:
        count = end - start
        out_cache_loc[offset : offset + count] = req_to_token[row, start:end].to(out_cache_loc.dtype)
        offset += count


def fill_bonus_tokens_cpu(
    accept_tokens: torch.Tensor, accept_lens: torch.Tensor, bonus_tokens: torch.Tensor, accept_stride: int
) -> None:
    """``bonus_tokens[i] = accept_tokens[i * stride + accept_lens[i] - 1]``
    (``eagle.py::fill_bonus_tokens``)."""
    flat = accept_tokens.reshape(-1)
    for i, length in enumerate(accept_lens.tolist()):
        bonus_tokens[i] = flat[accept_stride * i + int(length) - 1]


def fill_accept_out_cache_loc_cpu(
    accept_index: torch.Tensor, out_cache_loc: torch.Tensor, accept_out_cache_loc: torch.Tensor
) -> None:
    """The slots of the accepted positions, packed: ``out_cache_loc[accept_index[k]]`` for every
    ``accept_index[k] != -1``, in order (``eagle.py::fill_accept_out_cache_loc``)."""
    flat = accept_index.reshape(-1)
    kept = flat[flat != -1].long()
    accept_out_cache_loc[: kept.numel()] = out_cache_loc[kept].to(accept_out_cache_loc.dtype)


def verify_tree_greedy_cpu(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
) -> None:
    """Greedy tree verification (``spec_tree.py::verify_tree_greedy_kernel_triton``): walk each
    request's draft tree from its root, at each level accepting the child whose token is the
    target's argmax after the last accepted node; ``predicts`` gets the target's token at every
    accepted node, ``accept_index`` the accepted nodes' flat indices, ``accept_token_num`` how many
    drafts were accepted (the root, the verified token, not counted)."""
    batch_size = candidates.shape[0]
    num_spec = accept_index.shape[1]
    cand, index = candidates.tolist(), retrive_index.tolist()
    next_token, next_sibling = retrive_next_token.tolist(), retrive_next_sibling.tolist()
    target = target_predict.reshape(-1).tolist()
    for b in range(batch_size):
        last = index[b][0]
        accept_index[b, 0] = last
        accepted, cur = 0, 0
        for _ in range(1, num_spec):
            cur = next_token[b][cur]
            wanted = target[last]
            while cur != -1 and cand[b][cur] != wanted:
                cur = next_sibling[b][cur]
            if cur == -1:
                break
            predicts[last] = wanted
            accepted += 1
            accept_index[b, accepted] = index[b][cur]
            last = index[b][cur]
        accept_token_num[b] = accepted
        predicts[last] = target[last]


def _not_on_this_cpu(name: str) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f"sgl_kernel.{name} is not available: tests/real_sglang/site/sgl_kernel stands in for "
            "sglang-kernel on a CPU without AMX, where SGLang should not call it"
        )

    kernel.__name__ = name
    return kernel


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    return _not_on_this_cpu(name)
