"""Torch references of the single-token projections in deepinfer_kernels.gemv (the eager layers'
arithmetic)."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def _rms_ref(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    h = x.float()
    return w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def gemv_ref(x, weight, *, norm_weight=None, eps=1e-6, residual=None, silu_mul=False, config=None, pdl=False):
    """Torch reference of :func:`gemv` (the eager layers' arithmetic)."""
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
                        q_norm=None, k_norm=None, qk_eps=1e-6, config=None, pdl=False, kv_cache=None,
                        attention=None):
    """Torch reference of :func:`gemv_qkv_rotary`."""
    from deepinfer_kernels.kv_cache import write_kv_cache_ref
    from deepinfer_kernels.paged_attention import paged_decode_attention_ref
    from deepinfer_kernels.rotary import apply_rotary_ref

    d = cos.shape[-1]
    qkv = F.linear(_rms_ref(x, norm_weight, eps), weight)
    q, k, v = qkv.split([num_heads * d, num_kv_heads * d, num_kv_heads * d], dim=-1)
    q, k = apply_rotary_ref(q.view(1, num_heads, d), k.view(1, num_kv_heads, d), cos, sin, positions,
                            q_norm, k_norm, qk_eps)
    if kv_cache is not None:
        write_kv_cache_ref(k, v.view(1, num_kv_heads, d), kv_cache[0], kv_cache[1], kv_cache[2])
    if attention is not None:
        return paged_decode_attention_ref(q.to(x.dtype), kv_cache[0], kv_cache[1], attention.block_tables,
                                          attention.seq_lens, attention.block_size, attention.scale,
                                          attention.sliding_window)
    return torch.cat([q.reshape(1, -1), k.reshape(1, -1), v], dim=-1)
