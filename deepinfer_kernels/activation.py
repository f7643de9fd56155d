"""SiLU-and-multiply: x [T, 2I] = gate | up  ->  silu(gate) * up  [T, I].

Rounding follows the eager ``F.silu(gate) * up``: silu is computed in float32 and rounded to x's
dtype, then the product is rounded again.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_kernels._launch import kernel, next_pow2


@kernel
def _silu_and_mul_kernel(x_ptr, out_ptr, stride_xt, inter, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    ty = out_ptr.dtype.element_ty
    gate = tl.load(x_ptr + t * stride_xt + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + t * stride_xt + inter + cols, mask=mask, other=0.0).to(tl.float32)
    act = (gate / (1.0 + tl.exp(-gate))).to(ty).to(tl.float32)
    tl.store(out_ptr + t * inter + cols, (act * up).to(ty), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """silu(x[:, :I]) * x[:, I:] for x [T, 2I]; returns a contiguous [T, I] in x's dtype."""
    if x.dim() != 2 or x.shape[1] % 2:
        raise ValueError(f"silu_and_mul takes [T, 2 * intermediate]; got {tuple(x.shape)}")
    if x.stride(-1) != 1:
        x = x.contiguous()
    t, inter = x.shape[0], x.shape[1] // 2
    out = torch.empty(t, inter, dtype=x.dtype, device=x.device)
    block = min(1024, next_pow2(inter))
    if t and inter:
        _silu_and_mul_kernel[(t, triton.cdiv(inter, block))](x, out, x.stride(0), inter, BLOCK=block, num_warps=4)
    return out


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """Torch reference of :func:`silu_and_mul`."""
    gate, up = x.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up
