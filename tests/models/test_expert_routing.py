"""Routing under an expert placement (``physical_expert_ids``): each pair goes to a replica of its own
expert, and an expert's replicas share its tokens within one of each other (counted per replica)."""
from __future__ import annotations

import torch

from deepinfer.models.moe import physical_expert_ids
from deepinfer_builtin.eplb.placement import expert_maps

# four experts on seven slots: e0 on slots 0, 4, 5; e1 on 1; e2 on 2, 6; e3 on 3
PHYSICAL_TO_LOGICAL = torch.tensor([[0, 1, 2, 3, 0, 0, 2]])


def _maps() -> tuple[torch.Tensor, torch.Tensor]:
    l2p, count = expert_maps(PHYSICAL_TO_LOGICAL, 4)
    return l2p[0], count[0]


def test_pairs_take_their_experts_replicas_in_turn_by_token_order():
    # e0's pairs (tokens 0, 1, 3, 4 in order) take its slots 0, 4, 5, 0; e2's (tokens 0, 2, 3) 2, 6, 2
    topk_ids = torch.tensor([[0, 2], [0, 1], [2, 3], [2, 0], [0, 3]], dtype=torch.int32)
    got = physical_expert_ids(topk_ids, *_maps())
    assert got.dtype == torch.int32
    assert got.tolist() == [[0, 2], [4, 1], [6, 3], [2, 5], [0, 3]]


def test_replicas_of_an_expert_get_tokens_within_one_of_each_other():
    g = torch.Generator().manual_seed(0)
    # 1,000 tokens, top-2 of 4 experts (distinct per token), skewed towards e0
    scores = torch.rand(1000, 4, generator=g) + torch.tensor([0.6, 0.0, 0.3, 0.0])
    topk_ids = scores.topk(2, dim=-1).indices.to(torch.int32)
    physical = physical_expert_ids(topk_ids, *_maps())
    assert torch.equal(PHYSICAL_TO_LOGICAL[0][physical.long()], topk_ids.long())  # each pair on its expert
    per_slot = torch.bincount(physical.flatten().long(), minlength=7)
    for slots in ([0, 4, 5], [2, 6]):
        tokens = per_slot[slots]
        assert tokens.max() - tokens.min() <= 1 and tokens.sum() == (topk_ids == PHYSICAL_TO_LOGICAL[0, slots[0]]).sum()
