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
}


ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}
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
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim") or h // heads
    gen = torch.Generator(device).manual_seed(0)

    def normal(*shape: int):
        t = torch.empty(shape, device=device, dtype=torch.float32).normal_(0, cfg["initializer_range"], generator=gen)
        return t.to(dtype).cpu()

    def ones(n: int):
        return torch.ones(n, dtype=dtype)

    w = {"model.embed_tokens.weight": normal(vocab, h), "model.norm.weight": ones(h)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w.update({p + "self_attn.q_proj.weight": normal(heads * d, h), p + "self_attn.k_proj.weight": normal(kv * d, h),
                  p + "self_attn.v_proj.weight": normal(kv * d, h), p + "self_attn.o_proj.weight": normal(h, heads * d),
                  p + "mlp.gate_proj.weight": normal(inter, h), p + "mlp.up_proj.weight": normal(inter, h),
                  p + "mlp.down_proj.weight": normal(h, inter),
                  p + "input_layernorm.weight": ones(h), p + "post_attention_layernorm.weight": ones(h)})
        if cfg["model_type"] == "qwen3":
            w.update({p + "self_attn.q_norm.weight": ones(d), p + "self_attn.k_norm.weight": ones(d)})
    if not cfg["tie_word_embeddings"]:
        w["lm_head.weight"] = normal(vocab, h)
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


def bench_model(args, overrides: dict, default_dtype: str) -> tuple[str | None, dict]:
    """The model directory a benchmark runs on (with ``--random-model``, one built now, on the GPU
    when one is there and not excluded) and the engine overrides left for LLM(...)."""
    import torch

    overrides = dict(overrides)
    model = overrides.pop("model", None)
    if getattr(args, "random_model", None):
        dtype = overrides.get("dtype", "auto")
        on_gpu = overrides.get("device", "auto") != "cpu" and torch.cuda.is_available()
        model = build_random_model(args.random_model, default_dtype if dtype == "auto" else dtype,
                                   "cuda" if on_gpu else "cpu")
        atexit.register(shutil.rmtree, model, True)  # (a temporary directory, gone with the run)
    return model, overrides
