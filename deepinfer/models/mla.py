"""Multi-head latent attention (DeepSeek-V2/V3) in its absorbed form, over a latent KV cache.

Each token caches one vector: its normalised KV latent c (kv_lora_rank dims) followed by its
rotated rope key k_pe (qk_rope_head_dim dims). Head h's no-rope key is W_UK[h] c and its value
W_UV[h] c (``kv_b_proj``), so q_nope . W_UK[h] c = (W_UK[h]^T q_nope) . c: with the query
[W_UK[h]^T q_nope | q_pe] attention is multi-query attention with one KV head whose key is
[c | k_pe] and whose value is c, the key's first kv_lora_rank dims (``AttentionLayerSpec.value_dim``).
Its output per head, a combination of latents, goes through W_UV[h], then ``o_proj``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from deepinfer.core.interfaces import AttentionBackend, AttentionLayerSpec
from deepinfer.models.layers import Linear, RMSNorm
from deepinfer.models.yarn import LatentRotary

#: the latents' RMSNorm epsilon (DeepSeek's and transformers' q_a_layernorm and kv_a_layernorm take
#: the default, not rms_norm_eps)
LATENT_NORM_EPS = 1e-6


@dataclass(frozen=True, slots=True)
class MLADims:
    """The head and latent sizes of a DeepSeek attention layer, as config.json names them."""

    hidden_size: int
    num_heads: int
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    bias: bool = False

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


class MLAttention(nn.Module):
    """Projections to the query and the latent, the rope dims' rotation, attention over the latent
    cache through the backend, and the value and output projections."""

    def __init__(self, d: MLADims, layer_idx: int, softmax_scale: float) -> None:
        super().__init__()
        self.d = d
        h = d.num_heads
        if d.q_lora_rank is None:
            self.q_proj = Linear(d.hidden_size, h * d.qk_head_dim, bias=False)
        else:
            self.q_a_proj = Linear(d.hidden_size, d.q_lora_rank, bias=d.bias)
            self.q_a_layernorm = RMSNorm(d.q_lora_rank, LATENT_NORM_EPS)
            self.q_b_proj = Linear(d.q_lora_rank, h * d.qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = Linear(d.hidden_size, d.kv_lora_rank + d.qk_rope_head_dim, bias=d.bias)
        self.kv_a_layernorm = RMSNorm(d.kv_lora_rank, LATENT_NORM_EPS)
        self.kv_b_proj = Linear(d.kv_lora_rank, h * (d.qk_nope_head_dim + d.v_head_dim), bias=False)
        self.o_proj = Linear(h * d.v_head_dim, d.hidden_size, bias=d.bias)
        self.spec = AttentionLayerSpec(layer_idx, h, 1, d.kv_lora_rank + d.qk_rope_head_dim, None, softmax_scale,
                                       value_dim=d.kv_lora_rank)

    def _query(self, x: torch.Tensor) -> torch.Tensor:
        d = self.d
        q = self.q_proj(x) if d.q_lora_rank is None else self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        return q.view(-1, d.num_heads, d.qk_head_dim)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, rotary: LatentRotary, backend: AttentionBackend,
                kv_cache, meta) -> torch.Tensor:
        d = self.d
        q_nope, q_pe = self._query(x).split([d.qk_nope_head_dim, d.qk_rope_head_dim], dim=-1)
        latent, k_pe = self.kv_a_proj_with_mqa(x).split([d.kv_lora_rank, d.qk_rope_head_dim], dim=-1)
        q_pe, k_pe = rotary(positions, q_pe, k_pe[:, None])
        # kv_b_proj's rows per head: [W_UK (qk_nope_head_dim rows) | W_UV (v_head_dim rows)], kv_lora_rank columns
        w = self.kv_b_proj.weight.view(d.num_heads, d.qk_nope_head_dim + d.v_head_dim, d.kv_lora_rank)
        w_uk, w_uv = w.split([d.qk_nope_head_dim, d.v_head_dim], dim=1)
        q_latent = torch.bmm(q_nope.transpose(0, 1), w_uk).transpose(0, 1)            # [T, H, kv_lora_rank]
        query = torch.cat([q_latent, q_pe], dim=-1)
        key = torch.cat([self.kv_a_layernorm(latent), k_pe[:, 0]], dim=-1)[:, None]     # [T, 1, rank + rope]
        out = backend.forward(self.spec, query, key, None, kv_cache, meta)             # [T, H, kv_lora_rank]
        out = torch.bmm(out.transpose(0, 1), w_uv.transpose(1, 2)).transpose(0, 1)     # [T, H, v_head_dim]
        return self.o_proj(out.reshape(-1, d.num_heads * d.v_head_dim))
