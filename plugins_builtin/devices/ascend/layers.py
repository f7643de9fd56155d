"""RMSNorm and rotary embedding through torch-npu's fused ops where present, plain torch otherwise.

Same meaning as the model definitions' RMSNorm (float32 statistics, optional residual added
first) and rotate-half rotary embedding. ``npu`` is the module providing the ops (torch_npu, or a
stand-in in the tests). The model definitions do not call these yet: they need a way to receive
device-specific layer kernels, which deepinfer's plugin API does not offer today.
"""
from __future__ import annotations

from typing import Any

import torch


def rms_norm(npu: Any, x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm of ``x`` (of ``x + residual`` when given, returning the new residual too)."""
    if residual is not None and hasattr(npu, "npu_add_rms_norm"):
        y, _, summed = npu.npu_add_rms_norm(x, residual, weight, epsilon=eps)
        return y, summed
    if residual is not None:
        x = x + residual
        residual = x
    if hasattr(npu, "npu_rms_norm"):
        y = npu.npu_rms_norm(x, weight, epsilon=eps)[0]
    else:
        h = x.float()
        y = (weight.float() * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps))).to(x.dtype)
    return y if residual is None else (y, residual)


def apply_rotary(npu: Any, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                 sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate-half rotary embedding; q [T, H, D], k [T, KVH, D], cos and sin [T, D] (per token)."""
    if hasattr(npu, "npu_rotary_mul"):
        # BSND input (B = 1, S = T) with r1/r2 in the documented 1S1D layout
        r1, r2 = cos[None, :, None, :], sin[None, :, None, :]
        return (npu.npu_rotary_mul(q.unsqueeze(0), r1, r2)[0],
                npu.npu_rotary_mul(k.unsqueeze(0), r1, r2)[0])
    return _rotate(q, cos[:, None], sin[:, None]), _rotate(k, cos[:, None], sin[:, None])


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin
