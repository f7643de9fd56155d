"""Random-weight models at named shapes, built from a config and saved with safetensors in the run."""
from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
from pathlib import Path

SHAPES = {
    # the CPU model of issue 2's speed goal
    "llama-tiny": ("llama", {"hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4,
                                 "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 8192,
                                 "max_position_embeddings": 4096}),
    "llama-1b": ("llama", {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                               "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
                               "tie_word_embeddings": True, "max_position_embeddings": 131072,
                               "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                             "high_freq_factor": 4.0,
                                             "original_max_position_embeddings": 8192},
                               "rope_theta": 500000.0}),
    # a CPU-sized Qwen3, for `bench swa`'s default run
    "qwen3-tiny": ("qwen3", {"hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4,
                                 "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 8192,
                                 "tie_word_embeddings": True, "max_position_embeddings": 4096}),
    "qwen3-0.6b": ("qwen3", {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
                                 "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
                                 "tie_word_embeddings": True, "max_position_embeddings": 40960,
                                 "rope_theta": 1000000.0}),
    # DeepSeek-V2-Lite's released config (15.7e9 parameters, 2.4e9 active a token; 31 GB in bf16)
    "deepseek-v2-lite": ("deepseek_v2", {
        "hidden_size": 2048, "intermediate_size": 10944, "moe_intermediate_size": 1408, "num_hidden_layers": 27,
        "num_attention_heads": 16, "num_key_value_heads": 16, "n_routed_experts": 64, "n_shared_experts": 2,
        "num_experts_per_tok": 6, "first_k_dense_replace": 1, "moe_layer_freq": 1, "n_group": 1, "topk_group": 1,
        "topk_method": "greedy", "scoring_func": "softmax", "norm_topk_prob": False, "routed_scaling_factor": 1.0,
        "q_lora_rank": None, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
        "v_head_dim": 128, "vocab_size": 102400, "max_position_embeddings": 163840, "bos_token_id": 100000,
        "eos_token_id": 100001,
        "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32,
                         "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707}}),
    # DeepSeek-V3's layout (q_lora_rank, sigmoid routing with groups and a correction bias) at a CPU size
    "deepseek-v3-tiny": ("deepseek_v3", {
        "hidden_size": 256, "intermediate_size": 688, "moe_intermediate_size": 128, "num_hidden_layers": 4,
        "num_attention_heads": 8, "num_key_value_heads": 8, "n_routed_experts": 16, "n_shared_experts": 1,
        "num_experts_per_tok": 4, "first_k_dense_replace": 1, "moe_layer_freq": 1, "n_group": 4, "topk_group": 2,
        "topk_method": "noaux_tc", "scoring_func": "sigmoid", "norm_topk_prob": True, "routed_scaling_factor": 2.5,
        "q_lora_rank": 96, "kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32,
        "vocab_size": 8192, "max_position_embeddings": 4096, "bos_token_id": 0, "eos_token_id": 1}),
}


ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM", "deepseek_v2": "DeepseekV2ForCausalLM",
                 "deepseek_v3": "DeepseekV3ForCausalLM"}
# what transformers' config classes would fill in (written out, so that no reader has to guess)
DEFAULTS = {"hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "attention_bias": False,
            "initializer_range": 0.02, "tie_word_embeddings": False}
PEER_HINT = "pip install 'deepinfer[bench]'"


def random_config(shape: str, dtype: str = "float32", hybrid_window: int | None = None, **overrides) -> dict:
    """The config.json of a named shape (``hybrid_window``: a hybrid Qwen3, 3 sliding-window layers of
    that window to 1 full-attention layer; ``overrides`` replace fields)."""
    if shape not in SHAPES:
        raise ValueError(f"unknown model shape {shape!r}; known: {', '.join(SHAPES)}")
    arch, cfg = SHAPES[shape]
    cfg = {"architectures": [ARCHITECTURES[arch]], "model_type": arch, **DEFAULTS, **cfg, **overrides,
           "torch_dtype": dtype}
    if arch == "llama":
        cfg = {"bos_token_id": 1, "eos_token_id": 2, **cfg}
    if hybrid_window is not None:
        if arch != "qwen3":
            raise ValueError(f"a hybrid sliding-window model needs a qwen3 shape, not {shape!r}")
        n = cfg["num_hidden_layers"]
        cfg.update(use_sliding_window=True, sliding_window=hybrid_window, max_window_layers=0,
                   layer_types=["full_attention" if i % 4 == 3 else "sliding_attention" for i in range(n)])
    return cfg


def random_weights(cfg: dict, dtype, device: str = "cpu") -> dict:
    """Hugging Face-named tensors for ``cfg``: linear and embedding weights drawn from
    N(0, initializer_range) with seed 0, norms all ones (as transformers initialises them)."""
    import torch

    h, inter, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    gen = torch.Generator(device).manual_seed(0)

    def normal(*shape: int):
        t = torch.empty(shape, device=device, dtype=torch.float32).normal_(0, cfg["initializer_range"], generator=gen)
        return t.to(dtype).cpu()

    def ones(n: int):
        return torch.ones(n, dtype=dtype)

    w = {"model.embed_tokens.weight": normal(vocab, h), "model.norm.weight": ones(h)}
    deepseek = cfg["model_type"].startswith("deepseek")
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w.update({p + "input_layernorm.weight": ones(h), p + "post_attention_layernorm.weight": ones(h)})
        w.update(_latent_attention(cfg, p, normal, ones) if deepseek else _attention(cfg, p, normal, ones))
        if deepseek and i >= cfg["first_k_dense_replace"]:
            w.update(_routed_experts(cfg, p, normal, ones))
        else:
            w.update({p + "mlp.gate_proj.weight": normal(inter, h), p + "mlp.up_proj.weight": normal(inter, h),
                      p + "mlp.down_proj.weight": normal(h, inter)})
    if not cfg["tie_word_embeddings"]:
        w["lm_head.weight"] = normal(vocab, h)
    return w


