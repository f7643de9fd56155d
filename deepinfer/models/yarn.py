"""Rotary embedding of DeepSeek's multi-head latent attention: YaRN scaling with its two attention
factors, over interleaved (x0, x1), (x2, x3) ... pairs or rotate-half halves."""
from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from deepinfer.core.fused_ops import FusedOps
from deepinfer.models.layers import rope_inv_freq


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction for a context stretched ``factor`` times (1 when not stretched)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _yarn_inv_freq(dim: int, theta: float, scaling: dict[str, Any], factor: float) -> torch.Tensor:
    """Frequencies that make few rotations over the original context are interpolated (divided by
    ``factor``), those that make many are kept, with a linear ramp between (YaRN's NTK-by-parts)."""
    old_len = float(scaling["original_max_position_embeddings"])
    fast, slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1

    def dim_of(rotations: float) -> float:  # the pair index that turns ``rotations`` times over old_len
        return dim * math.log(old_len / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dim_of(fast), dim_of(slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    base = theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    keep = 1 - ramp  # 1: the original frequency; 0: interpolated
    return (1 / (factor * base)) * ramp + (1 / base) * keep


class LatentRotary(nn.Module):
    """The rotary embedding of MLA's rope dims, with the scalings DeepSeek configs use: none, yarn
    (and linear or llama3 as the Llama family has them). ``softmax_scale`` is the attention scale
    for query/key heads of ``qk_head_dim``, with YaRN's mscale_all_dim folded in as DeepSeek does."""

    def __init__(self, dim: int, max_positions: int, theta: float, scaling: dict[str, Any] | None,
                 interleaved: bool, qk_head_dim: int) -> None:
        super().__init__()
        self.dim, self.max_positions, self.theta, self.interleaved = dim, max_positions, theta, interleaved
        self.scaling = scaling or {}
        self.attention_factor = 1.0  # multiplies cos and sin (so both rotated q and k)
        self.softmax_scale = qk_head_dim ** -0.5
        kind = self.scaling.get("rope_type", "default")
        if kind == "yarn":
            s = self.scaling
            self.factor = float(s.get("factor") or max_positions / float(s["original_max_position_embeddings"]))
            mscale, mscale_all = s.get("mscale"), s.get("mscale_all_dim")
            if s.get("attention_factor") is not None:
                self.attention_factor = float(s["attention_factor"])
            elif mscale and mscale_all:
                self.attention_factor = yarn_mscale(self.factor, mscale) / yarn_mscale(self.factor, mscale_all)
            else:
                self.attention_factor = yarn_mscale(self.factor)
        elif kind in ("default", "linear", "llama3"):
            rope_inv_freq(dim, theta, scaling)  # (checks the fields)
        else:
            raise ValueError(f"rope type {kind!r} is not supported for multi-head latent attention; supported: "
                             "default, yarn, linear, llama3")
        if kind != "default" and self.scaling.get("mscale_all_dim"):
            self.softmax_scale *= yarn_mscale(float(self.scaling["factor"]), self.scaling["mscale_all_dim"]) ** 2
        self.cos: torch.Tensor | None = None
        self.sin: torch.Tensor | None = None
        #: the device's fused kernels (``use_fused_ops``): with them, a layout of halves is rotated by
        #: ``apply_rotary`` in one kernel, over the tables [max_positions, dim] below
        self.fused_ops: FusedOps | None = None
        self.cos_full: torch.Tensor | None = None
        self.sin_full: torch.Tensor | None = None

    def build(self, device: torch.device) -> None:
        """float32 tables [max_positions, dim / 2], the attention factor in (computed on the CPU)."""
        with torch.device("cpu"):
            if self.scaling.get("rope_type") == "yarn":
                inv = _yarn_inv_freq(self.dim, self.theta, self.scaling, self.factor)
            else:
                inv = rope_inv_freq(self.dim, self.theta, self.scaling or None)
            freqs = torch.outer(torch.arange(self.max_positions, dtype=torch.float32), inv)
        self.cos = (freqs.cos() * self.attention_factor).to(device)
        self.sin = (freqs.sin() * self.attention_factor).to(device)

    def use_fused_ops(self, ops: FusedOps | None, dtype: torch.dtype) -> None:
        """Rotate through ``ops.apply_rotary`` (a layout of halves only), over [max_positions, dim]
        tables in ``dtype``, rounded from the float32 ones as transformers rounds cos and sin to
        the query's dtype."""
        self.fused_ops = ops
        full = ops is not None and not self.interleaved
        self.cos_full = torch.cat([self.cos, self.cos], dim=-1).to(dtype) if full else None
        self.sin_full = torch.cat([self.sin, self.sin], dim=-1).to(dtype) if full else None

    def forward(self, positions: torch.Tensor, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Each x [T, heads, dim] rotated at ``positions``, computed in float32. The result is laid
        out as rotate-half halves (first elements of the pairs, then second ones) whatever the
        input's layout: a query and a key laid out alike give the same dot product."""
        if self.cos_full is not None and len(xs) == 2:
            return self.fused_ops.apply_rotary(*xs, self.cos_full, self.sin_full, positions)
        cos, sin = self.cos[positions][:, None], self.sin[positions][:, None]
        out = []
        for x in xs:
            h = x.float()
            a, b = (h[..., 0::2], h[..., 1::2]) if self.interleaved else h.chunk(2, dim=-1)
            out.append(torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1).to(x.dtype))
        return tuple(out)
