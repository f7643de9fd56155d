"""Random-weight models at named shapes, built from a config and saved with safetensors in the run."""
from __future__ import annotations

import atexit
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


def build_random_model(shape: str, dtype: str = "float32", device: str = "cpu", out: str | None = None,
                       hybrid_window: int | None = None, **overrides) -> str:
    """Save a random model of a named shape and return its directory (needs transformers).

    ``hybrid_window``: make it a hybrid Qwen3, 3 sliding-window layers (of that window) to 1
    full-attention layer; ``overrides`` replace config fields."""
    import torch
    import transformers as tf

    if shape not in SHAPES:
        raise ValueError(f"unknown model shape {shape!r}; known: {', '.join(SHAPES)}")
    arch, cfg = SHAPES[shape]
    cfg = {**cfg, **overrides}
    if hybrid_window is not None:
        if arch != "qwen3":
            raise ValueError(f"a hybrid sliding-window model needs a qwen3 shape, not {shape!r}")
        n = cfg["num_hidden_layers"]
        cfg.update(use_sliding_window=True, sliding_window=hybrid_window, max_window_layers=0,
                   layer_types=["full_attention" if i % 4 == 3 else "sliding_attention" for i in range(n)])
    cfg_cls, model_cls = {"llama": (tf.LlamaConfig, tf.LlamaForCausalLM),
                          "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM)}[arch]
    path = Path(out or tempfile.mkdtemp(prefix=f"deepinfer-{shape}-"))
    torch.manual_seed(0)
    with torch.device(device):
        model = model_cls(cfg_cls(**cfg, torch_dtype=getattr(torch, dtype))).to(getattr(torch, dtype))
    model.save_pretrained(path)
    # on disk now, before a benchmark times anything: the kernel writes dirty pages back about 30 s
    # later, and on an H200 host two of six batch-1 runs started one after another were 8-13% slower
    # (four runs with the previous run's files flushed first were not)
    os.sync()
    return str(path)


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
