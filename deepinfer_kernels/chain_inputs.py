"""A chained draft round's first inputs, from a verification still on the device, in one launch.

A draft round queued right behind the verification of the last one (``chain_rounds``) cannot be
laid out by the host: how many drafts each sequence accepted is known only on the device. This
kernel counts them (the drafts while they equal the target's tokens) and writes the round's inputs
as the draft loop graph reads them: the first step's one or two tokens (the target's token after
the accepted drafts, behind the last draft when all were accepted), their positions, KV slots and
lengths, and the positions, slots and lengths of the k - 1 one-token steps after it. One program a
sequence; a sequence whose base is negative is padding (length 0, slot -1, position 0).

Its reference is the torch version the draft loop falls back on (``deepinfer.core.loop_graphs.chain_inputs``,
which this package may not import); the tests compare both with a plain-Python
layout of the same rule.
"""
from __future__ import annotations

import torch
import triton.language as tl

from deepinfer_kernels._launch import kernel, next_pow2

FIELDS = ("ids", "pos", "slots", "lens", "ctx", "single", "step_pos", "step_slots", "step_lens")


@kernel
def _chain_kernel(base_ptr, vrows_ptr, drows_ptr, best_ptr, drafts_ptr, tables_ptr, ids_ptr, pos_ptr, slots_ptr,
                  lens_ptr, ctx_ptr, single_ptr, spos_ptr, sslots_ptr, slens_ptr, S, MB, BS,
                  K: tl.constexpr, KB: tl.constexpr, Q: tl.constexpr, QB: tl.constexpr, L: tl.constexpr,
                  LB: tl.constexpr):
    i = tl.program_id(0)
    base = tl.load(base_ptr + i)
    real = base >= 0
    kk = tl.arange(0, KB)
    best = tl.load(best_ptr + tl.load(vrows_ptr + i * (K + 1) + kk, mask=kk <= K, other=0), mask=kk <= K, other=-1)
    drafts = tl.load(drafts_ptr + tl.load(drows_ptr + i * K + kk, mask=kk < K, other=0), mask=kk < K, other=-2)
    accepted = tl.min(tl.where((best != drafts) | (kk >= K), kk, KB), axis=0)  # the first rejected draft
    target = tl.sum(tl.where(kk == accepted, best, 0), axis=0)
    last = tl.sum(tl.where(kk == K - 1, drafts, 0), axis=0)
    full = (accepted == K).to(tl.int64)
    new = 1 + full
    start = base + accepted - full  # the draft's cache holds every draft but the last
    first = tl.where(full == 1, last, target)
    second = tl.where(full == 1, target, 0)
    q = tl.arange(0, QB)
    live = (q < new) & (q * 0 + base >= 0)  # (a block mask: the interpreter refuses a scalar's in it)
    p = start + q
    block = tl.load(tables_ptr + i * MB + tl.minimum(tl.maximum(p // BS, 0), MB - 1), mask=live, other=0)
    row = i * Q + q
    tl.store(ids_ptr + row, tl.where(live, tl.where(q == 0, first, second), 0), mask=q < Q)
    tl.store(pos_ptr + row, tl.where(real, start + tl.minimum(q, new - 1), 0), mask=q < Q)
    tl.store(slots_ptr + row, tl.where(live, block.to(tl.int64) * BS + p % BS, -1), mask=q < Q)
    tl.store(lens_ptr + i, tl.where(real, start + new, 0).to(tl.int32))
    tl.store(ctx_ptr + i, tl.where(real, start, 0).to(tl.int32))
    tl.store(single_ptr + i, (new == 1) & real)
    j = tl.arange(0, LB)
    sp = start + new + j  # step j + 1's one token
    at = (j < L) & (j * 0 + base >= 0)
    block = tl.load(tables_ptr + i * MB + tl.minimum(tl.maximum(sp // BS, 0), MB - 1), mask=at, other=0)
    tl.store(spos_ptr + j * S + i, tl.where(at, sp, 0), mask=j < L)
    tl.store(sslots_ptr + j * S + i, tl.where(at, block.to(tl.int64) * BS + sp % BS, -1), mask=j < L)
    tl.store(slens_ptr + j * S + i, tl.where(at, sp + 1, 0).to(tl.int32), mask=j < L)


def chain_inputs(base: torch.Tensor, vrows: torch.Tensor, drows: torch.Tensor, best: torch.Tensor,
                 drafts: torch.Tensor, tables: torch.Tensor, block_size: int, out: dict[str, torch.Tensor]) -> None:
    """Fill ``out`` (the loop graph's fields: ids, pos, slots [S, Q]; lens, ctx [S] int32; single
    [S] bool; step_pos, step_slots, step_lens [k - 1, S]) for S sequences: sequence i had
    ``base[i]`` tokens before the verified ones (negative: padding), its k + 1 target tokens are
    ``best[vrows[i]]`` and its k drafts ``drafts[drows[i]]``; ``tables`` [S, max blocks] int32."""
    s, k = base.shape[0], drows.shape[1]
    q, later = out["ids"].shape[1], out["step_pos"].shape[0]
    if vrows.shape != (s, k + 1) or drows.shape != (s, k) or tables.shape[0] != s or q < 2 or later != k - 1:
        raise ValueError(f"chain_inputs takes base [S], vrows [S, k + 1], drows [S, k], tables [S, blocks] and "
                         f"outputs of 2+ first-step rows and k - 1 later steps; got base {tuple(base.shape)}, vrows "
                         f"{tuple(vrows.shape)}, drows {tuple(drows.shape)}, tables {tuple(tables.shape)}, ids "
                         f"{tuple(out['ids'].shape)}, step_pos {tuple(out['step_pos'].shape)}")
    if s:
        _chain_kernel[(s,)](base, vrows, drows, best, drafts, tables, *(out[f] for f in FIELDS), s,
                            tables.shape[1], block_size, K=k, KB=next_pow2(k + 1), Q=q, QB=next_pow2(q),
                            L=later, LB=next_pow2(later), num_warps=1)
