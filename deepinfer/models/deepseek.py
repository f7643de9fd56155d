"""DeepSeek-V2 and DeepSeek-V3: multi-head latent attention over a latent KV cache (``mla.py``),
dense MLP layers up to ``first_k_dense_replace`` and routed experts with shared ones after (``moe.py``)."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from deepinfer.core.interfaces import AttentionBackend, AttentionLayerSpec
from deepinfer.core.model_config import ModelConfig
from deepinfer.core.model_registry import CausalLM
from deepinfer.models.deepseek_config import DeepseekConfig, deepseek_config
from deepinfer.models.deepseek_weights import load_checkpoint
from deepinfer.models.fp8 import fp8_block_size
from deepinfer.models.layers import GatedMLP, Linear, RMSNorm
from deepinfer.models.mla import MLAttention
from deepinfer.models.moe import MoE
from deepinfer.models.yarn import LatentRotary


class DeepseekDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, ds: DeepseekConfig, layer_idx: int, softmax_scale: float) -> None:
        super().__init__()
        self.self_attn = MLAttention(ds.mla, layer_idx, softmax_scale)
        if ds.is_moe(layer_idx):
            self.mlp: nn.Module = MoE(config.hidden_size, ds.n_routed_experts, ds.moe_intermediate_size,
                                      ds.n_shared_experts, ds.routing)
        else:
            self.mlp = GatedMLP(config.hidden_size, config.intermediate_size)
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
    def __init__(self, config: ModelConfig, ds: DeepseekConfig, softmax_scale: float) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DeepseekDecoderLayer(config, ds, i, softmax_scale)
                                    for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class DeepseekV2ForCausalLM(CausalLM):
    """DeepSeek-V2: softmax routing (greedy or group-limited); rope over interleaved pairs."""

    v3: ClassVar[bool] = False

    def __init__(self, config: ModelConfig, attention: AttentionBackend) -> None:
        super().__init__(config, attention)
        self.ds = deepseek_config(config, self.v3)
        self.fp8_block = fp8_block_size(config)
        mla = self.ds.mla
        self.rotary = LatentRotary(mla.qk_rope_head_dim, config.max_position_embeddings, config.rope_theta,
                                   config.rope_scaling, self.ds.rope_interleave, mla.qk_head_dim)
        self.model = DeepseekModel(config, self.ds, self.rotary.softmax_scale)
        self.lm_head = None if config.tie_word_embeddings else Linear(config.hidden_size, config.vocab_size,
                                                                      bias=False)
        #: the last expert placement applied (PlacesExperts), physical_to_logical [num_moe_layers, slots]
        self.expert_placement: torch.Tensor | None = None

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

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return (F.linear if self.linear_op is None else self.linear_op)(self.model.norm(hidden), weight)

    def expert_load(self) -> torch.Tensor:
        """Tokens each routed expert received, per MoE layer, since the load or the last reset:
        int64 [num_moe_layers, n_routed_experts], on the host."""
        layers = self.moe_layers()
        if not layers:
            return torch.zeros(0, self.ds.n_routed_experts, dtype=torch.int64)
        return torch.stack([m.expert_load for m in layers]).cpu()

    def reset_expert_load(self) -> None:
        for m in self.moe_layers():
            m.expert_load.zero_()

    def apply_placement(self, physical_to_logical: torch.Tensor, logical_to_physical: torch.Tensor,
                        logical_replica_count: torch.Tensor) -> None:
        """One process holds every expert, so no weight moves and routing stays logical: the placement
        is checked against the model and kept in ``expert_placement`` (PlacesExperts)."""
        shape = (len(self.moe_layers()), self.ds.n_routed_experts)
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

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        load_checkpoint(self, weights, self.fp8_block)
        self.rotary.build(self.model.embed_tokens.weight.device)
        self.reset_expert_load()


class DeepseekV3ForCausalLM(DeepseekV2ForCausalLM):
    """DeepSeek-V3: sigmoid routing with a score correction bias, limited to the best expert groups;
    rope over interleaved pairs or halves (``rope_interleave``)."""

    v3 = True
