"""FP8 block-scaled GEMM in DeepSeek-V3's format, and the quantizations that feed it.

Weights W [N, K] are float8_e4m3fn with ``weight_scale_inv`` [ceil(N/128), ceil(K/128)] float32:
the real weight is W times the scale of its 128x128 block. Activations are quantized on the fly
per token and per 128 columns (``per_token_group_quant_fp8``): x_fp8 [M, K] with x_scale
[M, ceil(K/128)]. The GEMM takes one 128-wide K block at a time: the fp8 tiles' product (summed in
fp32 by the tensor cores) is multiplied by the two blocks' scales and added to an fp32 accumulator,
so the scales, which change along K, are applied before any sum crosses a block.

``backend="scaled_mm"`` routes the same call to ``torch._scaled_mm``'s cuBLASLt path for this recipe
(1x128 activation scales, 128x128 weight scales; torch 2.9 and later, CUDA 12.9+, compute capability
9.0 only, and K a multiple of 512: see _check_gemm). On an H100 it was 1.5-1.9x faster than the
Triton kernel at 4096 rows and slower at one row.

The Triton interpreter rounds float32 to float8 wrongly where rounding carries into the exponent
(0.4997 -> 0.25); under it the quantization kernel rounds in integer arithmetic instead (the
same round-to-nearest-even), while compiled kernels use the hardware conversion.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_kernels._launch import kernel, triton_interpreted

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
GROUP = 128  # the quantization block: 1x128 for activations, 128x128 for weights
EPS = 1e-10  # the smallest amax a scale is computed from (an all-zero group gets a tiny scale, not 0)


@kernel
def _group_quant_kernel(x_ptr, q_ptr, s_ptr, n_cols, n_groups, stride_xm, stride_qm, stride_sm, stride_sg,
                        BLOCK_G: tl.constexpr, GROUP_SIZE: tl.constexpr, SOFT_CAST: tl.constexpr):
    row = tl.program_id(0)
    g = tl.program_id(1) * BLOCK_G + tl.arange(0, BLOCK_G)
    col = g[:, None] * GROUP_SIZE + tl.arange(0, GROUP_SIZE)[None, :]
    mask = col < n_cols
    x = tl.load(x_ptr + row * stride_xm + col, mask=mask, other=0.0).to(tl.float32)
    scale = tl.div_rn(tl.maximum(tl.max(tl.abs(x), 1), 1e-10), 448.0)
    y = tl.minimum(tl.maximum(tl.div_rn(x, scale[:, None]), -448.0), 448.0)
    if SOFT_CAST:
        # e4m3fn bits by round-to-nearest-even: exponent e = max(floor(log2|y|), -6), mantissa
        # steps of 2^(e-3); code = (e + 6) * 8 + |y| / 2^(e-3) rounded (a carry into the next
        # binade comes out right by itself, and e = -6 covers the subnormals)
        a = tl.abs(y)
        e = tl.maximum(((a.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127, -6)
        m = a * ((130 - e) << 23).to(tl.float32, bitcast=True)  # a * 2^(3-e): exact, in [0, 16]
        t = tl.floor(m)
        frac = m - t
        ti = t.to(tl.int32)
        ti += ((frac > 0.5) | ((frac == 0.5) & ((ti & 1) == 1))).to(tl.int32)
        code = (e + 6) * 8 + ti + tl.where(y.to(tl.int32, bitcast=True) < 0, 128, 0)  # the sign bit: -0.0 too
        tl.store(q_ptr + row * stride_qm + col, code.to(tl.uint8), mask=mask)
    else:
        tl.store(q_ptr + row * stride_qm + col, y.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(s_ptr + row * stride_sm + g * stride_sg, scale, mask=g < n_groups)


def per_token_group_quant_fp8(x: torch.Tensor, column_major_scales: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (any float dtype) -> (x_fp8 [M, K] float8_e4m3fn, x_scale [M, ceil(K/128)] float32),
    x ~ x_fp8 * x_scale of its 128-column group; scale = max(amax, 1e-10) / 448.
    ``column_major_scales``: x_scale with strides (1, M), the layout torch._scaled_mm wants."""
    if x.dim() != 2:
        raise ValueError(f"x has shape {tuple(x.shape)}; expected [tokens, features]")
    m, k = x.shape
    groups = triton.cdiv(k, GROUP)
    q = torch.empty(m, k, dtype=FP8, device=x.device)
    scale = (torch.empty(groups, m, dtype=torch.float32, device=x.device).t() if column_major_scales
             else torch.empty(m, groups, dtype=torch.float32, device=x.device))
    if m == 0 or k == 0:
        return q, scale
    if x.stride(-1) != 1:
        x = x.contiguous()
    soft = triton_interpreted()
    block_g = min(8, triton.next_power_of_2(groups))
    _group_quant_kernel[(m, triton.cdiv(groups, block_g))](
        x, q.view(torch.uint8) if soft else q, scale, k, groups, x.stride(0), q.stride(0), scale.stride(0),
        scale.stride(1), BLOCK_G=block_g, GROUP_SIZE=GROUP, SOFT_CAST=soft, num_warps=4)
    return q, scale


