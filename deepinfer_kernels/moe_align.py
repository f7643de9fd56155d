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

Slots are taken a chunk at a time: a one-hot [chunk, E] tile gives each expert's count in the
chunk, and its running sum down the chunk each slot's place among its expert's slots there. Steps
of up to ``ONE_PROGRAM_CHUNKS`` chunks (decode, small batches) are aligned by one program in one
launch, which counts every chunk, then places every chunk. Larger ones take three launches: the
chunks counted in parallel; one program adds the counts up (each chunk's offset within each
expert's list, the lists' starts, the blocks' experts); the chunks placed in parallel.

Slots routed to an id outside [0, E) are given no block: they are left out of the GEMMs.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton.language as tl

from deepinfer_kernels._launch import kernel, next_pow2

#: steps of up to this many chunks of slots are aligned by one program (one launch, chunks in turn)
ONE_PROGRAM_CHUNKS = 4
ONEHOT = 8192  # entries of a chunk's one-hot tile [chunk, E_P]: a chunk is 8,192 // E_P slots (16 to 128)
FILL = 1024  # padding entries one loop step stores


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


@kernel(do_not_specialize=["num_slots"])
def _align_count_kernel(ids_ptr, counts_ptr, num_slots, E: tl.constexpr, E_P: tl.constexpr, CHUNK: tl.constexpr):
    """counts[c, e]: the slots of chunk c routed to expert e."""
    c = tl.program_id(0)
    e = tl.arange(0, E_P)
    s = c * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(ids_ptr + s, mask=s < num_slots, other=-1)
    hit = ((x[:, None] == e[None, :]) & (e[None, :] < E)).to(tl.int32)
    tl.store(counts_ptr + c * E_P + e, tl.sum(hit, 0))


@kernel(do_not_specialize=["num_chunks", "num_slots", "size", "num_blocks"])
def _align_offsets_kernel(counts_ptr, offsets_ptr, sorted_ptr, block_expert_ptr, num_chunks, num_slots, size,
                          num_blocks, E: tl.constexpr, E_P: tl.constexpr, BLOCK_M: tl.constexpr,
                          ROWS: tl.constexpr, FILL: tl.constexpr):
    """offsets[c, e]: the slots of expert e in the chunks before c; offsets[num_chunks, e]: where
    expert e's list starts; the padding value everywhere in sorted_ids; each block's expert."""
    e = tl.arange(0, E_P)
    r = tl.arange(0, ROWS)
    total = tl.zeros([E_P], tl.int32)
    for c0 in range(0, num_chunks, ROWS):
        at = (c0 + r)[:, None] * E_P + e[None, :]
        rows = (c0 + r < num_chunks)[:, None]
        cnt = tl.load(counts_ptr + at, mask=rows, other=0)
        tl.store(offsets_ptr + at, total[None, :] + tl.cumsum(cnt, 0) - cnt, mask=rows)
        total += tl.sum(cnt, 0)
    padded = (total + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, 0)
    tl.store(offsets_ptr + num_chunks * E_P + e, ends - padded)
    for p0 in range(0, size, FILL):
        p = p0 + tl.arange(0, FILL)
        tl.store(sorted_ptr + p, tl.zeros([FILL], tl.int32) + num_slots, mask=p < size)
    for b0 in range(0, num_blocks, ROWS):
        b = b0 + r
        before = tl.sum(((ends[None, :] <= (b * BLOCK_M)[:, None]) & (e[None, :] < E)).to(tl.int32), 1)
        tl.store(block_expert_ptr + b, tl.where(before < E, before, -1), mask=b < num_blocks)


@kernel(do_not_specialize=["num_slots"])
def _align_place_kernel(ids_ptr, offsets_ptr, sorted_ptr, num_slots, E: tl.constexpr, E_P: tl.constexpr,
                        CHUNK: tl.constexpr):
    """Each slot of chunk c to its place: its expert's start, the earlier chunks' slots of that
    expert, the earlier slots of this chunk."""
    c = tl.program_id(0)
    e = tl.arange(0, E_P)
    s = c * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(ids_ptr + s, mask=s < num_slots, other=-1)
    hit = ((x[:, None] == e[None, :]) & (e[None, :] < E)).to(tl.int32)
    first = tl.load(offsets_ptr + tl.num_programs(0) * E_P + e) + tl.load(offsets_ptr + c * E_P + e)
    at = first[None, :] + tl.cumsum(hit, 0) - 1
    tl.store(sorted_ptr + tl.sum(hit * at, 1), s, mask=tl.sum(hit, 1) > 0)


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
              one_program_chunks: int = ONE_PROGRAM_CHUNKS) -> MoeAlignment:
    """Sort topk_ids [T, K] (int32/int64) by expert into blocks of ``block_m`` slots of one expert;
    steps of up to ``one_program_chunks`` chunks of slots in one program, larger ones in three launches."""
    if topk_ids.dim() != 2:
        raise ValueError(f"moe_align takes topk_ids [T, K]; got {tuple(topk_ids.shape)}")
    dev = topk_ids.device
    slots = topk_ids.numel()
    blocks = max_blocks(slots, num_experts, block_m)
    sorted_ids = torch.empty(blocks * block_m, dtype=torch.int32, device=dev)
    block_experts = torch.empty(blocks, dtype=torch.int32, device=dev)
    if slots == 0:
        return MoeAlignment(sorted_ids, block_experts, block_m)
    ids = topk_ids.contiguous()
    e_p = next_pow2(num_experts)
    chunk = max(16, min(128, ONEHOT // e_p, next_pow2(slots)))  # (a decode step's few slots: a small one-hot tile)
    chunks = -(-slots // chunk)
    sizes = {"E": num_experts, "E_P": e_p}
    if chunks <= one_program_chunks:
        _align_kernel[(1,)](ids, sorted_ids, block_experts, slots, sorted_ids.numel(), blocks, BLOCK_M=block_m,
                            CHUNK=chunk, FILL=FILL, num_warps=4, **sizes)
        return MoeAlignment(sorted_ids, block_experts, block_m)
    counts = torch.empty(chunks, e_p, dtype=torch.int32, device=dev)
    offsets = torch.empty(chunks + 1, e_p, dtype=torch.int32, device=dev)  # the last row: the lists' starts
    _align_count_kernel[(chunks,)](ids, counts, slots, CHUNK=chunk, num_warps=4, **sizes)
    _align_offsets_kernel[(1,)](counts, offsets, sorted_ids, block_experts, chunks, slots, sorted_ids.numel(), blocks,
                                BLOCK_M=block_m, ROWS=max(16, ONEHOT // e_p // 2), FILL=FILL, num_warps=8, **sizes)
    _align_place_kernel[(chunks,)](ids, offsets, sorted_ids, slots, CHUNK=chunk, num_warps=4, **sizes)
    return MoeAlignment(sorted_ids, block_experts, block_m)


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
