"""Mixture-of-experts alignment: a step's (token, expert) pairs sorted by expert, in blocks of one expert.

The grouped GEMMs of ``fused_moe`` take BLOCK_M rows at a time, all routed to one expert. Here the
T * K routed slots (slot ``t * K + k`` is token t's k-th expert) are sorted by expert, each
expert's list padded to a multiple of BLOCK_M with the sentinel T * K, and every block of BLOCK_M
entries is labelled with its expert (-1: a block past the last expert's, which the GEMMs skip).

Nothing syncs with the host (a CUDA graph can capture it): the buffers are sized for the worst
case, ``T * K + min(E, T * K) * (BLOCK_M - 1)`` entries, since at most min(E, T * K) experts
receive a token. At batch 1 that is K blocks: no program is launched for an expert without tokens.
Within an expert the slots keep their order, so the layout, and with it every result, is the same
from run to run.

Steps of up to ``ONE_PROGRAM_SLOTS`` slots (decode, small batches) are aligned by one Triton
program in one launch: it counts each expert's slots, then places them, a chunk of slots at a time
(a slot's place within its chunk is a running sum over a one-hot [chunk, E] tile). Larger steps use
a dozen vectorised torch ops (a stable argsort by expert), whose launches are small next to the
GEMMs of so many tokens.

Slots routed to an id outside [0, E) are given no block: they are left out of the GEMMs.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton.language as tl

from deepinfer_kernels._launch import kernel, next_pow2

#: steps of up to this many routed slots (T * K) are aligned by the one-program kernel
ONE_PROGRAM_SLOTS = 1024


@kernel(do_not_specialize=["num_slots", "size", "num_blocks"])
def _align_kernel(ids_ptr, sorted_ptr, block_expert_ptr, num_slots, size, num_blocks,
                  E: tl.constexpr, E_P: tl.constexpr, BLOCK_M: tl.constexpr, CHUNK: tl.constexpr,
                  FILL: tl.constexpr):
    e = tl.arange(0, E_P)
    c = tl.arange(0, CHUNK)
    counts = tl.zeros([E_P], tl.int32)
    for s0 in range(0, num_slots, CHUNK):  # each expert's slots (an id outside [0, E) hits none)
        s = s0 + c
        x = tl.load(ids_ptr + s, mask=s < num_slots, other=-1)
        hit = ((x[:, None] == e[None, :]) & (e[None, :] < E)).to(tl.int32)  # [CHUNK, E_P]
        counts += tl.sum(hit, 0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, 0)
    starts = ends - padded
    for p0 in range(0, size, FILL):  # the padding value everywhere, overwritten below by the slots
        p = p0 + tl.arange(0, FILL)
        tl.store(sorted_ptr + p, tl.zeros([FILL], tl.int32) + num_slots, mask=p < size)
    for b0 in range(0, num_blocks, CHUNK):  # a block's expert: the number of lists that end before it
        b = b0 + c
        before = tl.sum(((ends[None, :] <= (b * BLOCK_M)[:, None]) & (e[None, :] < E)).to(tl.int32), 1)
        tl.store(block_expert_ptr + b, tl.where(before < E, before, -1), mask=b < num_blocks)
    tl.debug_barrier()  # every thread's padding is stored before any slot is
    placed = tl.zeros([E_P], tl.int32)  # slots of each expert placed by earlier chunks
    for s0 in range(0, num_slots, CHUNK):
        s = s0 + c
        x = tl.load(ids_ptr + s, mask=s < num_slots, other=-1)
        hit = ((x[:, None] == e[None, :]) & (e[None, :] < E)).to(tl.int32)
        # a slot's place: its expert's start, the earlier chunks' slots, the earlier slots of this one
        at = (starts + placed)[None, :] + tl.cumsum(hit, 0) - 1
        tl.store(sorted_ptr + tl.sum(hit * at, 1), s, mask=tl.sum(hit, 1) > 0)
        placed += tl.sum(hit, 0)


class MoeAlignment(NamedTuple):
    """Slots sorted by expert: ``sorted_ids`` [max_blocks * block_m] int32 (slot indices, padding =
    T * K), ``block_experts`` [max_blocks] int32 (each block's expert, -1 past the last one)."""

    sorted_ids: torch.Tensor
    block_experts: torch.Tensor
    block_m: int


def max_blocks(num_slots: int, num_experts: int, block_m: int) -> int:
    """Blocks that ``num_slots`` routed slots can need at most: each expert that receives any pads
    its list to a multiple of ``block_m``, and at most min(E, slots) experts receive one."""
    if num_slots == 0:
        return 0
    worst = num_slots + min(num_experts, num_slots) * (block_m - 1)
    return -(-worst // block_m)


def moe_align(topk_ids: torch.Tensor, num_experts: int, block_m: int,
              one_program_slots: int = ONE_PROGRAM_SLOTS) -> MoeAlignment:
    """Sort topk_ids [T, K] (int32/int64) by expert into blocks of ``block_m`` slots of one expert;
    steps of up to ``one_program_slots`` slots in one Triton program, larger ones with torch ops."""
    if topk_ids.dim() != 2:
        raise ValueError(f"moe_align takes topk_ids [T, K]; got {tuple(topk_ids.shape)}")
    dev = topk_ids.device
    slots = topk_ids.numel()
    blocks = max_blocks(slots, num_experts, block_m)
    size = blocks * block_m
    if 0 < slots <= one_program_slots:
        sorted_ids = torch.empty(size, dtype=torch.int32, device=dev)
        block_experts = torch.empty(blocks, dtype=torch.int32, device=dev)
        e_p = next_pow2(num_experts)
        _align_kernel[(1,)](topk_ids.contiguous(), sorted_ids, block_experts, slots, size, blocks, E=num_experts,
                            E_P=e_p, BLOCK_M=block_m, CHUNK=max(16, min(128, 8192 // e_p)), FILL=1024, num_warps=4)
        return MoeAlignment(sorted_ids, block_experts, block_m)
    return _align_torch(topk_ids, num_experts, block_m, slots, blocks, size)


def _align_torch(topk_ids, num_experts, block_m, slots, blocks, size) -> MoeAlignment:
    """The alignment in vectorised torch ops (a stable argsort by expert), for large steps."""
    dev = topk_ids.device
    flat = topk_ids.reshape(-1).long()
    # an id outside [0, E) counts in an extra bin E that gets no block
    key = torch.where((flat >= 0) & (flat < num_experts), flat, num_experts)
    counts = torch.zeros(num_experts + 1, dtype=torch.int64, device=dev)
    counts.index_add_(0, key, torch.ones_like(key))
    padded = (counts + block_m - 1) // block_m * block_m
    padded[num_experts] = 0
    ends = padded.cumsum(0)  # [E + 1]; bin E ends where expert E - 1 does
    starts = ends - padded
    order = torch.argsort(key, stable=True)  # slots by expert, each expert's in slot order
    sorted_key = key[order]
    first = counts.cumsum(0) - counts  # where each expert's slots begin in ``order``
    rank = torch.arange(slots, device=dev) - first[sorted_key]
    # the dropped slots all go to one spare entry past the end, which is cut off
    dest = torch.where(sorted_key < num_experts, starts[sorted_key] + rank, size)
    sorted_ids = torch.full((size + 1,), slots, dtype=torch.int32, device=dev)
    sorted_ids.scatter_(0, dest, order.to(torch.int32))
    block_start = torch.arange(blocks, device=dev) * block_m
    block_experts = torch.searchsorted(ends[:num_experts].contiguous(), block_start, right=True)
    block_experts = torch.where(block_experts < num_experts, block_experts, -1).to(torch.int32)
    return MoeAlignment(sorted_ids[:size], block_experts, block_m)


def moe_align_ref(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> MoeAlignment:
    """Torch reference of :func:`moe_align`: a loop over experts, on the host."""
    flat = topk_ids.reshape(-1).tolist()
    slots = len(flat)
    ids: list[int] = []
    experts: list[int] = []
    for e in range(num_experts):
        mine = [s for s, x in enumerate(flat) if x == e]
        if not mine:
            continue
        pad = -len(mine) % block_m
        ids += mine + [slots] * pad
        experts += [e] * ((len(mine) + pad) // block_m)
    blocks = max_blocks(slots, num_experts, block_m)
    ids += [slots] * (blocks * block_m - len(ids))
    experts += [-1] * (blocks - len(experts))
    dev = topk_ids.device
    return MoeAlignment(torch.tensor(ids, dtype=torch.int32, device=dev),
                        torch.tensor(experts, dtype=torch.int32, device=dev), block_m)