def per_token_group_quant_fp8_ref(x: torch.Tensor, column_major_scales: bool = False):
    """Torch reference of :func:`per_token_group_quant_fp8` (the same arithmetic, so the same bits)."""
    m, k = x.shape
    groups = triton.cdiv(k, GROUP)
    xg = torch.nn.functional.pad(x.float(), (0, groups * GROUP - k)).view(m, groups, GROUP)
    amax = xg.abs().amax(-1).clamp(min=EPS)
    scale = amax / torch.full_like(amax, FP8_MAX)  # a tensor: CUDA divides by a Python float as x * (1/448)
    q = (xg / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8).view(m, groups * GROUP)[:, :k]
    return q.contiguous(), (scale.t().contiguous().t() if column_major_scales else scale)


def block_quantize_fp8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (w_fp8 [N, K] float8_e4m3fn, scale_inv [ceil(N/128), ceil(K/128)] float32): each
    128x128 block's scale_inv is its amax / 448 (at least 1e-10 / 448), so its largest entry
    becomes +-448. For quantizing a bf16 checkpoint at load time (and for tests)."""
    if w.dim() != 2:
        raise ValueError(f"w has shape {tuple(w.shape)}; expected [out_features, in_features]")
    n, k = w.shape
    nb, kb = triton.cdiv(n, GROUP), triton.cdiv(k, GROUP)
    blocks = torch.nn.functional.pad(w.float(), (0, kb * GROUP - k, 0, nb * GROUP - n)).view(nb, GROUP, kb, GROUP)
    amax = blocks.abs().amax(dim=(1, 3)).clamp(min=EPS)
    scale_inv = amax / torch.full_like(amax, FP8_MAX)  # true division on CUDA too
    q = (blocks / scale_inv[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q.view(nb * GROUP, kb * GROUP)[:n, :k].contiguous(), scale_inv


def dequantize_block_fp8(w_fp8: torch.Tensor, scale_inv: torch.Tensor, dtype: torch.dtype = torch.float32,
                         block: tuple[int, int] = (GROUP, GROUP)) -> torch.Tensor:
    """w_fp8 [N, K] times the scale of its block -> [N, K] in ``dtype``. ``block`` (rows, columns)
    is (128, 128) for weights, (1, 128) for activations quantized per token group."""
    n, k = w_fp8.shape
    rows, cols = block
    if scale_inv.shape != (triton.cdiv(n, rows), triton.cdiv(k, cols)):
        raise ValueError(f"scale_inv has shape {tuple(scale_inv.shape)}; a [{n}, {k}] tensor in blocks of "
                         f"{rows}x{cols} needs [{triton.cdiv(n, rows)}, {triton.cdiv(k, cols)}]")
    full = scale_inv.float().repeat_interleave(rows, 0)[:n].repeat_interleave(cols, 1)[:, :k]
    return (w_fp8.float() * full).to(dtype)


@kernel(do_not_specialize=["m"])  # (strides specialized: fp8 rows known 16-byte aligned load 16 bytes at once)
def _fp8_gemm_kernel(a_ptr, b_ptr, c_ptr, as_ptr, bs_ptr, m, n, k, k_blocks_per_split, stride_am, stride_bn,
                     stride_cs, stride_cm, stride_asm, stride_asg, stride_bsn, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, EVEN_K: tl.constexpr):
    # programs in groups of GROUP_M row tiles, so that consecutive programs share weight tiles in L2
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(m, BLOCK_M)
    tiles_n = tl.cdiv(n, BLOCK_N)
    first_m = (pid // (GROUP_M * tiles_n)) * GROUP_M
    rows = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * tiles_n)) % rows
    pid_n = (pid % (GROUP_M * tiles_n)) // rows
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    # rows and columns past the end read row/column 0's data instead (no mask on the hot loads);
    # their results are never stored
    safe_m = tl.where(offs_m < m, offs_m, 0).to(tl.int64)
    safe_n = tl.where(offs_n < n, offs_n, 0).to(tl.int64)
    # split-K: program_id(1) takes K blocks kb0 .. kb0 + k_blocks_per_split - 1 into its own partial sum
    kb0 = tl.program_id(1) * k_blocks_per_split
    a_at = a_ptr + safe_m[:, None] * stride_am + kb0 * BLOCK_K + offs_k[None, :]
    b_at = b_ptr + safe_n[None, :] * stride_bn + kb0 * BLOCK_K + offs_k[:, None]
    as_at = as_ptr + safe_m * stride_asm
    bs_at = bs_ptr + (safe_n // BLOCK_K) * stride_bsn
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    kb_end = tl.minimum(kb0 + k_blocks_per_split, tl.cdiv(k, BLOCK_K))
    # the scales are loaded one block ahead: their latency hides behind the block's product
    a_s = tl.load(as_at + kb0 * stride_asg)
    b_s = tl.load(bs_at + kb0)
    for kb in range(kb0, kb_end):
        if EVEN_K:  # no mask along K: whole 16-byte loads
            a = tl.load(a_at)
            b = tl.load(b_at)
        else:
            a = tl.load(a_at, mask=offs_k[None, :] < k - kb * BLOCK_K, other=0.0)
            b = tl.load(b_at, mask=offs_k[:, None] < k - kb * BLOCK_K, other=0.0)
        nxt = tl.minimum(kb + 1, kb_end - 1)
        a_s_next = tl.load(as_at + nxt * stride_asg)
        b_s_next = tl.load(bs_at + nxt)
        acc += tl.dot(a, b) * a_s[:, None] * b_s[None, :]  # the block's scales, before any sum across blocks
        a_s = a_s_next
        b_s = b_s_next
        a_at += BLOCK_K
        b_at += BLOCK_K
    c = acc.to(c_ptr.dtype.element_ty)
    tl.store(c_ptr + tl.program_id(1) * stride_cs + offs_m[:, None].to(tl.int64) * stride_cm + offs_n[None, :], c,
             mask=(offs_m[:, None] < m) & (offs_n[None, :] < n))


def fp8_gemm_config(m: int) -> tuple[int, int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages, split_k) of the Triton GEMM for m rows."""
    if m <= 16:  # the fastest of a sweep on an H100 at DeepSeek-V3 shapes (M 1, 64, 4096)
        return 16, 128, 4, 4, 1
    if m <= 64:
        return 64, 64, 4, 4, 1
    return 64, 128, 4, 4, 1


