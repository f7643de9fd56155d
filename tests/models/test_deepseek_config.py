"""The released DeepSeek-V2-Lite and DeepSeek-V3 config.json files (transformers 4 layout, as on
the Hub) build the model their checkpoints need: the latent cache's head of 576 = 512 + 64, the
softmax scale with YaRN's mscale folded in as DeepSeek computes it, dense and MoE layers, stacked
experts. Built on the meta device (no memory); the oracle is DeepSeek's published arithmetic."""
from __future__ import annotations

import json
import math

import torch

from deepinfer.core.model_config import read_model_config
from deepinfer.models.deepseek import DeepseekV2ForCausalLM, DeepseekV3ForCausalLM
from deepinfer.models.moe import MoE

V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": False, "bos_token_id": 0, "eos_token_id": 1,
    "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168, "intermediate_size": 18432,
    "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v3",
    "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256,
    "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 128, "num_experts_per_tok": 8,
    "num_hidden_layers": 61, "num_key_value_heads": 128, "num_nextn_predict_layers": 1, "q_lora_rank": 1536,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]},
    "rms_norm_eps": 1e-06, "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                                            "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                                            "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "tie_word_embeddings": False,
    "topk_group": 4, "topk_method": "noaux_tc", "torch_dtype": "bfloat16", "v_head_dim": 128, "vocab_size": 129280,
}
V2_LITE = {
    "architectures": ["DeepseekV2ForCausalLM"], "attention_bias": False, "bos_token_id": 100000,
    "eos_token_id": 100001, "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": 2048,
    "intermediate_size": 10944, "kv_lora_rank": 512, "max_position_embeddings": 163840,
    "moe_intermediate_size": 1408, "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 64,
    "n_shared_experts": 2, "norm_topk_prob": False, "num_attention_heads": 16, "num_experts_per_tok": 6,
    "num_hidden_layers": 27, "num_key_value_heads": 16, "q_lora_rank": None, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 1.0, "scoring_func": "softmax", "tie_word_embeddings": False,
    "topk_group": 1, "topk_method": "greedy", "torch_dtype": "bfloat16", "v_head_dim": 128, "vocab_size": 102400,
}


def _build(tmp_path, raw: dict, cls):
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with torch.device("meta"):
        return cls(read_model_config(tmp_path), attention=None)


def test_deepseek_v3_config_builds_its_latent_cache_and_experts(tmp_path):
    model = _build(tmp_path, V3, DeepseekV3ForCausalLM)
    specs = model.attention_layers()
    assert len(specs) == 61
    mscale = 0.1 * 1.0 * math.log(40) + 1.0  # yarn_get_mscale(factor 40, mscale_all_dim 1)
    for s in specs:
        assert (s.num_heads, s.num_kv_heads, s.head_dim, s.value_dim) == (128, 1, 576, 512)
        assert math.isclose(s.scale, 192 ** -0.5 * mscale * mscale, rel_tol=1e-12)
    assert model.rotary.attention_factor == 1.0  # mscale / mscale_all_dim
    moe = model.moe_layers()
    assert len(moe) == 58 and not isinstance(model.model.layers[2].mlp, MoE)
    assert moe[0].w13.shape == (256, 2 * 2048, 7168) and moe[0].w2.shape == (256, 7168, 2048)
    r = moe[0].gate.routing
    assert (r.scoring, r.top_k, r.n_group, r.topk_group, r.norm_topk_prob, r.routed_scaling_factor) == \
        ("sigmoid", 8, 8, 4, True, 2.5)
    assert model.fp8_block == (128, 128)


def test_deepseek_v2_lite_config_builds_a_plain_q_projection_and_greedy_routing(tmp_path):
    model = _build(tmp_path, V2_LITE, DeepseekV2ForCausalLM)
    attn = model.model.layers[0].self_attn
    assert hasattr(attn, "q_proj") and not hasattr(attn, "q_a_proj")
    mscale = 0.1 * 0.707 * math.log(40) + 1.0
    assert math.isclose(attn.spec.scale, 192 ** -0.5 * mscale * mscale, rel_tol=1e-12)
    assert model.rotary.attention_factor == 1.0
    moe = model.moe_layers()
    assert len(moe) == 26 and moe[0].shared_experts.intermediate == 2 * 1408
    r = moe[0].gate.routing
    assert (r.scoring, r.top_k, r.group_limited, r.norm_topk_prob) == ("softmax", 6, False, False)
    assert model.fp8_block is None