def _attention(cfg: dict, p: str, normal, ones) -> dict:
    h, heads, kv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim") or h // heads
    w = {p + "self_attn.q_proj.weight": normal(heads * d, h), p + "self_attn.k_proj.weight": normal(kv * d, h),
         p + "self_attn.v_proj.weight": normal(kv * d, h), p + "self_attn.o_proj.weight": normal(h, heads * d)}
    if cfg["model_type"] == "qwen3":
        w.update({p + "self_attn.q_norm.weight": ones(d), p + "self_attn.k_norm.weight": ones(d)})
    return w


def _latent_attention(cfg: dict, p: str, normal, ones) -> dict:
    """DeepSeek's multi-head latent attention, with or without the query's low-rank projection."""
    h, heads, q_rank, kv_rank = cfg["hidden_size"], cfg["num_attention_heads"], cfg["q_lora_rank"], cfg["kv_lora_rank"]
    nope, rope, v = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    a = p + "self_attn."
    w = {a + "kv_a_proj_with_mqa.weight": normal(kv_rank + rope, h), a + "kv_a_layernorm.weight": ones(kv_rank),
         a + "kv_b_proj.weight": normal(heads * (nope + v), kv_rank), a + "o_proj.weight": normal(h, heads * v)}
    if q_rank:
        w.update({a + "q_a_proj.weight": normal(q_rank, h), a + "q_a_layernorm.weight": ones(q_rank),
                  a + "q_b_proj.weight": normal(heads * (nope + rope), q_rank)})
    else:
        w[a + "q_proj.weight"] = normal(heads * (nope + rope), h)
    return w


def _routed_experts(cfg: dict, p: str, normal, ones) -> dict:
    """A MoE layer in transformers' stacked layout (experts.gate_up_proj [E, 2I, D], down_proj [E, D, I])."""
    import torch

    h, e, inter = cfg["hidden_size"], cfg["n_routed_experts"], cfg["moe_intermediate_size"]
    shared = inter * cfg["n_shared_experts"]
    m = p + "mlp."
    w = {m + "gate.weight": normal(e, h).float(), m + "experts.gate_up_proj": normal(e, 2 * inter, h),
         m + "experts.down_proj": normal(e, h, inter)}
    if cfg["scoring_func"] == "sigmoid":
        w[m + "gate.e_score_correction_bias"] = torch.zeros(e)
    if shared:
        w.update({m + "shared_experts.gate_proj.weight": normal(shared, h),
                  m + "shared_experts.up_proj.weight": normal(shared, h),
                  m + "shared_experts.down_proj.weight": normal(h, shared)})
    return w


def build_random_model(shape: str, dtype: str = "float32", device: str = "cpu", out: str | None = None,
                       hybrid_window: int | None = None, **overrides) -> str:
    """Save a random model of a named shape (config.json and model.safetensors, written directly:
    no transformers needed) and return its directory."""
    import torch
    from safetensors.torch import save_file

    cfg = random_config(shape, dtype, hybrid_window, **overrides)
    path = Path(out or tempfile.mkdtemp(prefix=f"deepinfer-{shape}-"))
    path.mkdir(parents=True, exist_ok=True)
    save_file(random_weights(cfg, getattr(torch, dtype), device), str(path / "model.safetensors"),
              metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    # on disk now, before a benchmark times anything: the kernel writes dirty pages back about 30 s
    # later, and on an H200 host two of six batch-1 runs started one after another were 8-13% slower
    # (four runs with the previous run's files flushed first were not)
    os.sync()
    return str(path)


def require_transformers(what: str = "--peer hf") -> None:
    """Fail before any work, in one line, when transformers (the peer) is not installed."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise ValueError(f"{what} runs Hugging Face transformers, which is not installed: {PEER_HINT}") from None


def bench_model(args, overrides: dict, default_dtype: str, **shape_overrides) -> tuple[str | None, dict]:
    """The model directory a benchmark runs on (with ``--random-model``, one built now, on the GPU
    when one is there and not excluded, its config's fields replaced by ``shape_overrides``) and the
    engine overrides left for LLM(...)."""
    import torch

    overrides = dict(overrides)
    model = overrides.pop("model", None)
    if getattr(args, "random_model", None):
        dtype = overrides.get("dtype", "auto")
        on_gpu = overrides.get("device", "auto") != "cpu" and torch.cuda.is_available()
        model = build_random_model(args.random_model, default_dtype if dtype == "auto" else dtype,
                                   "cuda" if on_gpu else "cpu", **shape_overrides)
        atexit.register(shutil.rmtree, model, True)  # (a temporary directory, gone with the run)
    return model, overrides
