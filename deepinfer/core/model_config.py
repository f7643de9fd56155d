"""config.json of a Hugging Face model directory, normalised across transformers 4 and 5 layouts."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelConfigError(ValueError):
    """The model directory or its config.json cannot be used."""


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """The facts a decoder-only model definition needs, whatever layout config.json used."""

    path: str
    architecture: str
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    layer_types: tuple[str, ...]
    sliding_window: int | None
    dtype: torch.dtype
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    raw: dict[str, Any] = field(repr=False, default_factory=dict)

    def layer_window(self, i: int) -> int | None:
        return self.sliding_window if self.layer_types[i] == "sliding_attention" else None


def _as_tuple(v: Any) -> tuple[int, ...]:
    if v is None:
        return ()
    return tuple(v) if isinstance(v, list | tuple) else (int(v),)


def _rope(raw: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    # transformers 5: rope_parameters = {"rope_type": ..., "rope_theta": ..., scaling fields}
    params = raw.get("rope_parameters")
    if isinstance(params, dict):
        theta = float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
        kind = params.get("rope_type", params.get("type", "default"))
        scaling = None if kind == "default" else {**params, "rope_type": kind}
        return theta, scaling
    # transformers 4: rope_theta + rope_scaling
    theta = float(raw.get("rope_theta", 10000.0))
    scaling = raw.get("rope_scaling")
    if scaling:
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        scaling = None if kind == "default" else {**scaling, "rope_type": kind}
    return theta, scaling or None


def _layer_types(raw: dict[str, Any], arch: str, n_layers: int) -> tuple[tuple[str, ...], int | None]:
    window = raw.get("sliding_window")
    types = raw.get("layer_types")
    if arch.startswith("Qwen") and not raw.get("use_sliding_window", False):
        window = None  # Qwen configs carry a window that is off unless use_sliding_window is set
    if types:
        if len(types) != n_layers:
            raise ModelConfigError(f"layer_types has {len(types)} entries for {n_layers} layers")
        if window is None:
            types = ["full_attention"] * n_layers
    elif window is not None and arch.startswith("Qwen"):
        max_window_layers = raw.get("max_window_layers", n_layers)
        types = ["sliding_attention" if i >= max_window_layers else "full_attention" for i in range(n_layers)]
    elif window is not None:
        types = ["sliding_attention"] * n_layers
    else:
        types = ["full_attention"] * n_layers
    bad = set(types) - {"sliding_attention", "full_attention"}
    if bad:
        raise ModelConfigError(f"unsupported layer_types {sorted(bad)}; supported: full_attention, sliding_attention")
    return tuple(types), (int(window) if window is not None and "sliding_attention" in types else None)


def read_model_config(path: str | Path) -> ModelConfig:
    """Read and normalise ``path/config.json``; errors say what is missing."""
    p = Path(path)
    if not p.is_dir():
        raise ModelConfigError(f"model directory {str(p)!r} " + ("is a file, not a directory; give the "
                               "directory that holds config.json" if p.exists() else "does not exist"))
    cfg_file = p / "config.json"
    if not cfg_file.is_file():
        raise ModelConfigError(
            f"model directory {str(p)!r} has no config.json; expected a Hugging Face model "
            "directory (config.json, *.safetensors, tokenizer.json)"
        )
    try:
        raw = json.loads(cfg_file.read_text())
    except json.JSONDecodeError as e:
        raise ModelConfigError(f"{cfg_file} is not valid JSON: {e}") from None
    archs = raw.get("architectures") or []
    if not archs:
        raise ModelConfigError(f"{cfg_file}: 'architectures' is missing or empty")
    try:
        n_heads = int(raw["num_attention_heads"])
        hidden = int(raw["hidden_size"])
        n_layers = int(raw["num_hidden_layers"])
    except KeyError as e:
        raise ModelConfigError(f"{cfg_file}: required field {e.args[0]!r} is missing") from None
    theta, scaling = _rope(raw)
    types, window = _layer_types(raw, archs[0], n_layers)
    dtype_name = raw.get("dtype") or raw.get("torch_dtype") or "float32"
    if dtype_name not in DTYPES:
        raise ModelConfigError(f"{cfg_file}: dtype {dtype_name!r} unsupported; use one of {sorted(DTYPES)}")
    gen_eos: tuple[int, ...] = ()
    gen_file = p / "generation_config.json"
    if gen_file.is_file():
        gen_eos = _as_tuple(json.loads(gen_file.read_text()).get("eos_token_id"))
    return ModelConfig(
        path=str(p),
        architecture=archs[0],
        hidden_size=hidden,
        num_hidden_layers=n_layers,
        num_attention_heads=n_heads,
        num_key_value_heads=int(raw.get("num_key_value_heads") or n_heads),
        head_dim=int(raw.get("head_dim") or hidden // n_heads),
        intermediate_size=int(raw["intermediate_size"]),
        vocab_size=int(raw["vocab_size"]),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        attention_bias=bool(raw.get("attention_bias", False)),
        layer_types=types,
        sliding_window=window,
        dtype=DTYPES[dtype_name],
        eos_token_ids=tuple(dict.fromkeys(_as_tuple(raw.get("eos_token_id")) + gen_eos)),
        bos_token_id=raw.get("bos_token_id"),
        raw=raw,
    )
