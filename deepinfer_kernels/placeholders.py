"""Placeholder tokens resolved on the device in one launch.

A step left running on the device has not handed its sampled tokens to the host yet; the next
step's input ids carry -(r+1) for "row r of those samples". ``resolve_placeholders(ids, values)``
replaces each negative id by its value and keeps the others (torch needs five small kernels for
it: a replayed decode step runs it first, at every step).

``stage_inputs`` does that on the way while it copies a small step's inputs from host memory to the
device, in the step's first kernel: a replay of a small batch then needs no copy before it (on the
H200 the copy cost a batch-1 step about 10 us).
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


@kernel
def _stage_kernel(src32_ptr, src64_ptr, turn_ptr, dst32_ptr, dst64_ptr, values_ptr, stride32, stride64,
                  n_ids, n_words, n_values, BLOCK_IDS: tl.constexpr, BLOCK: tl.constexpr, TRIGGER: tl.constexpr):
    # (launched plainly: a constexpr named PDL would make the launch a programmatic one, and this
    # kernel reads what the kernels before it wrote)
    if TRIGGER:  # the step's next kernel may launch now: it waits for this one (gdc_wait) before its reads
        tl.extra.cuda.gdc_launch_dependents()
    # one program: every load is asked for before any store, so the host buffer (read over the
    # bus where it is pinned host memory) costs one round trip
    turn = tl.load(turn_ptr)
    i = tl.arange(0, BLOCK_IDS)
    w = tl.arange(0, BLOCK)
    ids_in = i < n_ids
    words_in = (w >= 2 * n_ids) & (w < n_words)  # the ids' words are written resolved, below
    ids = tl.load(src64_ptr + turn * stride64 + i, mask=ids_in, other=0)
    words = tl.load(src32_ptr + turn * stride32 + w, mask=words_in, other=0)
    held = ids_in & (ids < 0)
    value = tl.load(values_ptr + (-ids - 1), mask=held & (-ids - 1 < n_values), other=0)
    tl.store(dst64_ptr + i, tl.where(held, value.to(ids.dtype), ids), mask=ids_in)
    tl.store(dst32_ptr + w, words, mask=words_in)
    tl.debug_barrier()  # every warp has read the turn before it flips
    tl.store(turn_ptr, 1 - turn)


#: the most bytes :func:`stage_inputs` copies (one program holds them all)
STAGE_MAX_BYTES = 32768


def stage_inputs(src: torch.Tensor, turn: torch.Tensor, dst: torch.Tensor, n_ids: int,
                 values: torch.Tensor, pdl: bool = False) -> torch.Tensor:
    """Copy a step's inputs from ``src[turn]`` into ``dst`` in one launch and flip ``turn``
    (0 <-> 1) on the device, as the first work of a replayed step: ``src`` [2, N] uint8 is host
    memory the device reads directly (pinned; the same memory seen as the device's on the CPU),
    so the step needs no copy of its own. ``dst`` [n] uint8 (n a multiple of 8, at most
    STAGE_MAX_BYTES and N) starts with ``n_ids`` int64 token ids, written with each placeholder
    -(r+1) replaced by ``values[r]`` (as :func:`resolve_placeholders`); the other bytes are
    copied as they are. ``turn``: int32 [1] on dst's device. ``pdl``: let a next kernel launched
    with programmatic dependent launch start at once (this one is launched plainly: it reads what
    the kernels before it wrote). Returns ``dst``."""
    n = dst.numel()
    if src.dim() != 2 or src.shape[0] != 2 or src.dtype != torch.uint8 or not src.is_contiguous() \
            or src.shape[1] % 8 or dst.dtype != torch.uint8 or not dst.is_contiguous() or n % 8 \
            or n > min(src.shape[1], STAGE_MAX_BYTES) or not 0 <= 8 * n_ids <= n:
        raise ValueError(f"stage_inputs takes src [2, N] uint8 (N a multiple of 8) and dst [n] uint8 with n a "
                         f"multiple of 8, n <= N and n <= {STAGE_MAX_BYTES}, holding {n_ids} int64 ids first; got "
                         f"src {src.dtype} {tuple(src.shape)}, dst {dst.dtype} {tuple(dst.shape)}")
    if turn.shape != (1,) or turn.dtype != torch.int32 or turn.device != dst.device \
            or values.dim() != 1 or values.dtype != torch.int64 or values.device != dst.device:
        raise ValueError(f"stage_inputs: turn must be int32 [1] and values 1-D int64, both on {dst.device}; got "
                         f"turn {turn.dtype} {tuple(turn.shape)} on {turn.device}, values {values.dtype} "
                         f"{tuple(values.shape)} on {values.device}")
    if n:
        _stage_kernel[(1,)](src.view(torch.int32), src.view(torch.int64), turn, dst.view(torch.int32),
                            dst.view(torch.int64), values if values.numel() else turn, src.shape[1] // 4,
                            src.shape[1] // 8, n_ids, n // 4, values.numel(), BLOCK_IDS=next_pow2(max(n_ids, 1)),
                            BLOCK=next_pow2(n // 4), TRIGGER=pdl, num_warps=8)
    return dst


def stage_inputs_ref(src: torch.Tensor, turn: torch.Tensor, dst: torch.Tensor, n_ids: int,
                     values: torch.Tensor, pdl: bool = False) -> torch.Tensor:
    """Torch reference of :func:`stage_inputs`."""
    t = int(turn.item())
    dst.copy_(src[t, :dst.numel()].to(dst.device))
    ids = dst[:8 * n_ids].view(torch.int64)
    ids.copy_(resolve_placeholders_ref(ids.clone(), values))
    turn.fill_(1 - t)
    return dst
