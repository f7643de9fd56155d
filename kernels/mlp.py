"""A single token's whole gated MLP in one kernel: ``x += down(silu(gate(n)) * up(n))``, n = rms_norm(x).

The chain of two GEMVs (gate/up with SiLU-mul, then down with the residual add) has a kernel
boundary between them: down's programs may read their weights early under PDL, but none can
multiply before every gate/up program has finished, and down's own launch ramps up and drains.
Here each program owns a slice of the intermediate dimension instead: it computes its
``block_i`` channels of silu(gate) * up (reading those rows of gate and up over all of K), then
multiplies them by the matching columns of down, giving a partial of the whole output row. Nothing
waits for another program until the end; the weights stream without a break.

The partials [programs, N] (float32) are summed at the end by the last ``reducers`` programs to
finish (an atomic ticket): each takes a block of the output's columns, waits until every program
has stored its partial, sums the partials column by column (16 columns of every program's partial
at once), rounds, adds the residual and stores. The sums' order never depends on which programs
finished last or how many reduce, so the result is the same bits for any ``reducers``. Waiting needs every program to be resident at once or to
have finished; the reducers are the last tickets, so at most ``reducers - 1`` other programs are
still running or unstarted while they wait (``reducers`` must be at most half the SMs). The Triton
interpreter runs programs one after another, so there a single reducer (the last program, which
never waits) is used.

Rounding follows the eager layers (as :mod:`gemv`): gate and up round to the dtype, then SiLU, then
the product; down's output rounds once before ``x + y`` rounds again.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from deepinfer_kernels._launch import counters, kernel, next_pow2, triton_interpreted
from deepinfer_kernels.gemv import EVICTION_POLICIES, _rms_ref, _sm_count


@kernel
def _mlp_kernel(x_ptr, gu_ptr, dn_ptr, nw_ptr, part_ptr, count_ptr, eps, stride_gu, stride_dn, stride_di,
                K: tl.constexpr, KP: tl.constexpr, I: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_K: tl.constexpr,
                BLOCK_N: tl.constexpr, PROGRAMS: tl.constexpr, PP: tl.constexpr, REDUCERS: tl.constexpr,
                COLS: tl.constexpr, CW: tl.constexpr, PDL: tl.constexpr, EVICT_GU: tl.constexpr, EVICT_DN: tl.constexpr):
    b = tl.program_id(0)
    ty = x_ptr.dtype.element_ty
    ci = b * BLOCK_I + tl.arange(0, BLOCK_I)  # this program's intermediate channels
    imask = ci < I
    g_rows = gu_ptr + ci.to(tl.int64)[:, None] * stride_gu
    u_rows = gu_ptr + (ci + I).to(tl.int64)[:, None] * stride_gu
    kr = tl.arange(0, BLOCK_K)
    # the first tile of gate and up before the wait: weights never depend on the previous kernel
    m2 = imask[:, None] & (kr < K)[None, :]
    wg = tl.load(g_rows + kr[None, :], mask=m2, other=0.0, eviction_policy=EVICT_GU)
    wu = tl.load(u_rows + kr[None, :], mask=m2, other=0.0, eviction_policy=EVICT_GU)
    # and down's first rows for these channels, held until gate and up are done
    nr = tl.arange(0, BLOCK_N)
    d_cols = dn_ptr + ci.to(tl.int64)[None, :] * stride_di
    wd = tl.load(d_cols + nr.to(tl.int64)[:, None] * stride_dn, mask=(nr < K)[:, None] & imask[None, :], other=0.0,
                 eviction_policy=EVICT_DN)
    if PDL:
        tl.extra.cuda.gdc_wait()  # x and the counters are the previous kernel's
        tl.extra.cuda.gdc_launch_dependents()
    xs = tl.arange(0, KP)
    xf = tl.load(x_ptr + xs, mask=xs < K, other=0.0).to(tl.float32)
    inv = tl.rsqrt(tl.sum(xf * xf, 0) / K + eps)
    acc_g = tl.zeros([BLOCK_I, BLOCK_K], tl.float32)
    acc_u = tl.zeros([BLOCK_I, BLOCK_K], tl.float32)
    for k0 in range(0, K, BLOCK_K):  # gate and up over K, each tile loaded one step ahead
        kk = k0 + kr
        kmask = kk < K
        nk = kk + BLOCK_K
        nm2 = imask[:, None] & (nk < K)[None, :]
        wg_next = tl.load(g_rows + nk[None, :], mask=nm2, other=0.0, eviction_policy=EVICT_GU)
        wu_next = tl.load(u_rows + nk[None, :], mask=nm2, other=0.0, eviction_policy=EVICT_GU)
        xk = tl.load(x_ptr + kk, mask=kmask, other=0.0).to(tl.float32)
        wn = tl.load(nw_ptr + kk, mask=kmask, other=0.0).to(tl.float32)
        xk = ((xk * inv).to(ty).to(tl.float32) * wn).to(ty).to(tl.float32)
        acc_g += wg.to(tl.float32) * xk[None, :]
        acc_u += wu.to(tl.float32) * xk[None, :]
        wg = wg_next
        wu = wu_next
    g = tl.sum(acc_g, 1).to(ty).to(tl.float32)
    u = tl.sum(acc_u, 1).to(ty).to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(ty).to(tl.float32)
    h = tl.where(imask, (act * u).to(ty).to(tl.float32), 0.0)
    # down's columns for these channels (each tile loaded one step ahead): a partial of the whole
    # output row
    mine = part_ptr + b * COLS * REDUCERS
    for n0 in range(0, COLS * REDUCERS, BLOCK_N):
        nn = n0 + nr
        nx = nn + BLOCK_N
        wd_next = tl.load(d_cols + nx.to(tl.int64)[:, None] * stride_dn, mask=(nx < K)[:, None] & imask[None, :],
                          other=0.0, eviction_policy=EVICT_DN)
        tl.store(mine + nn, tl.sum(wd.to(tl.float32) * h[None, :], 1), mask=nn < K)
        wd = wd_next
    tl.debug_barrier()  # every warp's partial is stored before the release below
    ticket = tl.atomic_add(count_ptr, 1, sem="acq_rel")
    if ticket >= PROGRAMS - REDUCERS:  # one of the last to finish: reduce a block of columns
        seen = ticket + 1
        while seen < PROGRAMS:  # every program has stored its partial once the ticket count is full
            seen = tl.atomic_add(count_ptr, 0, sem="acquire")
        pr = tl.arange(0, PP)
        for c0 in tl.static_range(0, COLS, CW):  # chunks of a fixed width: the same bits whoever reduces
            c = (ticket - (PROGRAMS - REDUCERS)) * COLS + c0 + tl.arange(0, CW)
            cmask = c < K
            r = tl.load(x_ptr + c, mask=cmask, other=0.0).to(tl.float32)
            t = tl.load(part_ptr + pr[:, None] * (COLS * REDUCERS) + c[None, :],
                        mask=(pr < PROGRAMS)[:, None] & cmask[None, :], other=0.0, cache_modifier=".cg")
            y = tl.sum(t, 0).to(ty).to(tl.float32)
            tl.store(x_ptr + c, (y + r).to(ty), mask=cmask)
        # the last reducer through resets both counters for the next launch (the others have
        # stopped reading the first)
        done = tl.atomic_add(count_ptr + 1, 1, sem="acq_rel")
        zero = tl.zeros([2], tl.int32)
        tl.store(count_ptr + tl.arange(0, 2), zero, mask=(zero + done) == REDUCERS - 1)


_CHUNK = 16  # columns a reducer sums at once (fixed: the sums' order must not depend on the reducers)


@dataclass(frozen=True)
class MlpConfig:
    """``block_i`` intermediate channels a program (gate and up rows, down columns), ``block_k``
    columns of gate/up a loop step, ``block_n`` rows of down a loop step, ``reducers`` programs
    summing the partials (compiled launches only; the interpreter uses one)."""

    block_i: int
    block_k: int
    block_n: int
    reducers: int
    num_warps: int = 8


def default_mlp_config(inter: int, k: int, device: torch.device) -> MlpConfig:
    """The tile for an intermediate size ``inter`` over hidden size ``k``: about two programs an SM,
    each reading ``block_i`` channels (H200 sweep, docs/benchmarks.md)."""
    sm = _sm_count(device)
    bi = max(4, min(64, next_pow2(triton.cdiv(inter, 2 * sm))))
    programs = triton.cdiv(inter, bi)
    return MlpConfig(bi, min(next_pow2(k), max(32, 4096 // bi)), min(next_pow2(k), max(32, 8192 // bi)),
                     max(1, min(32, sm // 2, programs)), 8)


def gemv_mlp(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, norm_weight: torch.Tensor, eps: float = 1e-6,
             *, config: MlpConfig | None = None, pdl: bool = False, evict: tuple[str, str] = ("", "")) -> torch.Tensor:
    """One token's gated MLP with its input norm and residual add, in place on the stream x [1, K]:
    ``x += down(silu(gate) * up)`` with gate | up = ``rms_norm(x) @ gate_up.T``. gate_up [2I, K]
    (contiguous along K), down [K, I] (either dimension contiguous: a transposed layout reads each
    program's columns as whole rows). ``pdl`` as in :func:`gemv`; ``evict``: the L2 policies of
    gate/up's and down's loads. Returns x."""
    if x.dim() != 2 or x.shape[0] != 1 or not x.is_contiguous():
        raise ValueError(f"gemv_mlp takes the stream as one contiguous row [1, K]; got {tuple(x.shape)}")
    k = x.shape[1]
    if gate_up.dim() != 2 or gate_up.shape[1] != k or gate_up.shape[0] % 2 or gate_up.stride(1) != 1:
        raise ValueError(f"gemv_mlp: gate_up must be gate | up [2I, {k}], contiguous along K; got "
                         f"{tuple(gate_up.shape)} with strides {gate_up.stride()}")
    inter = gate_up.shape[0] // 2
    if down.shape != (k, inter) or 1 not in down.stride():
        raise ValueError(f"gemv_mlp: down must be [{k}, {inter}] with one dimension contiguous; got "
                         f"{tuple(down.shape)} with strides {down.stride()}")
    if norm_weight.shape != (k,):
        raise ValueError(f"gemv_mlp: norm_weight must be [{k}]; got {tuple(norm_weight.shape)}")
    if {gate_up.dtype, down.dtype} != {x.dtype} or {gate_up.device, down.device, norm_weight.device} != {x.device}:
        raise ValueError(f"gemv_mlp: gate_up {gate_up.dtype} on {gate_up.device} and down {down.dtype} on "
                         f"{down.device} must match x, {x.dtype} on {x.device}")
    if any(e not in EVICTION_POLICIES for e in evict):
        raise ValueError(f"gemv_mlp's evict takes two of {EVICTION_POLICIES}; got {evict!r}")
    cfg = config or default_mlp_config(inter, k, x.device)
    sizes = (cfg.block_i, cfg.block_k, cfg.block_n)
    programs = triton.cdiv(inter, max(1, cfg.block_i))
    reducers = 1 if triton_interpreted() else cfg.reducers
    if min(sizes) < 1 or any(v & (v - 1) for v in sizes) or cfg.reducers < 1 or reducers > programs or (
            x.is_cuda and 2 * reducers > _sm_count(x.device)):
        raise ValueError(f"gemv_mlp: {cfg} needs block sizes that are powers of two and 1 to {programs} "
                         f"reducers (the programs), at most half the SMs")
    cols = max(_CHUNK, next_pow2(triton.cdiv(k, reducers)))
    part = torch.empty(programs * cols * reducers, dtype=torch.float32, device=x.device)
    count = counters(x.device, 2, "mlp")
    _mlp_kernel[(programs,)](
        x, gate_up, down, norm_weight, part, count, eps, gate_up.stride(0), down.stride(0), down.stride(1),
        K=k, KP=next_pow2(k), I=inter, BLOCK_I=cfg.block_i, BLOCK_K=cfg.block_k,
        BLOCK_N=cfg.block_n, PROGRAMS=programs, PP=next_pow2(programs), REDUCERS=reducers, COLS=cols, CW=_CHUNK, PDL=pdl,
        EVICT_GU=evict[0], EVICT_DN=evict[1], num_warps=cfg.num_warps)
    return x


def gemv_mlp_ref(x, gate_up, down, norm_weight, eps=1e-6, *, config=None, pdl=False, evict=("", "")):
    """Torch reference of :func:`gemv_mlp` (the eager layers' arithmetic)."""
    gate, up = F.linear(_rms_ref(x, norm_weight, eps), gate_up).chunk(2, dim=-1)
    x.copy_(F.linear(F.silu(gate) * up, down) + x)
    return x
