"""The Llama family: Llama, Mistral, Qwen2 (qkv bias) and Qwen3 (q/k norm, hybrid sliding window)."""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from deepinfer.core.capabilities import FusedKVWrite
from deepinfer.core.fused_ops import FusedOps
from deepinfer.core.interfaces import AttentionBackend, AttentionLayerSpec
from deepinfer.core.loader import WeightsError
from deepinfer.core.model_config import ModelConfig
from deepinfer.core.model_registry import CausalLM
from deepinfer.models.layers import GatedMLP, Linear, RMSNorm, RotaryEmbedding
from deepinfer.models.parallel_layers import (
    RowParallelLinear,
    VocabParallelEmbedding,
    kv_head_shard,
    parallel_logits,
    vocab_shard,
)
from deepinfer.parallel.state import TensorParallel, tensor_parallel


class Attention(nn.Module):
    """Fused qkv projection, optional q/k RMSNorm, rotary embedding, paged attention, output."""

    def __init__(self, cfg: ModelConfig, spec: AttentionLayerSpec, bias: bool, qk_norm: bool,
                 tp: TensorParallel) -> None:
        super().__init__()
        self.spec = spec  # (this rank's heads: with tensor parallelism, a share of the model's)
        h, kv, d = spec.num_heads, spec.num_kv_heads, spec.head_dim
        self.q_size, self.kv_size = h * d, kv * d
        self.qkv_proj = Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=bias)
        self.o_proj = Linear(self.q_size, cfg.hidden_size, bias=False) if tp.size == 1 else \
            RowParallelLinear(self.q_size, cfg.hidden_size, tp)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps) if qk_norm else None
        #: the backend's ``fused_kv_write`` where it has one (FusedKVWrite; set by the model)
        self.kv_write: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None] | None = None

    def forward(self, x, positions, rotary, backend: AttentionBackend, kv_cache, meta):
        s = self.spec
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(-1, s.num_heads, s.head_dim)
        k = k.view(-1, s.num_kv_heads, s.head_dim)
        v = v.view(-1, s.num_kv_heads, s.head_dim)
        q, k = rotary(positions, q, k, self.q_norm, self.k_norm)  # q/k norms (Qwen3) fused in where possible
        out = backend.forward(s, q, k, v, kv_cache, meta)
        return self.o_proj(out.reshape(-1, self.q_size))

    def forward_one(self, ops: FusedOps, residual, norm: RMSNorm, positions, rotary, backend, kv_cache, meta):
        """One token (or a few, where the device's ``takes_rows``), through the device's GEMV
        kernels: the input norm, the q/k norms and the rotary embedding ride in the qkv projection;
        returns the attention output [M, H * D]."""
        s = self.spec
        # the backend may let the qkv kernel write the key and value into its cache directly
        cache = None if self.kv_write is None else self.kv_write(s, kv_cache, meta)
        qkv = ops.gemv_qkv_rotary(residual, self.qkv_proj.weight, norm.weight, norm.eps, rotary.cos, rotary.sin,
                                  positions, s.num_heads, s.num_kv_heads,
                                  self.q_norm.weight if self.q_norm is not None else None,
                                  self.k_norm.weight if self.k_norm is not None else None,
                                  self.q_norm.eps if self.q_norm is not None else 1e-6,
                                  **({} if cache is None else {"kv_cache": cache}))
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if cache is None:
            k, v = k.view(-1, s.num_kv_heads, s.head_dim), v.view(-1, s.num_kv_heads, s.head_dim)
        else:
            k = v = None
        out = backend.forward(s, q.view(-1, s.num_heads, s.head_dim), k, v, kv_cache, meta)
        return out.reshape(-1, self.q_size).contiguous()


