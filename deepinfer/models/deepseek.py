"""DeepSeek-V2 and DeepSeek-V3: multi-head latent attention over a latent KV cache (``mla.py``),
dense MLP layers up to ``first_k_dense_replace`` and routed experts with shared ones after (``moe.py``)."""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from deepinfer.core.interfaces import AttentionBackend, AttentionLayerSpec
from deepinfer.core.model_config import ModelConfig
from deepinfer.core.model_registry import CausalLM
from deepinfer.models.deepseek_config import DeepseekConfig, deepseek_config
from deepinfer.models.deepseek_weights import _EXPERT, load_checkpoint
from deepinfer.models.expert_parallel_moe import (
    ExpertParallelMoE,
    holds_expert,
    local_expert_tensors,
    place,
    summed_load,
)
from deepinfer.models.fp8 import fp8_block_size
from deepinfer.models.layers import GatedMLP, Linear, RMSNorm
from deepinfer.models.mla import MLAttention
from deepinfer.models.moe import MoE
from deepinfer.models.parallel_layers import RowParallelLinear, VocabParallelEmbedding, parallel_logits, vocab_shard
from deepinfer.models.yarn import LatentRotary
from deepinfer.parallel.state import ExpertParallel, TensorParallel, expert_parallel, tensor_parallel


class TensorParallelMoE(MoE):
    """Routed and shared experts, each with its intermediate width split over the ranks (the router
    replicated): every rank adds its part of every expert, and one all-reduce sums them."""

    def __init__(self, *args: Any, tp: TensorParallel) -> None:
        super().__init__(*args)
        self.tp = tp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tp.all_reduce(super().forward(x))


class DeepseekDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, ds: DeepseekConfig, layer_idx: int, softmax_scale: float,
                 tp: TensorParallel, ep: ExpertParallel) -> None:
        super().__init__()
        n = tp.size  # (with tensor parallelism: this rank's heads; the latents are replicated)
        mla = replace(ds.mla, num_heads=ds.mla.num_heads // n)
        self.self_attn = MLAttention(mla, layer_idx, softmax_scale)
        if n > 1:
            self.self_attn.o_proj = RowParallelLinear(mla.num_heads * mla.v_head_dim, config.hidden_size, tp)
        if ds.is_moe(layer_idx):
            args = (config.hidden_size, ds.n_routed_experts, ds.moe_intermediate_size // n, ds.n_shared_experts,
                    ds.routing)
            self.mlp: nn.Module = (ExpertParallelMoE(*args, ep=ep) if ep.sharded else MoE(*args) if n == 1
                                   else TensorParallelMoE(*args, tp=tp))
        else:
            self.mlp = GatedMLP(config.hidden_size, config.intermediate_size // n)
            if n > 1:
                self.mlp.down_proj = RowParallelLinear(config.intermediate_size // n, config.hidden_size, tp)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, residual, positions, rotary, backend, kv_cache, meta):
        """(x, residual) in and out, as in the Llama family."""
        if residual is None:
            residual, x = x, self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(x, positions, rotary, backend, kv_cache, meta)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class DeepseekModel(nn.Module):
    def __init__(self, config: ModelConfig, ds: DeepseekConfig, softmax_scale: float, tp: TensorParallel,
                 ep: ExpertParallel) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size) if tp.size == 1 else \
            VocabParallelEmbedding(config.vocab_size, config.hidden_size, tp)
        self.layers = nn.ModuleList(DeepseekDecoderLayer(config, ds, i, softmax_scale, tp, ep)
                                    for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class DeepseekV2ForCausalLM(CausalLM):
    """DeepSeek-V2: softmax routing (greedy or group-limited); rope over interleaved pairs."""

    v3: ClassVar[bool] = False
    #: shards over tensor-parallel ranks: attention heads (the latents replicated), every expert's
    #: and MLP's width, and the vocabulary
    supports_tensor_parallel: ClassVar[bool] = True
    #: shards its routed experts over expert-parallel ranks (``ExpertParallelMoE``)
    supports_expert_parallel: ClassVar[bool] = True

    def __init__(self, config: ModelConfig, attention: AttentionBackend) -> None:
        super().__init__(config, attention)
        self.tp = tp = tensor_parallel()
        self.ep = expert_parallel()
        self.ds = deepseek_config(config, self.v3)
        self.fp8_block = fp8_block_size(config)
        mla = self.ds.mla
        self.rotary = LatentRotary(mla.qk_rope_head_dim, config.max_position_embeddings, config.rope_theta,
                                   config.rope_scaling, self.ds.rope_interleave, mla.qk_head_dim)
        self.model = DeepseekModel(config, self.ds, self.rotary.softmax_scale, tp, self.ep)
        self.lm_head = None if config.tie_word_embeddings else Linear(
            config.hidden_size, vocab_shard(config.vocab_size, tp)[2], bias=False)
        #: the last expert placement applied (PlacesExperts), physical_to_logical [num_moe_layers, slots]
        self.expert_placement: torch.Tensor | None = None

    @classmethod
    def tensor_parallel_sizes(cls, config: ModelConfig) -> list[int]:
        """Rank counts that split the heads, the dense MLP width and the experts' width evenly (1
        only for a block-scaled FP8 checkpoint, whose scales would need slicing by block, or
        attention with biases)."""
        ds = deepseek_config(config, cls.v3)
        if fp8_block_size(config) is not None or ds.mla.bias:
            return [1]
        return [n for n in range(1, ds.mla.num_heads + 1) if ds.mla.num_heads % n == 0
                and config.intermediate_size % n == 0 and ds.moe_intermediate_size % n == 0]

    @classmethod
    def num_routed_experts(cls, config: ModelConfig) -> int:
        """Routed experts a MoE layer has (0: a dense model), for the expert-parallel checks."""
        return deepseek_config(config, cls.v3).n_routed_experts

    @classmethod
    def expert_parallel_problem(cls, config: ModelConfig) -> str | None:
        """Why this checkpoint's experts cannot be sharded over expert-parallel ranks (None: they can)."""
        if fp8_block_size(config) is not None:
            return "a block-scaled FP8 checkpoint (its experts' scales are not cut to a rank's slots)"
        return None

    @classmethod
    def shard_facts(cls, config: ModelConfig) -> str:
        ds = deepseek_config(config, cls.v3)
        return (f"{ds.mla.num_heads} attention heads, MLP width {config.intermediate_size}, expert width "
                f"{ds.moe_intermediate_size}{', a block-scaled FP8 checkpoint' if fp8_block_size(config) else ''}"
                f"{', attention biases' if ds.mla.bias else ''}")

    def weight_shard(self, name: str) -> tuple[int, int, int] | None:
        """The slice (dim, start, length) of checkpoint tensor ``name`` this rank holds; None: all of it
        (the latents' projections and norms, the router, everything at tensor-parallel size 1)."""
        tp, mla = self.tp, self.ds.mla
        if self.ep.sharded:  # (experts of other ranks' slots: an empty slice, never read)
            return None if holds_expert(name, self._slot_experts()) else (0, 0, 0)
        if tp.size == 1:
            return None
        parts = name.split(".")
        proj, heads = (parts[-2] if len(parts) > 1 else ""), mla.num_heads // tp.size
        per_head = {"q_proj": mla.qk_head_dim, "q_b_proj": mla.qk_head_dim,
                    "kv_b_proj": mla.qk_nope_head_dim + mla.v_head_dim, "o_proj": mla.v_head_dim}
        if proj in per_head:
            per = heads * per_head[proj]
            return (1 if proj == "o_proj" else 0), tp.rank * per, per
        if proj in ("gate_proj", "up_proj", "down_proj"):
            ds = self.ds
            width = (ds.moe_intermediate_size if _EXPERT.match(name) else
                     ds.moe_intermediate_size * ds.n_shared_experts if ".shared_experts." in name else
                     self.config.intermediate_size)
            per = width // tp.size
            return (1 if proj == "down_proj" else 0), tp.rank * per, per
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            start, rows, _ = vocab_shard(self.config.vocab_size, tp)
            return 0, start, rows
        return None

    def _rank_parts(self, weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        """The checkpoint's tensors cut to this rank's part where ``weight_shard`` could not (transformers'
        stacked experts, read whole), and its vocabulary shards padded to the shard's rows."""
        tp = self.tp
        for name, t in weights:
            if name.endswith(".experts.gate_up_proj"):       # [E, 2I, D]: the rank's gate rows, then its up rows
                per = t.shape[1] // 2 // tp.size
                t = torch.cat([t[:, tp.rank * per:(tp.rank + 1) * per],
                               t[:, (tp.size + tp.rank) * per:(tp.size + tp.rank + 1) * per]], dim=1)
            elif name.endswith(".experts.down_proj"):        # [E, D, I]
                per = t.shape[2] // tp.size
                t = t[:, :, tp.rank * per:(tp.rank + 1) * per]
            elif name in ("model.embed_tokens.weight", "lm_head.weight"):
                rows = vocab_shard(self.config.vocab_size, tp)[2]
                t = torch.cat([t, t.new_zeros(rows - t.shape[0], *t.shape[1:])]) if t.shape[0] < rows else t
            yield name, t

    def _slot_experts(self) -> list[int]:
        """The logical experts of this rank's expert slots (the same in every MoE layer until a placement)."""
        layers = self.moe_layers()
        return layers[0].slot_experts() if layers else []

    def attention_layers(self) -> list[AttentionLayerSpec]:
        return [layer.self_attn.spec for layer in self.model.layers]

    def moe_layers(self) -> list[MoE]:
        return [layer.mlp for layer in self.model.layers if isinstance(layer.mlp, MoE)]

    def fp8_linears(self) -> list[nn.Module]:
        """Every linear layer of the decoder but ``kv_b_proj``, whose weight the absorbed attention
        reads per head (W_UK, W_UV); routed experts stay in the model's dtype (the fused MoE kernel's)."""
        return [m for name, m in self.model.named_modules()
                if isinstance(m, Linear) and not name.endswith("kv_b_proj")]

    def forward(self, input_ids, positions, kv_caches: list[Any], attn_metadata: Any) -> torch.Tensor:
        x, residual = self.model.embed_tokens(input_ids), None
        for layer, cache in zip(self.model.layers, kv_caches, strict=True):
            x, residual = layer(x, residual, positions, self.rotary, self.attention, cache, attn_metadata)
        return x + residual

    def idle_forward(self) -> None:
        """A step of zero tokens on this rank: with expert parallelism, its MoE layers still take part
        in the other ranks' exchanges of tokens (data-parallel attention, a rank with no sequence)."""
        x = torch.empty(0, self.config.hidden_size, dtype=self.model.norm.weight.dtype,
                        device=self.model.norm.weight.device)
        for m in self.moe_layers():
            if isinstance(m, ExpertParallelMoE):
                m(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """(With tensor parallelism, every rank calls it on the same rows; rank 0 gets the logits.)"""
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        if self.tp.size > 1:
            return parallel_logits(self.model.norm(hidden), weight, self.config.vocab_size, self.tp, self.linear_op)
        return (F.linear if self.linear_op is None else self.linear_op)(self.model.norm(hidden), weight)

    def expert_load(self) -> torch.Tensor:
        """Tokens each routed expert received, per MoE layer, since the load or the last reset:
        int64 [num_moe_layers, n_routed_experts], on the host."""
        layers = self.moe_layers()
        if not layers:
            return torch.zeros(0, self.ds.n_routed_experts, dtype=torch.int64)
        if self.ep.size > 1:  # (every data-parallel rank counts its own tokens)
            return summed_load(layers, self.ep)
        return torch.stack([m.expert_load for m in layers]).cpu()

    def reset_expert_load(self) -> None:
        if self.ep.size > 1 and self.ep.announce is not None:
            self.ep.announce("reset_expert_load")
        for m in self.moe_layers():
            m.reset_load()

    def apply_placement(self, physical_to_logical: torch.Tensor, logical_to_physical: torch.Tensor,
                        logical_replica_count: torch.Tensor) -> None:
        """The placement is checked against the model and kept in ``expert_placement`` (PlacesExperts).
        With expert parallelism the ranks exchange expert weights to hold it and route by it; in one
        process no weight moves and routing stays logical."""
        shape = (len(self.moe_layers()), self.ds.n_routed_experts)
        slots = self.ds.n_routed_experts + self.ep.num_redundant_experts
        width = slots - self.ds.n_routed_experts + 1  # (the ranks receive the maps in these shapes)
        if self.ep.sharded and (physical_to_logical.shape[-1], logical_to_physical.shape[-1]) != (slots, width):
            raise ValueError(f"an expert placement for this model's {slots} physical expert slots a layer "
                             f"({self.ds.n_routed_experts} experts + {self.ep.num_redundant_experts} redundant) "
                             f"has physical_to_logical [L, {slots}] and logical_to_physical [L, E, {width}], got "
                             f"{tuple(physical_to_logical.shape)} and {tuple(logical_to_physical.shape)}: set the "
                             "balancer's redundant experts to the engine's num_redundant_experts")
        p2l = physical_to_logical.long()
        fits = (p2l.dim() == 2 and p2l.shape[0] == shape[0] and tuple(logical_replica_count.shape) == shape
                and tuple(logical_to_physical.shape[:2]) == shape and 0 <= p2l.min() and p2l.max() < shape[1])
        held = torch.zeros(shape, dtype=torch.int64).scatter_add_(1, p2l, torch.ones_like(p2l)) if fits else None
        if not fits or (held == 0).any() or not torch.equal(held, logical_replica_count.long()):
            raise ValueError(f"an expert placement for this model maps the physical slots of {shape[0]} MoE layers "
                             f"to {shape[1]} logical experts, each held at least once and counted as "
                             f"physical_to_logical holds it; got physical_to_logical {tuple(p2l.shape)} and "
                             f"logical_replica_count {tuple(logical_replica_count.shape)}")
        self.expert_placement = p2l.clone()
        if self.ep.sharded:
            place(self.moe_layers(), p2l, logical_to_physical.long(), logical_replica_count.long())

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        if self.ep.sharded:
            weights = local_expert_tensors(weights, self._slot_experts())
        elif self.tp.size > 1:
            weights = self._rank_parts(weights)
        load_checkpoint(self, weights, self.fp8_block)
        for m in self.moe_layers():
            if isinstance(m, ExpertParallelMoE):
                m.reset_placement()
        if self.ds.rope_interleave:  # rotated as halves from now on: the fused rotary kernel's layout
            for layer in self.model.layers:
                layer.self_attn.rope_rows_to_halves()
            self.rotary.interleaved = False
        self.rotary.build(self.model.embed_tokens.weight.device)
        self.reset_expert_load()

    def use_fused_ops(self, ops) -> None:
        super().use_fused_ops(ops)
        self.rotary.use_fused_ops(ops, self.model.embed_tokens.weight.dtype)


class DeepseekV3ForCausalLM(DeepseekV2ForCausalLM):
    """DeepSeek-V3: sigmoid routing with a score correction bias, limited to the best expert groups;
    rope over interleaved pairs or halves (``rope_interleave``)."""

    v3 = True
