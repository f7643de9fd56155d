"""Tiny random Hugging Face models and a tiny tokenizer, built offline for tests (the oracle)."""
from __future__ import annotations

import json
from pathlib import Path

import torch

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIALS = ["<|pad|>", "<|begin|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>"]


def make_tokenizer(out: Path, vocab_size: int = 320) -> None:
    """A byte-level BPE trained on a few sentences, with a chat template; writes tokenizer files."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    text = [
        "The quick brown fox jumps over the lazy dog. " * 3,
        "def read_config(path):\n    with open(path) as f:\n        return f.read()\n",
        "import os\nimport sys\nprint('hello world')\n",
        "Paged attention keeps the KV cache in fixed-size blocks. Über naïve café 日本語 🙂",
    ] * 4
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(text, trainer)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|begin|>", "eos_token": "<|end|>",
        "pad_token": "<|pad|>", "chat_template": CHAT_TEMPLATE, "model_max_length": 4096,
    }))


#: make_model's defaults for the DeepSeek arches: MLA with a q latent, 8 routed experts (2 a token)
#: and one shared expert, the first layer dense
DEEPSEEK = {"num_key_value_heads": 4, "kv_lora_rank": 32, "q_lora_rank": 48, "qk_nope_head_dim": 16,
            "qk_rope_head_dim": 8, "v_head_dim": 16, "moe_intermediate_size": 32, "n_routed_experts": 8,
            "num_experts_per_tok": 2, "n_shared_experts": 1, "first_k_dense_replace": 1}


def make_model(out: Path, arch: str = "llama", dtype: torch.dtype = torch.float32, seed: int = 0,
               with_tokenizer: bool = True, **overrides):
    """Save a tiny random model of ``arch`` (llama, qwen2, qwen3, mistral, deepseek_v2, deepseek_v3)
    to ``out``; return it."""
    import transformers as tf

    base = {"vocab_size": 320, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 1024,
            "eos_token_id": 2, "bos_token_id": 1, "pad_token_id": 0}
    if arch == "qwen3":
        base.update(head_dim=16)
    if arch.startswith("deepseek"):
        base.update(DEEPSEEK)
    base.update(overrides)
    cfg_cls, model_cls = {
        "llama": (tf.LlamaConfig, tf.LlamaForCausalLM),
        "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM),
        "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM),
        "mistral": (tf.MistralConfig, tf.MistralForCausalLM),
        "deepseek_v2": (tf.DeepseekV2Config, tf.DeepseekV2ForCausalLM),
        "deepseek_v3": (tf.DeepseekV3Config, tf.DeepseekV3ForCausalLM),
    }[arch]
    torch.manual_seed(seed)
    model = model_cls(cfg_cls(**base)).to(dtype).eval()
    if arch == "deepseek_v3":  # transformers initialises the correction bias to zeros: make it matter
        with torch.no_grad():
            for layer in model.model.layers:
                if hasattr(layer.mlp, "gate"):
                    layer.mlp.gate.e_score_correction_bias.copy_(torch.randn(model.config.n_routed_experts) * 0.05)
    model.save_pretrained(out)
    if with_tokenizer:
        make_tokenizer(out)
    return model


def hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    """transformers' greedy continuation of ``prompt``: the oracle for token-for-token checks."""
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                             eos_token_id=None, pad_token_id=0, attention_mask=torch.ones(1, len(prompt),
                                                                                          dtype=torch.long))
    return out[0, len(prompt):].tolist()


def hybrid(window: int, layer_types: tuple[str, ...] = ("sliding_attention", "full_attention")) -> dict:
    """make_model overrides for a tiny Qwen3 mixing sliding-window and full-attention layers."""
    return {"num_hidden_layers": len(layer_types), "use_sliding_window": True, "sliding_window": window,
            "max_window_layers": 0, "layer_types": list(layer_types)}


def constant_model(out: Path, probs: list[float], vocab_size: int = 320, seed: int = 0, **overrides):
    """A tiny Llama whose next-token distribution is ``probs`` (then e^-30 for each later token)
    whatever the context: every token embeds to the same vector, the layers add nothing to the
    residual stream (zero output projections), and the LM head maps the normed vector to the logits
    log(probs). For tests that need a target and a draft of known, fixed distributions."""
    model = make_model(out, "llama", seed=seed, vocab_size=vocab_size, tie_word_embeddings=False, **overrides)
    hidden = model.config.hidden_size
    logits = torch.full((vocab_size,), -30.0)
    logits[:len(probs)] = torch.tensor(probs).log()
    with torch.no_grad():
        model.model.embed_tokens.weight.fill_(1.0)  # RMSNorm of a vector of ones: ones (unit norm weights)
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.lm_head.weight.copy_((logits / hidden)[:, None].expand(vocab_size, hidden))
    model.save_pretrained(out)
    return model