def _takes_rows(ops: FusedOps | None, rows: int, head_dim: int | None, weights: int) -> bool:
    """Whether the device's GEMVs take a step of ``rows`` tokens (a few, on a CUDA device, of a
    small enough model) through projections of at most ``weights`` weights."""
    takes = getattr(ops, "takes_rows", None)
    return takes is not None and takes(rows, head_dim, weights)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, spec: AttentionLayerSpec, bias: bool, qk_norm: bool,
                 tp: TensorParallel) -> None:
        super().__init__()
        self.self_attn = Attention(cfg, spec, bias, qk_norm, tp)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size // tp.size)
        if tp.size > 1:  # gate/up column-parallel (a plain Linear of this rank's columns), down row-parallel
            self.mlp.down_proj = RowParallelLinear(cfg.intermediate_size // tp.size, cfg.hidden_size, tp)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        # the single-token GEMV path: no qkv bias; q/k norms (both built with rms_norm_eps: one
        # eps) over whole heads of a power-of-two half (one program holds a head)
        half = spec.head_dim // 2
        # (the GEMVs add the projections into the residual: no room for a row-parallel all-reduce)
        self.gemv_ok = not bias and (not qk_norm or half & (half - 1) == 0) and tp.size == 1
        self.most_weights = max(p.weight.numel() for p in (self.self_attn.qkv_proj, self.self_attn.o_proj,
                                                           self.mlp.gate_up_proj, self.mlp.down_proj))

    def forward(self, x, residual, positions, rotary, backend, kv_cache, meta):
        """(x, residual) in and out, as Hugging Face's layers pass them. x None: x is already added
        into residual (the single-token path leaves it so; the next layer or the final norm reads
        residual alone)."""
        ops = self.mlp.fused_ops
        if x is None or (self.gemv_ok and getattr(ops, "gemv", None) is not None
                         and (x.shape[0] == 1 or _takes_rows(ops, x.shape[0], self.self_attn.spec.head_dim,
                                                                   self.most_weights))):
            return self._forward_one(ops, x, residual, positions, rotary, backend, kv_cache, meta)
        if residual is None:
            residual, x = x, self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(x, positions, rotary, backend, kv_cache, meta)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual

    def _forward_one(self, ops: FusedOps, x, residual, positions, rotary, backend, kv_cache, meta):
        """A step of one token (or a few) in four kernels besides attention: norm + qkv + rotary
        (+ the KV write); o + residual add; norm + gate/up + SiLU-mul; down + residual add.
        Returns (None, residual)."""
        if x is not None:  # the stream starts here (the embedding: ours to update in place)
            residual = x.contiguous() if residual is None else x + residual
        attn = self.self_attn.forward_one(ops, residual, self.input_layernorm, positions, rotary, backend,
                                          kv_cache, meta)
        ops.gemv(attn, self.self_attn.o_proj.weight, residual=residual)
        norm = self.post_attention_layernorm
        act = ops.gemv(residual, self.mlp.gate_up_proj.weight, norm_weight=norm.weight, eps=norm.eps, silu_mul=True)
        ops.gemv(act, self.mlp.down_proj.weight, residual=residual)
        return None, residual


class Decoder(nn.Module):
    def __init__(self, cfg: ModelConfig, specs: list[AttentionLayerSpec], bias: bool, qk_norm: bool,
                 tp: TensorParallel) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size) if tp.size == 1 else \
            VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, tp)
        self.layers = nn.ModuleList(DecoderLayer(cfg, s, bias, qk_norm, tp) for s in specs)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LlamaForCausalLM(CausalLM):
    """Llama 2/3 (with llama3 rope scaling); the base of the family's other members."""

    qkv_bias: ClassVar[bool | None] = None  # None: config.attention_bias decides
    qk_norm: ClassVar[bool] = False

    # checkpoint projections that are fused here: name -> (fused name, shard index)
    _fused: ClassVar[dict[str, tuple[str, int]]] = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
              "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}

    #: shards over tensor-parallel ranks (``deepinfer.parallel``): heads, MLP columns and vocabulary
    supports_tensor_parallel: ClassVar[bool] = True

    def __init__(self, config: ModelConfig, attention: AttentionBackend) -> None:
        super().__init__(config, attention)
        self.tp = tp = tensor_parallel()
        bias = config.attention_bias if self.qkv_bias is None else self.qkv_bias
        kv_heads = kv_head_shard(config.num_key_value_heads, tp)[1]
        specs = [
            AttentionLayerSpec(i, config.num_attention_heads // tp.size, kv_heads,
                               config.head_dim, config.layer_window(i), config.head_dim ** -0.5)
            for i in range(config.num_hidden_layers)
        ]
        self.model = Decoder(config, specs, bias, self.qk_norm, tp)
        kv_write = attention.fused_kv_write if isinstance(attention, FusedKVWrite) else None  # (asked once)
        for layer in self.model.layers:
            layer.self_attn.kv_write = kv_write
        self.lm_head = None if config.tie_word_embeddings else Linear(
            config.hidden_size, vocab_shard(config.vocab_size, tp)[2], bias=False)
        self.rotary = RotaryEmbedding(config.head_dim, config.max_position_embeddings,
                                      config.rope_theta, config.rope_scaling)

    @classmethod
    def tensor_parallel_sizes(cls, config: ModelConfig) -> list[int]:
        """Rank counts that split the model evenly: dividing its attention heads and MLP width, with
        its KV heads split evenly or each replicated on a whole number of ranks."""
        kv = config.num_key_value_heads
        return [n for n in range(1, config.num_attention_heads + 1)
                if config.num_attention_heads % n == 0 and config.intermediate_size % n == 0
                and (kv % n == 0 or n % kv == 0)]

    @classmethod
    def shard_facts(cls, config: ModelConfig) -> str:
        """What ``tensor_parallel_sizes`` divides, for an error message."""
        return (f"{config.num_attention_heads} attention heads, {config.num_key_value_heads} KV heads, MLP width "
                f"{config.intermediate_size}")

    def attention_layers(self) -> list[AttentionLayerSpec]:
        return [layer.self_attn.spec for layer in self.model.layers]

    def forward(self, input_ids, positions, kv_caches: list[Any], attn_metadata: Any) -> torch.Tensor:
        # a step of one token takes the device's embedding kernel where it offers one (launched
        # with PDL, it starts while the step's first kernel finishes); others take torch's
        fused = getattr(self.fused_ops, "embedding", None) if input_ids.shape[0] == 1 and self.tp.size == 1 else None
        table = self.model.embed_tokens
        x = table(input_ids) if fused is None else fused(input_ids, table.weight)
        residual = None
        for layer, cache in zip(self.model.layers, kv_caches, strict=True):
            x, residual = layer(x, residual, positions, self.rotary, self.attention, cache, attn_metadata)
        # the stream before the final norm, which compute_logits applies to the rows it is given
        return residual if x is None else x + residual

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """(With tensor parallelism, every rank calls it on the same rows; rank 0 gets the logits,
        the others None.)"""
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        norm = self.model.norm
        if self.tp.size > 1:
            return parallel_logits(norm(hidden), weight, self.config.vocab_size, self.tp, self.linear_op)
        gemv = getattr(self.fused_ops, "gemv", None)
        if gemv is not None and hidden.is_contiguous() and (hidden.shape[0] == 1
                                                             or _takes_rows(self.fused_ops, hidden.shape[0], None,
                                                                        weight.numel())):
            # one row (batch-1 decode): the single-token GEMV, with the norm folded in, reads the
            # weights faster than the batched matmul (H200, Llama-3.2-1B's 128,256 x 2,048: about
            # 120 against 128 us); a few rows (a verification) take the multi-row GEMV, the norm
            # folded in too
            return gemv(hidden, weight, norm_weight=norm.weight, eps=norm.eps)
        return (F.linear if self.linear_op is None else self.linear_op)(norm(hidden), weight)

    def _shard_sizes(self, fused: str) -> list[int]:
        c, n = self.config, self.tp.size
        if fused == "qkv_proj":
            kv = kv_head_shard(c.num_key_value_heads, self.tp)[1] * c.head_dim
            return [c.num_attention_heads // n * c.head_dim, kv, kv]
        return [c.intermediate_size // n, c.intermediate_size // n]

    def weight_shard(self, name: str) -> tuple[int, int, int] | None:
        """The slice of checkpoint tensor ``name`` this rank holds, as (dim, start, length); None: the
        whole tensor (norms; everything at tensor-parallel size 1)."""
        c, tp = self.config, self.tp
        if tp.size == 1:
            return None
        proj, d = name.split(".")[-2] if "." in name else "", c.head_dim
        if proj in ("q_proj", "o_proj"):
            per = c.num_attention_heads // tp.size * d
            return (0 if proj == "q_proj" else 1), tp.rank * per, per
        if proj in ("k_proj", "v_proj"):
            first, heads = kv_head_shard(c.num_key_value_heads, tp)
            return 0, first * d, heads * d
        if proj in ("gate_proj", "up_proj", "down_proj"):
            per = c.intermediate_size // tp.size
            return (1 if proj == "down_proj" else 0), tp.rank * per, per
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            start, rows, _ = vocab_shard(c.vocab_size, tp)
            return 0, start, rows
        return None

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        params = dict(self.named_parameters())
        filled: dict[str, int] = {}  # parameter name -> shards copied
        expected_shards = {n: (3 if ".qkv_proj." in n else 2 if ".gate_up_proj." in n else 1) for n in params}
        unexpected: list[str] = []
        for name, tensor in weights:
            if "rotary_emb" in name or (name == "lm_head.weight" and self.lm_head is None):
                continue
            parts = name.split(".")
            target, shard = name, None
            if len(parts) >= 2 and parts[-2] in self._fused:
                fused, shard = self._fused[parts[-2]]
                target = ".".join(parts[:-2] + [fused, parts[-1]])
            param = params.get(target)
            if param is None:
                unexpected.append(name)
                continue
            dest = param.data
            if shard is not None:
                sizes = self._shard_sizes(target.split(".")[-2])
                dest = dest.narrow(0, sum(sizes[:shard]), sizes[shard])
            if self.tp.size > 1 and dest.shape[0] > tensor.shape[0] and target in ("model.embed_tokens.weight", "lm_head.weight"):
                dest[tensor.shape[0]:].zero_()  # a vocab-parallel shard's padding rows
                dest = dest[:tensor.shape[0]]
            if tuple(dest.shape) != tuple(tensor.shape):
                raise WeightsError(f"weight {name!r} has shape {tuple(tensor.shape)}, "
                                   f"the model expects {tuple(dest.shape)}")
            dest.copy_(tensor)
            filled[target] = filled.get(target, 0) + 1
        missing = sorted(n for n, k in expected_shards.items() if filled.get(n, 0) < k)
        if unexpected:
            raise WeightsError(f"checkpoint has tensors this {self.config.architecture} does not use: "
                               f"{unexpected[:8]}{' ...' if len(unexpected) > 8 else ''}")
        if missing:
            raise WeightsError(f"checkpoint lacks tensors for: {missing[:8]}{' ...' if len(missing) > 8 else ''}")
        self.rotary.build(self.model.embed_tokens.weight.device, self.model.embed_tokens.weight.dtype)


class MistralForCausalLM(LlamaForCausalLM):
    """Mistral: Llama with a sliding window on every layer when config.sliding_window is set."""


class Qwen2ForCausalLM(LlamaForCausalLM):
    """Qwen2: Llama with biases on the q, k and v projections."""

    qkv_bias = True


class Qwen3ForCausalLM(LlamaForCausalLM):
    """Qwen3: per-head RMSNorm on q and k; hybrid sliding-window/full layers via layer_types."""

    qk_norm = True
