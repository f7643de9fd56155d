"""The DeepSeek-V2/V3 fields of config.json, checked: what the core's ModelConfig does not hold."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from deepinfer.core.model_config import ModelConfig, ModelConfigError
from deepinfer.models.mla import MLADims
from deepinfer.models.moe import Routing

V2_TOPK_METHODS = ("greedy", "group_limited_greedy")
V3_TOPK_METHODS = (None, "noaux_tc")


@dataclass(frozen=True, slots=True)
class DeepseekConfig:
    """Attention dims, which layers are dense, and the experts and routing of the others."""

    mla: MLADims
    rope_interleave: bool
    first_k_dense_replace: int
    n_routed_experts: int  # 0: every layer dense
    moe_intermediate_size: int
    n_shared_experts: int
    routing: Routing | None

    def is_moe(self, layer_idx: int) -> bool:
        return self.n_routed_experts > 0 and layer_idx >= self.first_k_dense_replace


def _bad(config: ModelConfig, what: str) -> ModelConfigError:
    return ModelConfigError(f"{config.path}/config.json ({config.architecture}): {what}")


def _routing(config: ModelConfig, raw: dict[str, Any], v3: bool, n_experts: int) -> Routing:
    method = raw.get("topk_method", None if v3 else "greedy")
    scoring = raw.get("scoring_func", "sigmoid" if v3 else "softmax")
    n_group, topk_group = int(raw.get("n_group") or 1), int(raw.get("topk_group") or 1)
    top_k = int(raw["num_experts_per_tok"])
    if v3 and (method not in V3_TOPK_METHODS or scoring != "sigmoid"):
        raise _bad(config, f"topk_method {method!r} with scoring_func {scoring!r} is not supported; DeepSeek-V3 "
                           "routes by sigmoid scores with topk_method noaux_tc")
    if not v3 and (method not in V2_TOPK_METHODS or scoring != "softmax"):
        raise _bad(config, f"topk_method {method!r} with scoring_func {scoring!r} is not supported; DeepSeek-V2 "
                           f"routes by softmax scores with topk_method one of {', '.join(V2_TOPK_METHODS)}")
    if not v3 and raw.get("norm_topk_prob"):
        # DeepSeek's own V2 code would then normalise and skip routed_scaling_factor; transformers (the
        # oracle) ignores the field: refuse rather than pick one silently
        raise _bad(config, "norm_topk_prob true is not supported for DeepSeek-V2 (DeepSeek's code and "
                           "transformers disagree on it); set it to false")
    group_limited = method == "group_limited_greedy" or (v3 and n_group > 1)
    if group_limited and (n_experts % n_group or not 1 <= topk_group <= n_group):
        raise _bad(config, f"n_group {n_group} must divide n_routed_experts {n_experts} and topk_group "
                           f"{topk_group} be between 1 and n_group")
    if v3 and group_limited and n_experts // n_group < 2:
        raise _bad(config, f"n_group {n_group} leaves fewer than 2 experts a group; DeepSeek-V3 scores a group by "
                           "its two best experts")
    choosable = (n_experts // n_group) * topk_group if group_limited else n_experts
    if not 1 <= top_k <= choosable:
        raise _bad(config, f"num_experts_per_tok {top_k} must be between 1 and the {choosable} experts the "
                           "router may choose from")
    return Routing(top_k, scoring, n_group, topk_group, group_limited, bool(raw.get("norm_topk_prob", v3)),
                   float(raw.get("routed_scaling_factor", 1.0)))


def deepseek_config(config: ModelConfig, v3: bool) -> DeepseekConfig:
    """Read and check the DeepSeek fields of ``config.raw``; errors name the field and what is valid."""
    raw = config.raw
    try:
        q_lora = raw.get("q_lora_rank")
        mla = MLADims(config.hidden_size, config.num_attention_heads, None if q_lora is None else int(q_lora),
                      int(raw["kv_lora_rank"]), int(raw["qk_nope_head_dim"]), int(raw["qk_rope_head_dim"]),
                      int(raw["v_head_dim"]), bool(raw.get("attention_bias", False)))
    except KeyError as e:
        raise _bad(config, f"required field {e.args[0]!r} is missing") from None
    if raw.get("hidden_act", "silu") != "silu":
        raise _bad(config, f"hidden_act {raw['hidden_act']!r} is not supported; supported: silu")
    if int(raw.get("moe_layer_freq", 1)) != 1:
        raise _bad(config, f"moe_layer_freq {raw['moe_layer_freq']} is not supported; supported: 1 (every layer "
                           "from first_k_dense_replace on is a MoE layer)")
    n_experts = int(raw.get("n_routed_experts") or 0)
    routing = _routing(config, raw, v3, n_experts) if n_experts else None
    return DeepseekConfig(mla, bool(raw.get("rope_interleave", True)) if v3 else True,
                          int(raw.get("first_k_dense_replace") or 0), n_experts,
                          int(raw.get("moe_intermediate_size") or 0), int(raw.get("n_shared_experts") or 0), routing)
