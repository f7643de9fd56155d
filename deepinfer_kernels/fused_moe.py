"""Fused mixture-of-experts MLP: each token through its top-k experts, weighted and summed.

    out[t] = sum_k topk_weights[t, k] * W2[e] @ (silu(W13[e][:I] @ x[t]) * (W13[e][I:] @ x[t])),
    e = topk_ids[t, k]

in four steps, none of which syncs with the host (a CUDA graph can capture them):

1. ``moe_align`` sorts the T * K routed slots by expert into blocks of BLOCK_M slots of one expert;
2. a grouped GEMM: each program takes one block (one expert) and BLOCK_N columns of gate and of up,
   gathers its tokens' rows of x, and applies SiLU-and-mul in its epilogue: act [T * K, I];
3. a grouped GEMM for down, the same way over act, each row times its top-k weight: part [T * K, D];
4. each token's K rows of part summed in order k = 0 .. K-1, in float32: the result never depends
   on which program finished first (no atomics).

The grid of the GEMMs is sized for the blocks that can be needed at most (``moe_align``): at batch 1
it is K blocks, so no program works for an expert that received no token; blocks past the last
expert's end at once. Rounding follows the eager layers (transformers' expert loop): gate and up
are rounded to x's dtype, then the SiLU and the product as ``silu_and_mul`` does; down's output is
rounded, then multiplied by its weight and rounded again; the K rows are summed in float32 and
rounded once. The same inputs give the same bits every run; a token's bits do depend on the step's
size, through the default tiles (not batch-invariant).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from deepinfer_kernels._launch import kernel, next_pow2
from deepinfer_kernels.moe_align import moe_align


@kernel(do_not_specialize=["num_blocks", "num_slots"])
def _moe_gemm_kernel(a_ptr, b_ptr, c_ptr, weight_ptr, sorted_ptr, block_expert_ptr, num_blocks, num_slots,
                     stride_am, stride_be, stride_bn, stride_cm,
                     N: tl.constexpr, K: tl.constexpr, TOPK: tl.constexpr, GATED: tl.constexpr,
                     WEIGHTED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     GROUP_M: tl.constexpr, IEEE: tl.constexpr):
    """C[slot] = A[slot // TOPK] @ B[e].T for the BLOCK_M slots of one block, BLOCK_N columns.

    GATED: B[e] is gate | up [2N, K]; C gets silu(gate) * up. WEIGHTED: each row of C is
    multiplied by weight[slot]. Programs go GROUP_M blocks down before going across, so that a
    group's blocks (mostly one expert's) share the weight tiles they read in the L2.
    """
    pid = tl.program_id(0)
    num_n = tl.cdiv(N, BLOCK_N)
    in_group = GROUP_M * num_n
    first_m = (pid // in_group) * GROUP_M
    size_m = tl.minimum(num_blocks - first_m, GROUP_M)
    pid_m = first_m + (pid % in_group) % size_m
    pid_n = (pid % in_group) // size_m
    expert = tl.load(block_expert_ptr + pid_m)
    if expert < 0:  # a block past the last expert's (the grid is sized for the worst case)
        return
    ty = c_ptr.dtype.element_ty
    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    slot = tl.load(sorted_ptr + m)
    rmask = slot < num_slots  # padding entries hold num_slots
    a_rows = a_ptr + (slot // TOPK).to(tl.int64)[:, None] * stride_am
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < N
    b_cols = b_ptr + expert.to(tl.int64) * stride_be + n.to(tl.int64)[None, :] * stride_bn
    kr = tl.arange(0, BLOCK_K)
    acc1 = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc2 = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + kr
        kmask = kk < K
        a = tl.load(a_rows + kk[None, :], mask=rmask[:, None] & kmask[None, :], other=0.0)
        bmask = kmask[:, None] & nmask[None, :]
        b1 = tl.load(b_cols + kk[:, None], mask=bmask, other=0.0)  # [BLOCK_K, BLOCK_N] of B[e].T
        if IEEE:  # float32: full-precision products, not TF32
            acc1 = tl.dot(a, b1, acc1, input_precision="ieee")
        else:
            acc1 = tl.dot(a, b1, acc1)
        if GATED:  # the up rows are N rows below the gate rows
            b2 = tl.load(b_cols + N * stride_bn + kk[:, None], mask=bmask, other=0.0)
            if IEEE:
                acc2 = tl.dot(a, b2, acc2, input_precision="ieee")
            else:
                acc2 = tl.dot(a, b2, acc2)
    y = acc1.to(ty).to(tl.float32)  # the projection's output, rounded as the eager matmul's is
    if GATED:
        up = acc2.to(ty).to(tl.float32)
        y = (y / (1.0 + tl.exp(-y))).to(ty).to(tl.float32) * up
    if WEIGHTED:
        y = y * tl.load(weight_ptr + slot, mask=rmask, other=0.0)[:, None]
    tl.store(c_ptr + slot.to(tl.int64)[:, None] * stride_cm + n[None, :], y.to(ty),
             mask=rmask[:, None] & nmask[None, :])


@kernel
def _moe_sum_kernel(part_ptr, ids_ptr, out_ptr, num_experts, D: tl.constexpr, TOPK: tl.constexpr,
                    BLOCK_D: tl.constexpr):
    """out[t] = sum over k of part[t * TOPK + k], in order, in float32; a slot whose expert id is
    outside [0, E) was never computed and adds nothing."""
    t = tl.program_id(0).to(tl.int64)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    dmask = d < D
    acc = tl.zeros([BLOCK_D], tl.float32)
    for k in tl.static_range(TOPK):
        e = tl.load(ids_ptr + t * TOPK + k)
        ok = (tl.zeros([BLOCK_D], tl.int32) + e) >= 0  # a vector: the interpreter rejects a scalar mask
        ok = ok & ((tl.zeros([BLOCK_D], tl.int32) + e) < num_experts)
        acc += tl.load(part_ptr + (t * TOPK + k) * D + d, mask=dmask & ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + t * D + d, acc.to(out_ptr.dtype.element_ty), mask=dmask)


@dataclass(frozen=True)
class MoeConfig:
    """Tiles of both grouped GEMMs: ``block_m`` routed slots (of one expert) by ``block_n`` output
    columns, ``block_k`` a loop step; ``group_m`` blocks share a column of programs (L2 reuse)."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int = 1
    num_warps: int = 4
    num_stages: int = 3


