"""Single-token projections (GEMV) with the layer's neighbouring steps folded in.

A decode step of one sequence multiplies a single row x [1, K] by each weight [N, K]: pure weight
reads, which cuBLAS serves at well below the memory bandwidth on small matrices, with a separate
small kernel before and after each one (RMSNorm, rotary, SiLU-mul, residual add). Here one kernel
does each projection with its neighbours:

- ``gemv(x, w, norm_weight=...)``: RMSNorm of x first (every program normalises the row itself:
  x is a few KiB and stays in L2);
- ``gemv(x, w, residual=r)``: ``r += x @ w.T`` in place (the residual stream's add);
- ``gemv(x, w, norm_weight=..., silu_mul=True)``: w is gate | up [2I, K]; returns silu(gate) * up;
- ``gemv_qkv_rotary``: the fused qkv projection with the input norm, Qwen3's per-head q/k norm and
  the rotary embedding of q and k.

Each program multiplies BLOCK_N rows (for paired outputs, BLOCK_N rows and their partners: gate
and up, or the two halves of a rotary head) over one of SPLIT_K slices of K. With SPLIT_K > 1 the
programs of a row block write float32 partials, and the last of them to finish (an atomic counter,
which it resets for the next launch) adds them in slice order and applies the epilogue: so the
result never depends on which program finished last, and one launch does everything.

Rounding follows the eager layers: the projection's output is rounded to the dtype before the
epilogue, the norm, rotary and SiLU-mul round where the eager ops do, and ``r + y`` is rounded once.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from deepinfer_kernels._launch import counters, kernel, next_pow2

_PLAIN, _SILU_MUL, _ROTARY = 0, 1, 2


@kernel
def _gemv_kernel(x_ptr, w_ptr, out_ptr, nw_ptr, res_ptr, part_ptr, count_ptr,
                 cos_ptr, sin_ptr, pos_ptr, qn_ptr, kn_ptr, kc_ptr, vc_ptr, slot_ptr,
                 eps, qk_eps, stride_w, stride_cp, stride_cs, stride_ch,
                 N: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, MODE: tl.constexpr, PAIR: tl.constexpr,
                 HALF: tl.constexpr, ROT_ROWS: tl.constexpr, Q_ROWS: tl.constexpr,
                 NORM: tl.constexpr, RESIDUAL: tl.constexpr, QK_NORM: tl.constexpr, KV_WRITE: tl.constexpr,
                 D: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
                 K_SLICE: tl.constexpr, PDL: tl.constexpr, PREFETCH: tl.constexpr, EVICT: tl.constexpr):
    b = tl.program_id(0)
    s = tl.program_id(1)
    ty = x_ptr.dtype.element_ty
    n = tl.arange(0, BLOCK_N)
    if MODE == 2:  # BLOCK_N rows of one head's first half; their partners are HALF rows on
        j = (b % (HALF // BLOCK_N)) * BLOCK_N + n
        r1 = (b // (HALF // BLOCK_N)) * (2 * HALF) + j
    else:
        j = n
        r1 = b * BLOCK_N + n
    rmask = r1 < N
    w1_rows = w_ptr + r1.to(tl.int64)[:, None] * stride_w
    w2_rows = w_ptr + (r1 + PAIR).to(tl.int64)[:, None] * stride_w
    # with PREFETCH, weights are read one tile ahead of their use, the first tile before waiting
    # for the previous kernel (with PDL this launch starts while it finishes; weights never depend
    # on it)
    k_lo = s * K_SLICE
    kr = tl.arange(0, BLOCK_K)
    if PREFETCH:
        kk = k_lo + kr
        m2 = rmask[:, None] & ((kk < K) & (kr < K_SLICE))[None, :]
        w1 = tl.load(w1_rows + kk[None, :], mask=m2, other=0.0, eviction_policy=EVICT)
        w2 = tl.load(w2_rows + kk[None, :], mask=m2 & (MODE != 0), other=0.0, eviction_policy=EVICT)
    if PDL:
        tl.extra.cuda.gdc_wait()  # x, the residual and the counters are the previous kernel's
        tl.extra.cuda.gdc_launch_dependents()
    # what the epilogue reads is asked for now, so that its round trips to memory overlap the
    # loop's instead of following it (only the last program of a split-K row block uses them)
    if RESIDUAL:
        r = tl.load(res_ptr + r1, mask=rmask, other=0.0).to(tl.float32)
    if MODE == 2:
        p = tl.load(pos_ptr).to(tl.int64)
        c1 = tl.load(cos_ptr + p * stride_cp + j).to(tl.float32)
        c2 = tl.load(cos_ptr + p * stride_cp + HALF + j).to(tl.float32)
        s1 = tl.load(sin_ptr + p * stride_cp + j).to(tl.float32)
        s2 = tl.load(sin_ptr + p * stride_cp + HALF + j).to(tl.float32)
        if KV_WRITE:
            slot = tl.load(slot_ptr).to(tl.int64)
    if NORM:  # the input RMSNorm's scale, over the whole row
        xs = tl.arange(0, KP)
        xf = tl.load(x_ptr + xs, mask=xs < K, other=0.0).to(tl.float32)
        inv = tl.rsqrt(tl.sum(xf * xf, 0) / K + eps)
    acc1 = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    acc2 = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    for k0 in range(0, K_SLICE, BLOCK_K):
        kk = k_lo + k0 + kr
        kmask = (kk < K) & (k0 + kr < K_SLICE)
        if PREFETCH:
            nk = kk + BLOCK_K  # the next tile's columns
            nm2 = rmask[:, None] & ((nk < K) & (k0 + BLOCK_K + kr < K_SLICE))[None, :]
            w1_next = tl.load(w1_rows + nk[None, :], mask=nm2, other=0.0, eviction_policy=EVICT)
            w2_next = tl.load(w2_rows + nk[None, :], mask=nm2 & (MODE != 0), other=0.0,
                              eviction_policy=EVICT)
        else:
            m2 = rmask[:, None] & kmask[None, :]
            w1 = tl.load(w1_rows + kk[None, :], mask=m2, other=0.0, eviction_policy=EVICT)
            w2 = tl.load(w2_rows + kk[None, :], mask=m2 & (MODE != 0), other=0.0, eviction_policy=EVICT)
        xk = tl.load(x_ptr + kk, mask=kmask, other=0.0).to(tl.float32)
        if NORM:
            wn = tl.load(nw_ptr + kk, mask=kmask, other=0.0).to(tl.float32)
            xk = ((xk * inv).to(ty).to(tl.float32) * wn).to(ty).to(tl.float32)
        acc1 += w1.to(tl.float32) * xk[None, :]
        if MODE != 0:
            acc2 += w2.to(tl.float32) * xk[None, :]
        if PREFETCH:
            w1 = w1_next
            w2 = w2_next
    y1 = tl.sum(acc1, 1)
    y2 = tl.sum(acc2, 1)
    omask = rmask
    if SPLIT_K > 1:  # partials out; the row block's last program sums them in slice order
        mine = part_ptr + (b * SPLIT_K + s) * (2 * BLOCK_N)
        tl.store(mine + n, y1)
        tl.store(mine + BLOCK_N + n, y2)
        tl.debug_barrier()  # every warp's partial is stored before the release below
        done = tl.atomic_add(count_ptr + b, 1, sem="acq_rel")
        # the test is broadcast to a vector: the interpreter rejects a scalar in a mask
        last = (tl.zeros([BLOCK_N], tl.int32) + done) == SPLIT_K - 1
        y1 = tl.zeros([BLOCK_N], tl.float32)
        y2 = tl.zeros([BLOCK_N], tl.float32)
        for i in tl.static_range(SPLIT_K):
            theirs = part_ptr + (b * SPLIT_K + i) * (2 * BLOCK_N)
            y1 += tl.load(theirs + n, mask=last, other=0.0, cache_modifier=".cg")
            y2 += tl.load(theirs + BLOCK_N + n, mask=last, other=0.0, cache_modifier=".cg")
        tl.store(count_ptr + b + n, tl.zeros([BLOCK_N], tl.int32), mask=last & (n == 0))
        omask = rmask & last
    y1 = y1.to(ty).to(tl.float32)  # the projection's output, rounded as the eager matmul's is
    y2 = y2.to(ty).to(tl.float32)
    if MODE == 1:  # silu(gate) * up
        act = (y1 / (1.0 + tl.exp(-y1))).to(ty).to(tl.float32)
        tl.store(out_ptr + r1, (act * y2).to(ty), mask=omask)
    elif MODE == 2:
        rot = r1 < ROT_ROWS  # q and k heads turn; v heads are stored as they are
        if QK_NORM:  # BLOCK_N == HALF: the program holds the whole head
            hinv = tl.rsqrt((tl.sum(y1 * y1, 0) + tl.sum(y2 * y2, 0)) / (2 * HALF) + qk_eps)
            is_q = r1 < Q_ROWS
            g1 = tl.where(is_q, tl.load(qn_ptr + j).to(tl.float32), tl.load(kn_ptr + j).to(tl.float32))
            g2 = tl.where(is_q, tl.load(qn_ptr + HALF + j).to(tl.float32), tl.load(kn_ptr + HALF + j).to(tl.float32))
            y1 = tl.where(rot, ((y1 * hinv).to(ty).to(tl.float32) * g1).to(ty).to(tl.float32), y1)
            y2 = tl.where(rot, ((y2 * hinv).to(ty).to(tl.float32) * g2).to(ty).to(tl.float32), y2)
        o1 = (y1 * c1).to(ty).to(tl.float32) + (-y2 * s1).to(ty).to(tl.float32)
        o2 = (y2 * c2).to(ty).to(tl.float32) + (y1 * s2).to(ty).to(tl.float32)
        o1 = tl.where(rot, o1, y1).to(ty)
        o2 = tl.where(rot, o2, y2).to(ty)
        tl.store(out_ptr + r1, o1, mask=omask)
        tl.store(out_ptr + r1 + HALF, o2, mask=omask)
        if KV_WRITE:  # k and v heads also go straight into the paged cache, at the token's slot
            kv_head = r1 // D - Q_ROWS // D  # k heads 0.., then v heads 0..
            kv_n = (ROT_ROWS - Q_ROWS) // D
            keep = omask & (r1 >= Q_ROWS) & ((tl.zeros([BLOCK_N], tl.int64) + slot) >= 0)
            is_v = kv_head >= kv_n
            at = slot * stride_cs + tl.where(is_v, kv_head - kv_n, kv_head) * stride_ch + r1 % D
            kd = kc_ptr.dtype.element_ty
            tl.store(kc_ptr + at, o1.to(kd), mask=keep & ~is_v)
            tl.store(kc_ptr + at + HALF, o2.to(kd), mask=keep & ~is_v)
            tl.store(vc_ptr + at, o1.to(kd), mask=keep & is_v)
            tl.store(vc_ptr + at + HALF, o2.to(kd), mask=keep & is_v)
    elif RESIDUAL:
        tl.store(res_ptr + r1, (y1 + r).to(ty), mask=omask)
    else:
        tl.store(out_ptr + r1, y1.to(ty), mask=omask)


@dataclass(frozen=True)
class GemvConfig:
    """Tile of one program: ``block_n`` output rows (pairs, in the paired modes) by ``block_k``
    columns a loop step, over one of ``split_k`` slices of K; ``prefetch``: load each weight tile
    one step ahead of its use."""

    block_n: int
    block_k: int
    split_k: int
    num_warps: int = 4
    prefetch: bool = True


_SM_COUNT: dict[int, int] = {}
EVICTION_POLICIES = ("", "evict_first", "evict_last")  # the weights' L2 policy ("": the default)
PREFETCH = True  # default_config's choice (H200: see docs/benchmarks.md)


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # the interpreter: a few programs, so that split K is exercised there too
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SM_COUNT:
        _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_COUNT[idx]


def default_config(rows: int, k: int, device: torch.device, paired: bool = False,
                   row_quantum: int | None = None, block_n: int | None = None) -> GemvConfig:
    """The tile for ``rows`` output rows (pairs when ``paired``) over K = ``k``.

    From the H200 sweeps (issue 6's probes, in git history at d2f3059; the second timed
    each projection as 16 launches with PDL, as a decode step runs them; docs/benchmarks.md):
    plain rows 4 a program by 2,048 columns a step (8 warps; 4 when K is longer), or 8 by 1,024
    with 8 warps when K is over 2,048 and at least twice N (down); a plain projection small enough
    for one program an SM at up to 16 rows (o, which follows attention) takes that many rows, so
    that every program reads its whole tile while attention runs (16 Llama-3.2-1B layers: 21.6 us
    less than 4 rows, a probe in git history at d2f3059); pairs 2 a program by 512
    columns, or 8 by 256 with 4 warps when there are many (gate/up). Otherwise K is split when there
    are fewer row blocks than SMs.
    ``row_quantum``: block_n must divide it (a rotary half-head). ``block_n``: fixed by the caller
    (whole heads for the q/k norm); the step then keeps the tile at 4,096 weights or fewer.
    """
    sm, one_wave = _sm_count(device), False
    if paired:
        bn, block_k, warps = (8, 256, 4) if rows >= 4096 else (2, 512, 4)
    else:
        # down (K several times N): 8 by 1,024; the others (o, and any plain projection) 4 by 2,048
        bn, block_k, warps = (8, 1024, 8) if k > 2048 and k >= 2 * rows else (4, 2048, 8 if k <= 2048 else 4)
        one_wave = k <= 2048 and 4 * sm < rows <= 16 * sm and block_n is None  # o: about one program an SM
        if one_wave:
            bn = next_pow2(triton.cdiv(rows, sm))
    if device.type != "cuda":  # the interpreter: each program costs milliseconds, so two row blocks
        bn = max(bn, next_pow2(triton.cdiv(rows, 2)))  # (split K still makes sm = 4 programs)
    if block_n is not None:
        block_k = max(16, min(block_k, 4096 // next_pow2(block_n)))
    else:
        block_n = bn
    if row_quantum is not None:
        block_n = min(block_n, row_quantum)
        while row_quantum % block_n:
            block_n //= 2
    block_k = min(block_k, next_pow2(k))
    blocks = triton.cdiv(rows, block_n)
    split = 1
    while not one_wave and blocks * split < sm and k // (split * 2) >= min(block_k, 256) and split < 16:
        split *= 2
    block_k = min(block_k, next_pow2(triton.cdiv(k, split)))
    return GemvConfig(block_n, block_k, split, warps, PREFETCH)


def _check(x: torch.Tensor, weight: torch.Tensor, name: str) -> None:
    if x.dim() != 2 or x.shape[0] != 1 or weight.dim() != 2 or weight.shape[1] != x.shape[1]:
        raise ValueError(f"{name} takes one row x [1, K] and a weight [N, K]; got x {tuple(x.shape)}, "
                         f"weight {tuple(weight.shape)}")
    if weight.dtype != x.dtype or weight.device != x.device:
        raise ValueError(f"{name}: the weight is {weight.dtype} on {weight.device}, x is {x.dtype} on "
                         f"{x.device}; they must match")
    if weight.stride(1) != 1 or x.stride(1) != 1:
        raise ValueError(f"{name} needs a weight and x contiguous along K")


def _launch(x, weight, out, rows, cfg: GemvConfig, mode, pair, *, norm_weight=None, eps=1e-6, residual=None,
            rotary=None, kv_write=None, pdl=False, evict=""):
    k = x.shape[1]
    if cfg.split_k < 1 or cfg.block_n < 1 or cfg.block_k < 1:
        raise ValueError(f"a GEMV tile needs positive sizes; got {cfg}")
    if evict not in EVICTION_POLICIES:
        raise ValueError(f"a GEMV's evict must be one of {EVICTION_POLICIES}; got {evict!r}")
    blocks = triton.cdiv(rows, cfg.block_n)
    k_slice = triton.cdiv(k, cfg.split_k)
    if cfg.split_k > 1:
        part = torch.empty(blocks * cfg.split_k * 2 * cfg.block_n, dtype=torch.float32, device=x.device)
        count = counters(x.device, blocks + cfg.block_n, "gemv")
    else:
        part = count = out
    cos, sin, pos, qn, kn, qk_eps, half, rot_rows, q_rows = rotary or (x, x, x, x, x, 0.0, 1, 0, 0)
    kc, vc, slot = kv_write or (x, x, x)
    _gemv_kernel[(blocks, cfg.split_k)](
        x, weight, out, norm_weight if norm_weight is not None else x, residual if residual is not None else x,
        part, count, cos, sin, pos, qn if qn is not None else x, kn if kn is not None else x, kc, vc, slot,
        eps, qk_eps, weight.stride(0), cos.stride(0) if rotary else 0, kc.stride(0) if kv_write else 0,
        kc.stride(1) if kv_write else 0,
        N=(rows if mode != _ROTARY else weight.shape[0]), K=k, KP=next_pow2(k), MODE=mode, PAIR=pair, HALF=half,
        ROT_ROWS=rot_rows, Q_ROWS=q_rows, NORM=norm_weight is not None, RESIDUAL=residual is not None,
        QK_NORM=qn is not None, KV_WRITE=kv_write is not None, D=2 * half, BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k, SPLIT_K=cfg.split_k, K_SLICE=k_slice, PDL=pdl, PREFETCH=cfg.prefetch,
        EVICT=evict, num_warps=cfg.num_warps)


def gemv(x: torch.Tensor, weight: torch.Tensor, *, norm_weight: torch.Tensor | None = None, eps: float = 1e-6,
         residual: torch.Tensor | None = None, silu_mul: bool = False,
         config: GemvConfig | None = None, pdl: bool = False, evict: str = "") -> torch.Tensor:
    """``x @ weight.T`` for one row x [1, K], weight [N, K].

    ``norm_weight`` [K]: RMS-normalise x first (eps). ``residual`` [1, N]: add the product into it
    in place and return it. ``silu_mul``: weight is gate | up [2I, K]; returns silu(gate) * up [1, I].
    ``pdl``: launch with programmatic dependent launch (see ``_launch.pdl_supported``): the kernel may
    start while the previous one finishes, reads its weights, then waits for that kernel. ``evict``:
    the L2 policy of the weights' loads ("", "evict_first" or "evict_last"); it changes no result.
    """
    _check(x, weight, "gemv")
    n, k = weight.shape
    if norm_weight is not None and norm_weight.shape != (k,):
        raise ValueError(f"gemv: norm_weight must be [{k}]; got {tuple(norm_weight.shape)}")
    if silu_mul:
        if residual is not None or n % 2:
            raise ValueError(f"gemv: silu_mul takes gate | up [2I, K] (got N = {n}) and no residual")
        rows, mode, pair = n // 2, _SILU_MUL, n // 2
    else:
        rows, mode, pair = n, _PLAIN, 0
    if residual is not None and (residual.shape != (1, n) or residual.dtype != x.dtype or not residual.is_contiguous()):
        raise ValueError(f"gemv: residual must be a contiguous [1, {n}] {x.dtype}; got "
                         f"{tuple(residual.shape)} {residual.dtype}")
    cfg = config or default_config(rows, k, x.device, paired=silu_mul)
    out = residual if residual is not None else torch.empty(1, rows, dtype=x.dtype, device=x.device)
    _launch(x, weight, out, rows, cfg, mode, pair, norm_weight=norm_weight, eps=eps, residual=residual, pdl=pdl,
            evict=evict)
    return out


def gemv_qkv_rotary(x: torch.Tensor, weight: torch.Tensor, norm_weight: torch.Tensor, eps: float,
                    cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor, num_heads: int,
                    num_kv_heads: int, q_norm: torch.Tensor | None = None, k_norm: torch.Tensor | None = None,
                    qk_eps: float = 1e-6, config: GemvConfig | None = None, pdl: bool = False,
                    kv_cache: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
                    evict: str = "") -> torch.Tensor:
    """The fused q | k | v projection of one token: ``rotary(qk_norm(rms_norm(x) @ weight.T))``.

    weight [(H + 2 * KV) * D, K]; cos/sin tables [max_positions, D]; positions [1]. ``q_norm`` and
    ``k_norm`` [D] (Qwen3) normalise each q and k head first. Returns qkv [1, (H + 2 * KV) * D].
    ``kv_cache`` (k_cache, v_cache, slot): also write the token's key and value into the paged
    caches [num_slots, KV, D] at slot [1] (a negative slot: not written), as write_kv_cache
    would. ``pdl`` as in :func:`gemv`.
    """
    _check(x, weight, "gemv_qkv_rotary")
    d = cos.shape[-1] if cos.dim() == 2 else 0
    heads = num_heads + 2 * num_kv_heads
    if d == 0 or d % 2 or weight.shape[0] != heads * d or sin.shape != cos.shape or cos.stride(1) != 1:
        raise ValueError(f"gemv_qkv_rotary: weight {tuple(weight.shape)} must have (H + 2 KV) * D = "
                         f"{heads} * D rows, with cos/sin contiguous tables [max_positions, D]; got cos "
                         f"{tuple(cos.shape)}")
    if positions.shape != (1,) or norm_weight.shape != (x.shape[1],):
        raise ValueError(f"gemv_qkv_rotary takes one position and norm_weight [{x.shape[1]}]; got positions "
                         f"{tuple(positions.shape)}, norm_weight {tuple(norm_weight.shape)}")
    if (q_norm is None) != (k_norm is None) or (q_norm is not None and (q_norm.shape != (d,) or k_norm.shape != (d,))):
        raise ValueError(f"q_norm and k_norm must both be given, as weights [{d}], or both be None")
    half = d // 2
    if q_norm is not None and half & (half - 1):
        raise ValueError(f"gemv_qkv_rotary with q/k norm needs a power-of-two half head; head_dim is {d}")
    if config is None:  # the q/k norm needs whole heads in a program
        config = default_config(weight.shape[0] // 2, x.shape[1], x.device, paired=True, row_quantum=half,
                                block_n=half if q_norm is not None else None)
    cfg = config
    if q_norm is not None and cfg.block_n != half:
        raise ValueError(f"gemv_qkv_rotary with q/k norm takes whole heads: block_n must be {half}, not "
                         f"{cfg.block_n}")
    if half % cfg.block_n:
        raise ValueError(f"gemv_qkv_rotary: block_n {cfg.block_n} must divide the half head {half}")
    if kv_cache is not None:
        kc, vc, slot = kv_cache
        if kc.dim() != 3 or kc.shape[1:] != (num_kv_heads, d) or vc.shape != kc.shape or kc.stride(-1) != 1 \
                or vc.stride() != kc.stride() or vc.dtype != kc.dtype or not kc.dtype.is_floating_point \
                or slot.shape != (1,) or slot.dtype not in (torch.int32, torch.int64) \
                or {kc.device, vc.device, slot.device} != {x.device}:
            raise ValueError(f"gemv_qkv_rotary: kv_cache takes float caches [num_slots, {num_kv_heads}, {d}] of one "
                             f"dtype with equal strides and an int32/int64 slot [1], all on {x.device}; got "
                             f"{kc.dtype} {tuple(kc.shape)} on {kc.device} / {vc.dtype} {tuple(vc.shape)}, slot "
                             f"{slot.dtype} {tuple(slot.shape)} on {slot.device}")
    out = torch.empty(1, weight.shape[0], dtype=x.dtype, device=x.device)
    rotary = (cos, sin, positions, q_norm, k_norm, qk_eps, half, (num_heads + num_kv_heads) * d, num_heads * d)
    _launch(x, weight, out, weight.shape[0] // 2, cfg, _ROTARY, half, norm_weight=norm_weight, eps=eps,
            rotary=rotary, kv_write=kv_cache, pdl=pdl, evict=evict)
    return out


def _rms_ref(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    h = x.float()
    return w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def gemv_ref(x, weight, *, norm_weight=None, eps=1e-6, residual=None, silu_mul=False, config=None, pdl=False,
             evict=""):
    """Torch reference of :func:`gemv` (the eager layers' arithmetic; any number of rows, so also of
    ``gemv_rows``)."""
    h = _rms_ref(x, norm_weight, eps) if norm_weight is not None else x
    y = F.linear(h, weight)
    if silu_mul:
        gate, up = y.chunk(2, dim=-1)
        return F.silu(gate) * up
    if residual is not None:
        residual.copy_(y + residual)
        return residual
    return y


def gemv_qkv_rotary_ref(x, weight, norm_weight, eps, cos, sin, positions, num_heads, num_kv_heads,
                        q_norm=None, k_norm=None, qk_eps=1e-6, config=None, pdl=False, kv_cache=None, evict=""):
    """Torch reference of :func:`gemv_qkv_rotary` (and of ``gemv_rows_qkv_rotary``: any number of rows)."""
    from deepinfer_kernels.kv_cache import write_kv_cache_ref
    from deepinfer_kernels.rotary import apply_rotary_ref

    d = cos.shape[-1]
    qkv = F.linear(_rms_ref(x, norm_weight, eps), weight)
    q, k, v = qkv.split([num_heads * d, num_kv_heads * d, num_kv_heads * d], dim=-1)
    m = x.shape[0]
    q, k = apply_rotary_ref(q.view(m, num_heads, d), k.view(m, num_kv_heads, d), cos, sin, positions,
                            q_norm, k_norm, qk_eps)
    if kv_cache is not None:
        write_kv_cache_ref(k, v.view(m, num_kv_heads, d), kv_cache[0], kv_cache[1], kv_cache[2])
    return torch.cat([q.reshape(m, -1), k.reshape(m, -1), v], dim=-1)
