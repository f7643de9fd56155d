"""The EPLB placement (``deepinfer_builtin.eplb.placement``) against placements worked out by hand on
small loads, and its invariants on random ones: every expert placed, counts that add up, maps that
invert each other, groups kept on their node, and a busiest rank no busier than under the static
sharding (within 9% of the mean on skewed loads with redundant slots)."""
from __future__ import annotations

import pytest
import torch

from deepinfer_builtin.eplb.placement import (
    balanced_packing,
    identity_placement,
    imbalance,
    rank_loads,
    rebalance_experts,
    replicate_experts,
)


def test_balanced_packing_puts_the_heaviest_item_on_the_lightest_bin_with_room():
    # items 7 5 4 3 2 1 into 2 bins of 3: 7->A(7) 5->B(5) 4->B(9) 3->A(10) 2->B(11, full) 1->A(11)
    bins, pos = balanced_packing(torch.tensor([[3.0, 7.0, 1.0, 5.0, 2.0, 4.0]]), 2)
    assert bins.tolist() == [[0, 0, 0, 1, 1, 1]]
    assert pos.tolist() == [[1, 0, 2, 0, 2, 1]]


@pytest.mark.parametrize("num_bins", [1, 3, 8])
def test_balanced_packing_fills_every_bin_with_as_many_items(num_bins):
    weights = torch.rand(5, 24, generator=torch.Generator().manual_seed(num_bins))
    bins, pos = balanced_packing(weights, num_bins)
    for row_bins, row_pos in zip(bins, pos, strict=True):
        assert torch.bincount(row_bins, minlength=num_bins).tolist() == [24 // num_bins] * num_bins
        for b in range(num_bins):  # positions 0.. in each bin, once each
            assert sorted(row_pos[row_bins == b].tolist()) == list(range(24 // num_bins))


def test_replication_gives_each_redundant_slot_to_the_highest_load_per_replica():
    # [40 10 30 20]: 40 is highest -> 2 replicas (20 each); then 30 is highest -> 2 replicas (15 each)
    slot_to_expert, count = replicate_experts(torch.tensor([[40.0, 10.0, 30.0, 20.0]]), 6)
    assert slot_to_expert.tolist() == [[0, 1, 2, 3, 0, 2]]
    assert count.tolist() == [[2, 1, 2, 1]]


def test_global_placement_by_hand_on_two_layers():
    """Four experts, two redundant slots, two GPUs of three slots; no group constraint.

    Layer 0, load [40 10 30 20]: replicas e0 e1 e2 e3 e0 e2 (above), per replica 20 10 15 20 20 15.
    Heaviest first onto the lighter GPU (ties: the lower GPU): slot0 20->G0(20), slot3 20->G1(20),
    slot4 20->G0(40), slot2 15->G1(35), slot5 15->G1(50, full), slot1 10->G0(50).
    G0 = [e0 e0 e1], G1 = [e3 e2 e2]: 50 tokens each.
    Layer 1, load [20 30 10 40]: e3 (40) then e1 (30) replicated; per replica 20 15 10 20 20 15 for
    e0 e1 e2 e3 e3 e1: slot0->G0(20), slot3->G1(20), slot4->G0(40), slot1->G1(35), slot5->G1(50),
    slot2->G0(50). G0 = [e0 e3 e2], G1 = [e3 e1 e1]."""
    load = torch.tensor([[40, 10, 30, 20], [20, 30, 10, 40]])
    p = rebalance_experts(load, num_replicas=6, num_groups=1, num_nodes=1, num_gpus=2)
    assert p.physical_to_logical.tolist() == [[0, 0, 1, 3, 2, 2], [0, 3, 2, 3, 1, 1]]
    assert p.logical_replica_count.tolist() == [[2, 1, 2, 1], [1, 2, 1, 2]]
    # each expert's slots, lowest first, padded to 6 - 4 + 1 = 3 with -1
    assert p.logical_to_physical.tolist() == [
        [[0, 1, -1], [2, -1, -1], [4, 5, -1], [3, -1, -1]],
        [[0, -1, -1], [4, 5, -1], [2, -1, -1], [1, 3, -1]],
    ]
    assert rank_loads(load, p.physical_to_logical, 2).tolist() == [[50, 50], [50, 50]]


def test_hierarchical_placement_by_hand():
    """Eight experts in four groups of two, two nodes of two GPUs, twelve slots (three a GPU).

    Load [90 10 | 40 24 | 5 5 | 15 15]; groups g0 100, g1 64, g2 10, g3 30, two a node:
    g0->N0(100), g1->N1(64), g3->N1(94, full), g2->N0(110). N0 holds e0 e1 e4 e5, N1 e2 e3 e6 e7.
    N0, six slots for [90 10 5 5]: e0 twice more (90 -> 45 -> 30 a replica); per replica
    30 10 5 5 30 30 (e0 e1 e4 e5 e0 e0): 30->G0(30), 30->G1(30), 30->G0(60), 10->G1(40),
    5 (e4)->G1(45, full), 5 (e5)->G0(65). G0 = [e0 e0 e5], G1 = [e0 e1 e4].
    N1, six slots for [40 24 15 15]: e2 (40 -> 20), then e3 (24 -> 12); per replica 20 12 15 15 20 12
    (e2 e3 e6 e7 e2 e3): 20->G2(20), 20->G3(20), 15 (e6)->G2(35), 15 (e7)->G3(35), 12 (e3)->G2(47),
    12 (e3)->G3(47). G2 = [e2 e6 e3], G3 = [e2 e7 e3]."""
    load = torch.tensor([[90, 10, 40, 24, 5, 5, 15, 15]])
    p = rebalance_experts(load, num_replicas=12, num_groups=4, num_nodes=2, num_gpus=4)
    assert p.physical_to_logical.tolist() == [[0, 0, 5, 0, 1, 4, 2, 6, 3, 2, 7, 3]]
    assert p.logical_replica_count.tolist() == [[3, 1, 2, 2, 1, 1, 1, 1]]
    assert p.logical_to_physical[0, :, :3].tolist() == [[0, 1, 3], [4, -1, -1], [6, 9, -1], [8, 11, -1],
                                                        [5, -1, -1], [2, -1, -1], [7, -1, -1], [10, -1, -1]]
    assert p.logical_to_physical.shape == (1, 8, 12 - 8 + 1)
    # ranks: 30+30+5, 30+10+5, 20+15+12, 20+15+12 tokens; mean 204 / 4 = 51
    assert rank_loads(load, p.physical_to_logical, 4).tolist() == [[65, 45, 47, 47]]
    assert imbalance(load, p.physical_to_logical, 4) == pytest.approx(65 / 51)


def test_groups_that_do_not_divide_over_the_nodes_take_the_global_policy():
    load = torch.tensor([[90, 10, 40, 24, 5, 5, 15, 15]])
    grouped = rebalance_experts(load, num_replicas=12, num_groups=2, num_nodes=4, num_gpus=4)
    assert torch.equal(grouped.physical_to_logical,
                       rebalance_experts(load, num_replicas=12, num_groups=1, num_nodes=1, num_gpus=4)[0])
    # (and the global placement is not the hierarchical one of the test above)
    assert grouped.physical_to_logical.tolist() != [[0, 0, 5, 0, 1, 4, 2, 6, 3, 2, 7, 3]]


@pytest.mark.parametrize(("sizes", "message"), [
    ((8, 6, 1, 1, 2), "cannot hold 8 logical experts"),
    ((8, 10, 1, 1, 4), "do not divide over 4 GPUs"),
    ((8, 12, 4, 3, 4), "4 GPUs do not divide over 3 nodes"),
    ((8, 12, 3, 1, 4), "8 experts do not divide into 3 groups"),
    ((8, 8, 1, 1, 0), "must each be at least 1"),
])
def test_inconsistent_sizes_are_refused_with_what_to_change(sizes, message):
    num_logical, num_replicas, num_groups, num_nodes, num_gpus = sizes
    with pytest.raises(ValueError, match=message):
        rebalance_experts(torch.ones(2, num_logical), num_replicas, num_groups, num_nodes, num_gpus)


@pytest.mark.parametrize("load", [torch.ones(8), -torch.ones(1, 8), torch.full((1, 8), float("nan"))])
def test_a_load_that_is_no_token_count_matrix_is_refused(load):
    with pytest.raises(ValueError, match="load must be"):
        rebalance_experts(load, 8, 1, 1, 2)


# (experts, redundant, groups, nodes, GPUs): global, hierarchical, groups not over nodes (global),
# DeepSeek-V3's 256 experts in 8 groups over 4 nodes of 8 GPUs, a single node
RANDOM_CASES = [(64, 0, 1, 1, 8), (64, 16, 8, 2, 8), (48, 0, 6, 4, 8), (256, 32, 8, 4, 32), (160, 0, 8, 1, 8)]


def _random_load(seed: int, num_logical: int, layers: int = 3) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(layers, num_logical, generator=g) ** 3 * 1000).round()


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("case", RANDOM_CASES, ids=str)
def test_placement_invariants_on_random_loads(case, seed):
    num_logical, redundant, num_groups, num_nodes, num_gpus = case
    num_replicas = num_logical + redundant
    load = _random_load(seed, num_logical)
    p2l, l2p, count = rebalance_experts(load, num_replicas, num_groups, num_nodes, num_gpus)
    layers = load.shape[0]
    assert p2l.shape == (layers, num_replicas) and l2p.shape == (layers, num_logical, redundant + 1)
    assert (count >= 1).all() and (count.sum(dim=1) == num_replicas).all()
    for layer in range(layers):
        assert torch.equal(torch.bincount(p2l[layer], minlength=num_logical), count[layer])
        for expert in range(num_logical):
            slots = l2p[layer, expert]
            n = count[layer, expert].item()
            assert (slots[n:] == -1).all() and (slots[:n] >= 0).all()
            assert (p2l[layer, slots[:n]] == expert).all()  # the maps invert each other
        assert sorted(l2p[layer][l2p[layer] >= 0].tolist()) == list(range(num_replicas))
    if num_groups % num_nodes == 0:  # every replica of a group's experts on the group's node
        node_of_slot = torch.arange(num_replicas) // (num_replicas // num_nodes)
        group_of_slot = p2l // (num_logical // num_groups)
        for layer in range(layers):
            for group in range(num_groups):
                assert node_of_slot[group_of_slot[layer] == group].unique().numel() == 1


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("case", RANDOM_CASES, ids=str)
def test_busiest_rank_is_no_busier_than_under_the_static_sharding(case, seed):
    """Greedy packing is no optimum: on tiny shapes (3 GPUs of 4 experts) a lucky static split can
    beat it; with DeepSeek's shapes (many experts a GPU) it is below, layer by layer."""
    num_logical, redundant, num_groups, num_nodes, num_gpus = case
    load = _random_load(seed, num_logical)
    placed = rebalance_experts(load, num_logical + redundant, num_groups, num_nodes, num_gpus)
    static = identity_placement(load.shape[0], num_logical, num_logical + redundant)
    for layer in range(load.shape[0]):
        one = load[layer:layer + 1]
        assert (imbalance(one, placed.physical_to_logical[layer:layer + 1], num_gpus)
                <= imbalance(one, static[layer:layer + 1], num_gpus))


@pytest.mark.parametrize(("num_hot", "redundant"), [(1, 8), (2, 16), (4, 16), (4, 32)])
def test_skewed_load_with_redundant_slots_is_within_9_percent_of_the_mean(num_hot, redundant):
    """64 experts over 8 GPUs, a few of them 20 times hotter than the rest: the static sharding's
    busiest GPU carries more than twice the mean; with redundant slots, at most 1.09 times it."""
    g = torch.Generator().manual_seed(num_hot)
    load = torch.rand(4, 64, generator=g) * 100 + 50
    for layer in range(4):
        load[layer, torch.randperm(64, generator=g)[:num_hot]] *= 20
    placed = rebalance_experts(load, 64 + redundant, num_groups=1, num_nodes=1, num_gpus=8)
    assert imbalance(load, identity_placement(4, 64, 64 + redundant), 8) > 2
    assert imbalance(load, placed.physical_to_logical, 8) <= 1.09


def test_imbalance_is_the_busiest_rank_over_the_mean_summed_over_layers():
    # layer 0: ranks 30 and 10 (mean 20); layer 1: ranks 5 and 15 (mean 10): (30 + 15) / (20 + 10)
    load = torch.tensor([[20.0, 10.0, 6.0, 4.0], [2.0, 3.0, 7.0, 8.0]])
    p2l = torch.tensor([[0, 1, 2, 3], [0, 1, 2, 3]])
    assert rank_loads(load, p2l, 2).tolist() == [[30, 10], [5, 15]]
    assert imbalance(load, p2l, 2) == pytest.approx(45 / 30)
    assert imbalance(torch.zeros(2, 4), p2l, 2) == 0.0