def default_config(num_slots: int, num_experts: int, device: torch.device) -> MoeConfig:
    """The tiles for ``num_slots`` = T * K routed slots over E experts.

    Chosen by the slots an expert gets on average, for sm90 and bf16. Not measured yet (no GPU run
    has timed them; a sweep should replace them), only compiled for sm_90 with Triton 3.9, where
    none spills registers and the largest takes 160 KiB of shared memory: up to 16 slots (decode:
    the weights are read once, the rows are few) the narrowest tensor-core tile, 16 rows, with long
    K steps so that each program streams its weight tile; up to 128, 64-row blocks; beyond, 64 x 128
    tiles, 8 warps, with grouped ordering. In the interpreter, small tiles (its time grows with them).
    """
    if device.type != "cuda":
        return MoeConfig(16, 16, 16, 2, 4, 1)
    per_expert = num_slots / max(num_experts, 1)
    if per_expert <= 16:
        return MoeConfig(16, 64, 128, 1, 4, 4)
    if per_expert <= 128:
        return MoeConfig(64, 64, 64, 4, 4, 4)
    return MoeConfig(64, 128, 64, 8, 8, 4)  # 8 warps: gate and up are two 64 x 128 accumulators


def _check(x, w13, w2, topk_weights, topk_ids) -> None:
    if x.dim() != 2 or w13.dim() != 3 or w2.dim() != 3:
        raise ValueError(f"fused_moe takes x [T, D], w13 [E, 2I, D], w2 [E, D, I]; got x {tuple(x.shape)}, "
                         f"w13 {tuple(w13.shape)}, w2 {tuple(w2.shape)}")
    t, d = x.shape
    e, i2, _ = w13.shape
    if w13.shape[2] != d or i2 % 2 or w2.shape != (e, d, i2 // 2):
        raise ValueError(f"fused_moe: for x [T, {d}] and w13 {tuple(w13.shape)} = [E, 2I, D], w2 must be "
                         f"[{e}, {d}, {i2 // 2}] = [E, D, I] and 2I even; got w2 {tuple(w2.shape)}")
    if topk_ids.dim() != 2 or topk_ids.shape[0] != t or topk_weights.shape != topk_ids.shape:
        raise ValueError(f"fused_moe: topk_weights and topk_ids must both be [{t}, K]; got "
                         f"{tuple(topk_weights.shape)} and {tuple(topk_ids.shape)}")
    if topk_ids.dtype not in (torch.int32, torch.int64) or topk_weights.dtype != torch.float32:
        raise ValueError(f"fused_moe takes int32/int64 topk_ids and float32 topk_weights (grouped_topk's); got "
                         f"{topk_ids.dtype} and {topk_weights.dtype}")
    if w13.dtype != x.dtype or w2.dtype != x.dtype:
        raise ValueError(f"fused_moe: x is {x.dtype}, w13 {w13.dtype}, w2 {w2.dtype}; they must match")
    if len({x.device, w13.device, w2.device, topk_ids.device, topk_weights.device}) != 1:
        raise ValueError("fused_moe: x, the weights, topk_weights and topk_ids must be on one device")
    if w13.stride(2) != 1 or w2.stride(2) != 1:
        raise ValueError("fused_moe needs w13 and w2 contiguous along their last dimension (D for w13, I for w2)")


def fused_moe(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor, *, config: MoeConfig | None = None, check_ids: bool = True) -> torch.Tensor:
    """Each token of x [T, D] through its experts: w13 [E, 2I, D] = gate | up, w2 [E, D, I],
    topk_weights [T, K] float32, topk_ids [T, K] int32; returns [T, D] in x's dtype.

    ``check_ids``: raise ValueError for an expert id outside [0, E). The check reads the ids on the
    host (a sync, and not allowed inside a CUDA graph capture); pass False where the ids come from
    ``grouped_topk``. Unchecked, a slot with such an id is left out of the sum.
    """
    _check(x, w13, w2, topk_weights, topk_ids)
    t, d = x.shape
    e, inter = w13.shape[0], w2.shape[2]
    if check_ids and topk_ids.numel():
        lo, hi = (int(v) for v in torch.aminmax(topk_ids))
        if lo < 0 or hi >= e:
            raise ValueError(f"fused_moe: topk_ids hold experts {lo} .. {hi}; there are {e} experts, ids 0 .. {e - 1}")
    out = torch.empty(t, d, dtype=x.dtype, device=x.device)
    top_k = topk_ids.shape[1]
    slots = t * top_k
    if slots == 0:
        return out.zero_()
    cfg = config or default_config(slots, e, x.device)
    if min(cfg.block_m, cfg.block_n, cfg.block_k) < 16 or cfg.group_m < 1:
        raise ValueError(f"fused_moe: tiles need block_m, block_n, block_k >= 16 (the tensor cores') and group_m >= 1; "
                         f"got {cfg}")
    x = x.contiguous()
    ids = topk_ids.contiguous()
    align = moe_align(ids, e, cfg.block_m)
    blocks = align.block_experts.shape[0]
    act = torch.empty(slots, inter, dtype=x.dtype, device=x.device)
    part = torch.empty(slots, d, dtype=x.dtype, device=x.device)
    tiles = {"BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k, "GROUP_M": cfg.group_m,
             "IEEE": x.dtype == torch.float32, "num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    _moe_gemm_kernel[(blocks * triton.cdiv(inter, cfg.block_n),)](
        x, w13, act, topk_weights, align.sorted_ids, align.block_experts, blocks, slots,
        x.stride(0), w13.stride(0), w13.stride(1), act.stride(0),
        N=inter, K=d, TOPK=top_k, GATED=True, WEIGHTED=False, **tiles)
    _moe_gemm_kernel[(blocks * triton.cdiv(d, cfg.block_n),)](
        act, w2, part, topk_weights.contiguous(), align.sorted_ids, align.block_experts, blocks, slots,
        act.stride(0), w2.stride(0), w2.stride(1), part.stride(0),
        N=d, K=inter, TOPK=1, GATED=False, WEIGHTED=True, **tiles)
    block_d = min(1024, next_pow2(d))
    _moe_sum_kernel[(t, triton.cdiv(d, block_d))](part, ids, out, e, D=d, TOPK=top_k, BLOCK_D=block_d, num_warps=4)
    return out


def fused_moe_ref(x, w13, w2, topk_weights, topk_ids, *, config=None, check_ids=True) -> torch.Tensor:
    """Torch reference of :func:`fused_moe`: a loop over the experts (transformers' expert loop,
    rounded where the kernels round)."""
    t, d = x.shape
    top_k = topk_ids.shape[1]
    flat = topk_ids.reshape(-1).long()
    part = torch.zeros(t * top_k, d, dtype=x.dtype, device=x.device)
    for e in range(w13.shape[0]):
        slots = (flat == e).nonzero().flatten()
        if slots.numel() == 0:
            continue
        gate, up = F.linear(x[slots // top_k], w13[e]).chunk(2, dim=-1)
        y = F.linear(F.silu(gate) * up, w2[e])
        part[slots] = (y.float() * topk_weights.reshape(-1)[slots, None]).to(x.dtype)
    return part.view(t, top_k, d).float().sum(1).to(x.dtype)
