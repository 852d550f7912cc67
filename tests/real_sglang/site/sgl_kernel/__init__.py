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
