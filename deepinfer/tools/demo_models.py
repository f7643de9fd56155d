"""The demo pair's architectures (see train_demo.py): a Qwen3 target with 3:1 sliding/full hybrid
attention and a small full-attention Qwen3 draft (2 layers, MLP 768 unless told), both on the corpus's tokenizer."""

from __future__ import annotations

try:
    from deepinfer.tools import demo_data
except ImportError:  # train_demo.py run as a plain file has put this directory on sys.path
    import demo_data


def target_config():
    from transformers import Qwen3Config

    layers = 8
    layer_types = ["full_attention" if i % 4 == 3 else "sliding_attention" for i in range(layers)]
    return Qwen3Config(
        vocab_size=demo_data.VOCAB_SIZE, hidden_size=384, intermediate_size=1024,
        num_hidden_layers=layers, num_attention_heads=6, num_key_value_heads=2, head_dim=64,
        max_position_embeddings=demo_data.MAX_POSITIONS, rope_theta=10000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=True, use_sliding_window=True, sliding_window=256,
        # Only consulted by transformers when layer_types is None; explicit layer_types wins.
        # 0 = "no leading layers forced to full attention" (layer 0 is sliding here).
        max_window_layers=0, layer_types=layer_types,
        bos_token_id=demo_data.BOS_ID, eos_token_id=demo_data.EOS_ID, pad_token_id=demo_data.PAD_ID,
    )


#: the shipped draft's depth and MLP width (train-demo's defaults: --draft-layers, --draft-mlp)
DRAFT_LAYERS, DRAFT_MLP = 2, 768


def draft_config(layers: int = DRAFT_LAYERS, intermediate: int = DRAFT_MLP):
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=demo_data.VOCAB_SIZE, hidden_size=256, intermediate_size=intermediate,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
        max_position_embeddings=demo_data.MAX_POSITIONS, rope_theta=10000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=True, use_sliding_window=False,
        layer_types=["full_attention"] * layers,
        bos_token_id=demo_data.BOS_ID, eos_token_id=demo_data.EOS_ID, pad_token_id=demo_data.PAD_ID,
    )


def build_model(config, seed: int):
    import torch
    from transformers import GenerationConfig, Qwen3ForCausalLM

    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=demo_data.BOS_ID, eos_token_id=demo_data.EOS_ID, pad_token_id=demo_data.PAD_ID)
    return model


def count_params(model) -> int:
    return sum(p.numel() for p in model.parameters())  # tied weights counted once