def fp8_block_gemm(x_fp8: torch.Tensor, x_scale: torch.Tensor, w_fp8: torch.Tensor, w_scale_inv: torch.Tensor,
                   out_dtype: torch.dtype = torch.bfloat16, backend: str = "triton",
                   config: tuple[int, int, int, int, int] | None = None) -> torch.Tensor:
    """x_fp8 [M, K] @ w_fp8 [N, K].T with per-block scales -> [M, N] in ``out_dtype``.

    x_scale [M, ceil(K/128)] float32 (per token and 128 columns, any strides), w_scale_inv
    [ceil(N/128), ceil(K/128)] float32. ``backend``: "triton" (this module's kernel; ``config``
    overrides fp8_gemm_config: tiles, warps, stages and split_k, K cut into that many runs of blocks
    summed in float32 afterwards) or "scaled_mm" (torch._scaled_mm, cuBLASLt; compute capability
    9.0, K a multiple of 512)."""
    _check_gemm(x_fp8, x_scale, w_fp8, w_scale_inv, backend)
    m, k = x_fp8.shape
    n = w_fp8.shape[0]
    if backend == "scaled_mm":
        return _scaled_mm_gemm(x_fp8, x_scale, w_fp8, w_scale_inv, out_dtype)
    out = torch.empty(m, n, dtype=out_dtype, device=x_fp8.device)
    if m == 0 or n == 0:
        return out
    if k == 0:
        return out.zero_()
    block_m, block_n, warps, stages, split_k = config or fp8_gemm_config(m)
    k_blocks = triton.cdiv(k, GROUP)
    per_split = triton.cdiv(k_blocks, max(1, min(split_k, k_blocks)))
    splits = triton.cdiv(k_blocks, per_split)
    # several K splits: float32 partial sums, added in a fixed order afterwards (no atomics)
    part = out if splits == 1 else torch.empty(splits, m, n, dtype=torch.float32, device=out.device)
    grid = (triton.cdiv(m, block_m) * triton.cdiv(n, block_n), splits)
    _fp8_gemm_kernel[grid](x_fp8, w_fp8, part, x_scale, w_scale_inv, m, n, k, per_split, x_fp8.stride(0),
                           w_fp8.stride(0), part.stride(0) if splits > 1 else 0, part.stride(-2), x_scale.stride(0),
                           x_scale.stride(1), w_scale_inv.stride(0), BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=GROUP,
                           GROUP_M=8, EVEN_K=k % GROUP == 0, num_warps=warps, num_stages=stages)
    return out if splits == 1 else part.sum(0).to(out_dtype)


