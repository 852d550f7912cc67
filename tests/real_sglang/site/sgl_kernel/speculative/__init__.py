"""Stand-in for ``sgl_kernel.speculative`` (imported on the CPU by
``sglang/kernels/ops/speculative/reconstruct_tree.py`` for NGRAM speculative decoding)."""

from __future__ import annotations

import torch


def reconstruct_indices_from_tree_mask(
    tree_mask: torch.Tensor,
    verified_seq_len: torch.Tensor,
    positions: torch.Tensor,
    retrieve_index: torch.Tensor,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    batch_size: int,
    draft_token_num: int,
) -> None:
    """NGRAM verify metadata from its draft tree mask, in place, by the contract the module's
    docstring states (``tree_mask[b, i, j]``: node ``j`` is an ancestor of node ``i``):
    position = number of strict ancestors + the verified length; retrieve index = ``b * n + i``;
    next token = the first child; next sibling = the next node with the same parent (-1 for a root)."""
    n = draft_token_num
    if batch_size == 0:
        return
    mask = tree_mask.reshape(-1)[: batch_size * n * n].reshape(batch_size, n, n).bool()
    order = torch.arange(n)
    ancestors = mask & (order[None, :] < order[:, None])[None]  # [b, i, j]: j < i
    depth = ancestors.sum(-1)
    positions.view(batch_size, n)[:] = depth + verified_seq_len.view(-1, 1).to(positions.dtype)
    retrieve_index.view(batch_size, n)[:] = torch.arange(batch_size)[:, None] * n + order[None, :]
    parent = torch.where(ancestors, order[None, None, :], torch.full_like(order, -1)[None, None, :]).amax(-1)
    nxt = retrieve_next_token.view(batch_size, n)
    sib = retrieve_next_sibling.view(batch_size, n)
    for b in range(batch_size):
        parents = parent[b].tolist()
        for t in range(n):
            children = [k for k in range(t + 1, n) if parents[k] == t]
            nxt[b, t] = children[0] if children else -1
            later = [k for k in range(t + 1, n) if parents[k] == parents[t]] if parents[t] >= 0 else []
            sib[b, t] = later[0] if later else -1
