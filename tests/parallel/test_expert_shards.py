"""An expert-parallel rank holds, and reads from the checkpoint, only its slots' experts (the oracle:
transformers' expert weights); the plan of a weight move sends each new slot its expert from one
rank that held it (hand-computed). No process is spawned: a rank's model is built in this one."""
from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from deepinfer.builder import model_registry
from deepinfer.core.loader import load_model
from deepinfer.core.model_config import read_model_config
from deepinfer.models.expert_parallel_moe import _move_plan
from deepinfer.parallel.state import ExpertParallel, TensorParallel, building
from deepinfer_builtin.eplb.placement import expert_maps, identity_placement
from tests.tiny_models import make_model


class _NoAttention:
    """Loading builds no KV cache and runs no step: the attention backend is never called."""


def _rank_model(path, rank: int, size: int, redundant: int = 0):
    with building(TensorParallel(), ExpertParallel(rank, size, num_redundant_experts=redundant)):
        return load_model(read_model_config(path), model_registry(), _NoAttention(), torch.float32,
                          torch.device("cpu"), progress=False)


def _hf_expert(hf, e: int):
    experts = hf.model.layers[1].mlp.experts
    if hasattr(experts, "gate_up_proj"):  # (transformers' stacked experts)
        return experts.gate_up_proj[e], experts.down_proj[e]
    x = experts[e]
    return torch.cat([x.gate_proj.weight, x.up_proj.weight]), x.down_proj.weight


def test_rank_1_of_2_holds_experts_4_to_7_and_reads_no_other(tmp_path, monkeypatch):
    hf = make_model(tmp_path, "deepseek_v3", with_tokenizer=False, n_group=2, topk_group=1)  # 8 experts
    st_type = type(safe_open(str(next(tmp_path.glob("*.safetensors"))), framework="pt"))
    read: list[str] = []
    get_tensor = st_type.get_tensor
    monkeypatch.setattr(st_type, "get_tensor", lambda self, name: read.append(name) or get_tensor(self, name))
    model = _rank_model(tmp_path, 1, 2)
    experts_read = {int(n.split(".experts.")[1].split(".")[0]) for n in read if ".experts." in n}
    assert experts_read == {4, 5, 6, 7}  # (the others' tensors: an empty slice, never read)
    moe = model.moe_layers()[0]
    assert moe.slot_experts() == [4, 5, 6, 7]
    for slot, e in enumerate(range(4, 8)):
        w13, w2 = _hf_expert(hf, e)
        assert torch.equal(moe.w13[slot], w13) and torch.equal(moe.w2[slot], w2)
    assert torch.equal(model.model.embed_tokens.weight, hf.model.embed_tokens.weight)  # (dense parts whole)


def test_redundant_slots_start_as_replicas_of_the_first_experts(tmp_path):
    """12 slots over 4 ranks: rank 3 holds slots 9, 10, 11, which hold experts 1, 2, 3."""
    hf = make_model(tmp_path, "deepseek_v3", with_tokenizer=False, n_group=2, topk_group=1)
    moe = _rank_model(tmp_path, 3, 4, redundant=4).moe_layers()[0]
    assert moe.slot_experts() == [1, 2, 3]
    for slot, e in enumerate([1, 2, 3]):
        assert torch.equal(moe.w13[slot], _hf_expert(hf, e)[0])
    assert moe.logical_replica_count.tolist() == [2, 2, 2, 2, 1, 1, 1, 1]


def test_a_move_copies_within_a_rank_and_fetches_from_the_experts_first_holder():
    """2 ranks of 3 slots, from [0 1 2 | 3 0 1] to [0 0 3 | 1 2 1]: rank 0 keeps expert 0 in two slots
    (local copies) and fetches 3 from rank 1; rank 1 keeps 1 twice and fetches 2 from rank 0."""
    old, new = [0, 1, 2, 3, 0, 1], [0, 0, 3, 1, 2, 1]
    assert _move_plan(old, new, 3, 0, 2) == ([(0, 0), (1, 0)], [[], [2]], [[], [2]])
    assert _move_plan(old, new, 3, 1, 2) == ([(0, 2), (2, 2)], [[0], []], [[1], []])


def test_a_placement_for_other_slots_is_refused_before_any_weight_moves(tmp_path):
    """The ranks receive a placement's maps in the shapes of the engine's slots: another count is refused
    on rank 0, before it tells the ranks."""
    make_model(tmp_path, "deepseek_v3", with_tokenizer=False, n_group=2, topk_group=1)
    model = _rank_model(tmp_path, 0, 2, redundant=2)  # (10 slots)
    p2l = identity_placement(1, 8, 12)
    with pytest.raises(ValueError, match=r"10 physical expert slots a layer \(8 experts \+ 2 redundant\) has "
                                         r"physical_to_logical \[L, 10\] and logical_to_physical \[L, E, 3\], got "
                                         r"\(1, 12\) and \(1, 8, 5\)"):
        model.apply_placement(p2l, *expert_maps(p2l, 8))
    assert model.expert_placement is None
