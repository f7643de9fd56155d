"""The `cpu` device's batch-invariant matmul (``--batch-invariant``).

torch's CPU matmul picks its kernel by the shape: one row goes through a GEMV, more through a
GEMM whose blocking depends on the number of rows, so a row's dot products are summed in an order
that depends on how many rows came with it (float32 logits of one row differ in their last bits
between a batch of 1 and one of 2). Here the rows are cut into tiles of ``ROWS`` (the last one
padded with zeros) and every tile is one matrix of a batched matmul of that fixed shape: each row
is computed by the same kernel with the same blocking wherever it sits and whatever shares its
tile (measured on this project's AVX2 and AVX-512 machines, float32 and bfloat16).
"""
from __future__ import annotations

import torch

#: rows per tile: each matmul is [ROWS, K] x [K, N] whatever the batch
ROWS = 16


def invariant_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` with each row's result independent of the other rows."""
    k, n = x.shape[-1], weight.shape[0]
    flat = x.reshape(-1, k)
    m = flat.shape[0]
    tiles = max(1, -(-m // ROWS))
    padded = flat.new_zeros(tiles * ROWS, k)
    padded[:m] = flat
    out = torch.bmm(padded.view(tiles, ROWS, k), weight.t().unsqueeze(0).expand(tiles, k, n)).view(-1, n)[:m]
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], n)


def invariant_bmm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``torch.bmm(x, w)`` (x [G, M, K], w [G, K, N]; MLA's per-head products) with each row's
    result independent of M: every group's rows in tiles of ``ROWS``, as ``invariant_linear``."""
    g, m, k = x.shape
    tiles = max(1, -(-m // ROWS))
    padded = x.new_zeros(g, tiles * ROWS, k)
    padded[:, :m] = x
    out = torch.bmm(padded.view(g * tiles, ROWS, k), w[:, None].expand(g, tiles, k, w.shape[2]).reshape(-1, k, w.shape[2]))
    return out.view(g, tiles * ROWS, -1)[:, :m]


#: the per-group products of a model that makes them (``Device.linear_op``'s ``batched``)
invariant_linear.batched = invariant_bmm
