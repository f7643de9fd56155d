"""Placeholder tokens resolved on the device in one launch.

A step left running on the device has not handed its sampled tokens to the host yet; the next
step's input ids carry -(r+1) for "row r of those samples". ``resolve_placeholders(ids, values)``
replaces each negative id by its value and keeps the others (torch needs five small kernels for
it: a replayed decode step runs it first, at every step).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_kernels._launch import kernel, next_pow2


@kernel
def _resolve_kernel(ids_ptr, values_ptr, out_ptr, n, n_values, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < n
    ids = tl.load(ids_ptr + offs, mask=inside, other=0)
    held = inside & (ids < 0)
    # a placeholder past the values reads nothing (0, as the reference gives)
    value = tl.load(values_ptr + (-ids - 1), mask=held & (-ids - 1 < n_values), other=0)
    tl.store(out_ptr + offs, tl.where(held, value.to(ids.dtype), ids), mask=inside)


def resolve_placeholders(ids: torch.Tensor, values: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``ids`` (1-D int64) with each -(r+1) replaced by ``values[r]`` (into ``out``, which may be
    ``ids`` itself). The engine checks r < len(values) on the host; a placeholder past the values
    gets 0 here, as in the reference."""
    if ids.dim() != 1 or ids.dtype != torch.int64 or values.dim() != 1 or values.dtype != torch.int64 \
            or not ids.is_contiguous() or not values.is_contiguous() or values.device != ids.device:
        raise ValueError(f"resolve_placeholders takes contiguous 1-D int64 ids and values on one device; got "
                         f"{ids.dtype} {tuple(ids.shape)} on {ids.device} and {values.dtype} {tuple(values.shape)} "
                         f"on {values.device}")
    if out is None:
        out = torch.empty_like(ids)
    elif out.shape != ids.shape or out.dtype != ids.dtype or not out.is_contiguous() or out.device != ids.device:
        raise ValueError(f"resolve_placeholders: out must be a contiguous int64 {tuple(ids.shape)} on {ids.device}; "
                         f"got {out.dtype} {tuple(out.shape)} on {out.device}")
    n = ids.numel()
    if n:
        block = min(1024, next_pow2(n))
        _resolve_kernel[(triton.cdiv(n, block),)](ids, values if values.numel() else ids, out, n, values.numel(),
                                                  BLOCK=block, num_warps=4)
    return out


def resolve_placeholders_ref(ids: torch.Tensor, values: torch.Tensor,
                             out: torch.Tensor | None = None) -> torch.Tensor:
    """Torch reference of :func:`resolve_placeholders`."""
    rows = torch.bitwise_not(ids).clamp(min=0)
    known = rows < values.numel()
    picked = torch.where(known, values[rows.clamp(max=max(values.numel() - 1, 0))] if values.numel() else 0, 0)
    return torch.where(ids < 0, picked, ids, out=out)
