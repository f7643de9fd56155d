"""config.json in the layouts found in the wild normalises to the same facts."""
from __future__ import annotations

import json

import pytest
import torch

from deepinfer.core.model_config import ModelConfigError, read_model_config

BASE = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 320,
        "max_position_embeddings": 1024, "eos_token_id": [2, 3]}
LLAMA3 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}


def _write(tmp_path, cfg):
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return read_model_config(tmp_path)


def test_transformers4_and_transformers5_layouts_agree(tmp_path):
    v4 = _write(tmp_path, {**BASE, "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", **LLAMA3},
                           "torch_dtype": "bfloat16"})
    v5 = _write(tmp_path, {**BASE, "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, **LLAMA3},
                           "dtype": "bfloat16"})
    for c in (v4, v5):
        assert c.rope_theta == 500000.0 and c.rope_scaling["rope_type"] == "llama3"
        assert c.rope_scaling["factor"] == 8.0 and c.dtype == torch.bfloat16
        assert c.eos_token_ids == (2, 3) and c.head_dim == 16
    # the legacy "type" key and a default rope both work
    legacy = _write(tmp_path, {**BASE, "rope_scaling": {"type": "linear", "factor": 2.0}})
    assert legacy.rope_scaling["rope_type"] == "linear" and legacy.dtype == torch.float32
    plain = _write(tmp_path, {**BASE, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}})
    assert plain.rope_scaling is None and plain.rope_theta == 10000.0


def test_qwen_window_is_off_unless_use_sliding_window(tmp_path):
    q = {**BASE, "architectures": ["Qwen2ForCausalLM"], "sliding_window": 32, "max_window_layers": 1}
    assert _write(tmp_path, q).sliding_window is None
    on = _write(tmp_path, {**q, "use_sliding_window": True})
    assert on.layer_types == ("full_attention", "sliding_attention") and on.sliding_window == 32
    mistral = _write(tmp_path, {**BASE, "architectures": ["MistralForCausalLM"], "sliding_window": 32})
    assert mistral.layer_types == ("sliding_attention", "sliding_attention")


def test_bad_configs_say_what_is_wrong(tmp_path):
    with pytest.raises(ModelConfigError, match="'architectures' is missing"):
        _write(tmp_path, {k: v for k, v in BASE.items() if k != "architectures"})
    with pytest.raises(ModelConfigError, match="required field 'hidden_size' is missing"):
        _write(tmp_path, {k: v for k, v in BASE.items() if k != "hidden_size"})
    with pytest.raises(ModelConfigError, match="dtype 'int8' unsupported"):
        _write(tmp_path, {**BASE, "torch_dtype": "int8"})
    with pytest.raises(ModelConfigError, match="unsupported layer_types"):
        _write(tmp_path, {**BASE, "sliding_window": 8, "layer_types": ["chunked_attention", "full_attention"]})
