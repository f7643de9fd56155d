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

from deepinfer.core.fused_ops import FusedOps
from deepinfer.core.interfaces import AttentionBackend, AttentionLayerSpec
from deepinfer.models.layers import Linear, RMSNorm, one_token_gemv
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
        self.fused_ops: FusedOps | None = None  # set by CausalLM.use_fused_ops
        self.spec = AttentionLayerSpec(layer_idx, h, 1, d.kv_lora_rank + d.qk_rope_head_dim, None, softmax_scale,
                                       value_dim=d.kv_lora_rank)

    @torch.no_grad()
    def rope_rows_to_halves(self) -> None:
        """Reorder the rows that make each head's rope query and the rope key from interleaved pairs
        (x0, x1), (x2, x3) ... to halves (x0, x2, ... | x1, x3, ...), the layout a rotate-half kernel
        takes. Rotating halves then computes what rotating the pairs did, and the query and the key
        move alike, so every dot product is unchanged."""
        d = self.d
        rope = d.qk_rope_head_dim
        perm = torch.cat([torch.arange(0, rope, 2), torch.arange(1, rope, 2)])
        q = self.q_proj if d.q_lora_rank is None else self.q_b_proj
        w = q.weight.view(-1, d.qk_head_dim, q.weight.shape[-1])  # [heads, qk_head_dim, in]
        w[:, d.qk_nope_head_dim:] = w[:, d.qk_nope_head_dim:][:, perm.to(w.device)]
        kv = self.kv_a_proj_with_mqa
        rows = slice(d.kv_lora_rank, d.kv_lora_rank + rope)
        kv.weight[rows] = kv.weight[rows][perm.to(kv.weight.device)]
        if kv.bias is not None:
            kv.bias[rows] = kv.bias[rows][perm.to(kv.bias.device)]

    def _query(self, x: torch.Tensor, gemv) -> torch.Tensor:
        d = self.d
        if gemv is None:
            q = self.q_proj(x) if d.q_lora_rank is None else self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        elif d.q_lora_rank is None:
            q = gemv(x, self.q_proj.weight)
        else:  # (q_a_layernorm inside q_b_proj's kernel)
            norm = self.q_a_layernorm
            q = gemv(gemv(x, self.q_a_proj.weight), self.q_b_proj.weight, norm_weight=norm.weight, eps=norm.eps)
        return q.view(-1, d.num_heads, d.qk_head_dim)

    def _gemv(self, x: torch.Tensor):
        """The device's GEMV for a step of one token through every projection, or None."""
        d = self.d
        lins = [self.kv_a_proj_with_mqa, self.o_proj] + (
            [self.q_proj] if d.q_lora_rank is None else [self.q_a_proj, self.q_b_proj])
        return one_token_gemv(self.fused_ops, x, *lins)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, rotary: LatentRotary, backend: AttentionBackend,
                kv_cache, meta) -> torch.Tensor:
        d = self.d
        gemv = self._gemv(x)
        q_nope, q_pe = self._query(x, gemv).split([d.qk_nope_head_dim, d.qk_rope_head_dim], dim=-1)
        kv_a = self.kv_a_proj_with_mqa(x) if gemv is None else gemv(x, self.kv_a_proj_with_mqa.weight)
        latent, k_pe = kv_a.split([d.kv_lora_rank, d.qk_rope_head_dim], dim=-1)
        q_pe, k_pe = rotary(positions, q_pe, k_pe[:, None])
        # kv_b_proj's rows per head: [W_UK (qk_nope_head_dim rows) | W_UV (v_head_dim rows)], kv_lora_rank columns
        w = self.kv_b_proj.weight.view(d.num_heads, d.qk_nope_head_dim + d.v_head_dim, d.kv_lora_rank)
        w_uk, w_uv = w.split([d.qk_nope_head_dim, d.v_head_dim], dim=1)
        bmm = getattr(self.kv_b_proj.linear_op, "batched", torch.bmm)  # (the device's, where it has one)
        q_latent = bmm(q_nope.transpose(0, 1), w_uk).transpose(0, 1)                  # [T, H, kv_lora_rank]
        query = torch.cat([q_latent, q_pe], dim=-1)
        key = torch.cat([self.kv_a_layernorm(latent), k_pe[:, 0]], dim=-1)[:, None]     # [T, 1, rank + rope]
        out = backend.forward(self.spec, query, key, None, kv_cache, meta)             # [T, H, kv_lora_rank]
        out = bmm(out.transpose(0, 1), w_uv.transpose(1, 2)).transpose(0, 1)           # [T, H, v_head_dim]
        out = out.reshape(-1, d.num_heads * d.v_head_dim)
        return self.o_proj(out) if gemv is None else gemv(out, self.o_proj.weight)
