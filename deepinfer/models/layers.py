"""Building blocks shared by the model definitions: RMSNorm, rotary embedding, linear layer, gated MLP."""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from deepinfer.core.fused_ops import FusedOps


class RMSNorm(nn.Module):
    """RMSNorm computed in float32, optionally adding a residual first (returns the new residual)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.fused_ops: FusedOps | None = None  # set by CausalLM.use_fused_ops

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if self.fused_ops is not None:
            return self.fused_ops.rms_norm(x, self.weight, self.eps, residual)
        if residual is not None:
            x = x + residual
            residual = x
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        out = self.weight * h.to(dtype)
        return out if residual is None else (out, residual)


def rope_inv_freq(head_dim: int, theta: float, scaling: dict[str, Any] | None) -> torch.Tensor:
    """Inverse frequencies of rotary embedding, with the scaling types deepinfer supports (on the
    CPU, whatever the default device: a model is built on the meta device)."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim))
    if not scaling:
        return inv
    kind = scaling["rope_type"]
    if kind == "linear":
        return inv / float(scaling["factor"])
    if kind == "llama3":
        factor = float(scaling["factor"])
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        old_len = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        # long wavelengths are divided by factor, short kept, the band between interpolated
        scaled = torch.where(wavelen > old_len / low, inv / factor, inv)
        smooth = (old_len / wavelen - low) / (high - low)
        blended = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        return torch.where(medium, blended, scaled)
    raise ValueError(f"rope type {kind!r} is not supported; supported: default, linear, llama3")


class RotaryEmbedding(nn.Module):
    """Rotate-half rotary embedding over a cos/sin table built for every position up front."""

    def __init__(self, head_dim: int, max_positions: int, theta: float,
                 scaling: dict[str, Any] | None) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.max_positions = max_positions
        self.theta = theta
        self.scaling = scaling
        rope_inv_freq(head_dim, theta, scaling)  # reject unsupported scaling at construction
        self.cos: torch.Tensor | None = None
        self.sin: torch.Tensor | None = None
        self.fused_ops: FusedOps | None = None

    def build(self, device: torch.device, dtype: torch.dtype) -> None:
        inv = rope_inv_freq(self.head_dim, self.theta, self.scaling)
        pos = torch.arange(self.max_positions, dtype=torch.float32)
        freqs = torch.outer(pos, inv)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.cos = emb.cos().to(device=device, dtype=dtype)
        self.sin = emb.sin().to(device=device, dtype=dtype)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                q_norm: RMSNorm | None = None, k_norm: RMSNorm | None = None):
        """Rotated q and k; with ``q_norm`` and ``k_norm``, each head is normalised first."""
        if q_norm is not None and (self.fused_ops is None or q_norm.eps != k_norm.eps):
            q, k = q_norm(q), k_norm(k)  # the fused kernel takes one eps for both
            q_norm = k_norm = None
        if self.fused_ops is not None:
            if q_norm is None:
                return self.fused_ops.apply_rotary(q, k, self.cos, self.sin, positions)
            return self.fused_ops.apply_rotary(q, k, self.cos, self.sin, positions, q_norm.weight, k_norm.weight,
                                               q_norm.eps)
        cos = self.cos[positions].unsqueeze(1)
        sin = self.sin[positions].unsqueeze(1)
        return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class Linear(nn.Linear):
    """``nn.Linear`` whose matmul a device may replace (``CausalLM.use_linear_op``), or whose weight
    may be block-scaled FP8 run through the device's FP8 GEMM (``quantize_fp8``)."""

    linear_op: Callable[..., torch.Tensor] | None = None
    fp8_op: Callable[..., torch.Tensor] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fp8_op is not None:
            out = self.fp8_op(x, self.weight, self.weight_scale_inv)
            return out if self.bias is None else out + self.bias
        if self.linear_op is None:
            return F.linear(x, self.weight, self.bias)
        return self.linear_op(x, self.weight, self.bias)

    def quantize_fp8(self, op: Callable[..., torch.Tensor] | None) -> None:
        """The weight in 128x128 blocks of float8 e4m3 with their scales: kept so and run through
        ``op`` (the device's ``fp8_block_linear``; a new tensor, so only before device graphs are
        captured), or without one put back in its dtype (FP8's values), in place: graphs captured
        already keep reading the weight's storage (replacing it left them reading freed memory,
        NaN logprobs in a GPU test)."""
        from deepinfer_kernels.fp8_gemm import block_quantize_fp8, dequantize_block_fp8

        w = self.weight.data
        q, scale_inv = block_quantize_fp8(w)
        if op is None:
            w.copy_(dequantize_block_fp8(q, scale_inv, w.dtype))
            return
        self.weight = nn.Parameter(q, requires_grad=False)
        self.register_buffer("weight_scale_inv", scale_inv, persistent=False)
        self.fp8_op = op


def one_token_gemv(ops: FusedOps | None, x: torch.Tensor, *linears: Linear) -> Callable[..., torch.Tensor] | None:
    """The device's GEMV (``FusedOps.gemv``) where a step of one token can take it through all of
    ``linears``: x one contiguous row, plain ``Linear`` layers (not a row-parallel one, whose sum
    crosses ranks) with weights in x's dtype (not FP8) and no biases; else None."""
    gemv = getattr(ops, "gemv", None)
    if gemv is None or x.dim() != 2 or x.shape[0] != 1 or x.stride(-1) != 1:
        return None
    if any(type(lin) is not Linear or lin.fp8_op is not None or lin.bias is not None or lin.weight.dtype != x.dtype
           for lin in linears):
        return None
    return gemv


class GatedMLP(nn.Module):
    """SiLU(gate) * up -> down, with gate and up fused into one matmul."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.intermediate = intermediate
        self.gate_up_proj = Linear(hidden, 2 * intermediate, bias=False)
        self.down_proj = Linear(intermediate, hidden, bias=False)
        self.fused_ops: FusedOps | None = None

    def forward(self, x: torch.Tensor, add_to: torch.Tensor | None = None) -> torch.Tensor:
        """The MLP of x; with ``add_to``, ``add_to`` + it (for a step of one token on a device with a
        GEMV, added into ``add_to`` in place by the down projection's kernel)."""
        if add_to is not None:
            gemv = one_token_gemv(self.fused_ops, x, self.gate_up_proj, self.down_proj)
            if gemv is None or not add_to.is_contiguous():
                return add_to + self.forward(x)
            return gemv(gemv(x, self.gate_up_proj.weight, silu_mul=True), self.down_proj.weight, residual=add_to)
        if self.fused_ops is not None:
            return self.down_proj(self.fused_ops.silu_and_mul(self.gate_up_proj(x)))
        gate, up = self.gate_up_proj(x).split(self.intermediate, dim=-1)
        return self.down_proj(F.silu(gate) * up)
