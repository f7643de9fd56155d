"""Each rank's model holds, and reads from the checkpoint, only its slice of each tensor (the
oracle: transformers' weights, sliced by heads, MLP columns and vocabulary rows)."""
from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from deepinfer.builder import model_registry
from deepinfer.core.loader import load_model
from deepinfer.core.model_config import read_model_config
from deepinfer.parallel.state import TensorParallel, building
from tests.tiny_models import make_model


class _NoAttention:
    """Loading builds no KV cache and runs no step: the attention backend is never called."""


def _rank_model(path, rank: int, size: int):
    with building(TensorParallel(rank, size)):
        return load_model(read_model_config(path), model_registry(), _NoAttention(), torch.float32,
                          torch.device("cpu"), progress=False)


@pytest.mark.parametrize("rank", [0, 1, 2, 3])
def test_four_ranks_of_two_kv_heads_hold_their_heads_and_the_kv_head_they_read(tmp_path, rank):
    hf = make_model(tmp_path, "qwen2", with_tokenizer=False, vocab_size=322)  # (qkv biases; 4 heads, 2 KV heads)
    model = _rank_model(tmp_path, rank, 4)
    d, kv_head = 16, rank // 2
    ref = hf.model.layers[1].self_attn
    attn = model.model.layers[1].self_attn
    want = torch.cat([ref.q_proj.weight[rank * d:(rank + 1) * d], ref.k_proj.weight[kv_head * d:(kv_head + 1) * d],
                      ref.v_proj.weight[kv_head * d:(kv_head + 1) * d]])
    assert torch.equal(attn.qkv_proj.weight, want)
    assert torch.equal(attn.qkv_proj.bias[:d], ref.q_proj.bias[rank * d:(rank + 1) * d])
    assert torch.equal(attn.o_proj.weight, ref.o_proj.weight[:, rank * d:(rank + 1) * d])
    mlp, ref_mlp, w = model.model.layers[1].mlp, hf.model.layers[1].mlp, 128 // 4
    assert torch.equal(mlp.gate_up_proj.weight, torch.cat([ref_mlp.gate_proj.weight[rank * w:(rank + 1) * w],
                                                           ref_mlp.up_proj.weight[rank * w:(rank + 1) * w]]))
    assert torch.equal(mlp.down_proj.weight, ref_mlp.down_proj.weight[:, rank * w:(rank + 1) * w])
    rows = 81  # ceil(322 / 4); the last rank holds 79 and two zero rows of padding
    held = min(322, (rank + 1) * rows) - rank * rows
    assert torch.equal(model.lm_head.weight[:held], hf.lm_head.weight[rank * rows:rank * rows + held])
    assert not model.lm_head.weight[held:].any()


def test_a_rank_reads_only_its_slices_of_the_split_tensors(tmp_path, monkeypatch):
    make_model(tmp_path, "llama", with_tokenizer=False)
    whole: list[str] = []
    get_tensor = type(safe_open(str(next(tmp_path.glob("*.safetensors"))), framework="pt")).get_tensor

    def spy(self, name):
        whole.append(name)
        return get_tensor(self, name)

    monkeypatch.setattr(type(safe_open(str(next(tmp_path.glob("*.safetensors"))), framework="pt")), "get_tensor", spy)
    _rank_model(tmp_path, 1, 2)
    assert whole and all(name.endswith("norm.weight") for name in whole)  # (norms are replicated)


def test_a_deepseek_rank_holds_its_heads_and_expert_columns_from_stacked_experts_too(tmp_path):
    """From the per-expert checkpoint (slices read) and from transformers' in-memory stacked experts
    (cut after reading), rank 1 of 2 gets the same tensors: its heads of q_b_proj, kv_b_proj and
    o_proj, its half of every expert's width, the latent projections whole."""
    hf = make_model(tmp_path, "deepseek_v3", with_tokenizer=False, n_group=2, topk_group=1)
    model = _rank_model(tmp_path, 1, 2)
    state = hf.state_dict()
    assert any(name.endswith("experts.gate_up_proj") for name in state)  # (the stacked layout is exercised)
    attn, ref = model.model.layers[1].self_attn, hf.model.layers[1].self_attn
    # (the rows of q_b_proj and kv_a_proj that make rope dims are reordered at load, within each head:
    # those two against the single-process model's)
    whole = _rank_model(tmp_path, 0, 1).model.layers[1].self_attn
    assert not torch.equal(whole.q_b_proj.weight, ref.q_b_proj.weight)          # (reordered indeed)
    assert torch.equal(attn.q_b_proj.weight, whole.q_b_proj.weight[2 * 24:])    # heads 2, 3 of 4 (24 rows a head)
    assert torch.equal(attn.kv_b_proj.weight, ref.kv_b_proj.weight[2 * 32:])    # (16 + 16 rows a head)
    assert torch.equal(attn.o_proj.weight, ref.o_proj.weight[:, 2 * 16:])
    assert torch.equal(attn.kv_a_proj_with_mqa.weight, whole.kv_a_proj_with_mqa.weight)
    with building(TensorParallel(1, 2)):
        stacked = type(model)(model.config, _NoAttention())
    stacked.to_empty(device="cpu")

    def rank_view(name, t):
        part = stacked.weight_shard(name)
        return t if part is None else t.narrow(*part)

    stacked.load_weights((name, rank_view(name, t)) for name, t in state.items())
    for (name, want), got in zip(model.state_dict().items(), stacked.state_dict().values(), strict=True):
        assert torch.equal(want, got), name