def _scaled_mm_gemm(x_fp8, x_scale, w_fp8, w_scale_inv, out_dtype):
    """cuBLASLt wants M a multiple of 4, x_scale column-major (strides (1, M)) and the weight's
    scales as [K/128, N/128] column-major: w_scale_inv.t() of a contiguous w_scale_inv."""
    m = x_fp8.shape[0]
    pad = -m % 4
    if pad:
        x_fp8 = torch.cat([x_fp8, x_fp8.new_zeros(pad, x_fp8.shape[1])])
        x_scale = torch.cat([x_scale, x_scale.new_ones(pad, x_scale.shape[1])])
    if x_scale.stride(0) != 1:
        x_scale = x_scale.t().contiguous().t()
    out = torch._scaled_mm(x_fp8, w_fp8.t(), scale_a=x_scale, scale_b=w_scale_inv.contiguous().t(),
                           out_dtype=out_dtype)
    return out[:m] if pad else out


def _check_gemm(x_fp8, x_scale, w_fp8, w_scale_inv, backend) -> None:
    if x_fp8.dtype != FP8 or w_fp8.dtype != FP8:
        raise ValueError(f"x_fp8 and w_fp8 must be float8_e4m3fn, got {x_fp8.dtype} and {w_fp8.dtype}; quantize "
                         "with per_token_group_quant_fp8 and block_quantize_fp8")
    if x_fp8.dim() != 2 or w_fp8.dim() != 2 or x_fp8.shape[1] != w_fp8.shape[1]:
        raise ValueError(f"x_fp8 {tuple(x_fp8.shape)} and w_fp8 {tuple(w_fp8.shape)} must be [M, K] and [N, K]")
    (m, k), n = x_fp8.shape, w_fp8.shape[0]
    kb = triton.cdiv(k, GROUP)
    if x_scale.shape != (m, kb) or w_scale_inv.shape != (triton.cdiv(n, GROUP), kb):
        raise ValueError(f"x_scale {tuple(x_scale.shape)} and w_scale_inv {tuple(w_scale_inv.shape)} must be "
                         f"[{m}, {kb}] and [{triton.cdiv(n, GROUP)}, {kb}] float32 (one per 1x128 / 128x128 block)")
    if x_scale.dtype != torch.float32 or w_scale_inv.dtype != torch.float32:
        raise ValueError("x_scale and w_scale_inv must be float32")
    if x_fp8.stride(-1) != 1 or w_fp8.stride(-1) != 1 or w_scale_inv.stride(-1) != 1:
        raise ValueError("x_fp8, w_fp8 and w_scale_inv must be contiguous in their last dimension")
    if backend not in ("triton", "scaled_mm"):
        raise ValueError(f"backend {backend!r} is not one of 'triton', 'scaled_mm'")
    if backend == "scaled_mm" and k % (4 * GROUP):
        # cuBLASLt reads the weight's scales in rows padded to 4 blocks, while torch 2.11 accepts
        # only unpadded rows: any other K gives silently wrong numbers (seen on an H100)
        raise ValueError(f"backend 'scaled_mm' needs K a multiple of {4 * GROUP}, got {k}; use backend 'triton'")


def fp8_block_gemm_ref(x_fp8, x_scale, w_fp8, w_scale_inv, out_dtype=torch.bfloat16, backend="triton",
                       config=None) -> torch.Tensor:
    """Torch reference of :func:`fp8_block_gemm`: both operands dequantized, one float32 matmul."""
    x = dequantize_block_fp8(x_fp8, x_scale, block=(1, GROUP))
    w = dequantize_block_fp8(w_fp8, w_scale_inv)
    return (x @ w.T).to(out_dtype)
