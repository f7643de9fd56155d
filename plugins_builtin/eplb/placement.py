"""Where each MoE layer's experts run: which experts get redundant replicas and which rank holds each
replica, chosen from the experts' recent load (DeepSeek's expert-parallel load balancer, EPLB).

Pure torch on the host, no deepinfer imports. A layer has ``num_replicas`` physical expert slots,
``num_replicas / num_gpus`` on each rank (GPU); slot ``p`` is on rank ``p // slots_per_gpu``. Every
logical expert has at least one replica; the redundant slots go to the hottest experts, and an
expert's tokens are split evenly among its replicas.

Hierarchical policy (``num_groups`` divisible by ``num_nodes``): (1) the expert groups go to nodes,
as many to each, balancing the groups' load; (2) on each node its experts get the node's redundant
slots, one at a time, each to the expert with the highest load per replica; (3) the node's replicas
go to its GPUs, as many to each, balancing the load per replica. Experts of a group then stay on one
node (DeepSeek-V3 routes a token to at most ``topk_group`` groups, so to few nodes). Otherwise the
global policy: (2) and (3) over all experts and all GPUs, as one node of one group.

Every packing is greedy: the heaviest item first, each onto the lightest bin that still has room
(ties: the earlier item, the lower bin); so is every replication (ties: the lower expert).
"""
from __future__ import annotations

import heapq
from typing import NamedTuple

import torch


class Placement(NamedTuple):
    """A placement of every MoE layer's experts on the physical slots."""

    physical_to_logical: torch.Tensor    # int64 [L, num_replicas]: the logical expert slot p holds
    logical_to_physical: torch.Tensor    # int64 [L, num_logical, max_replicas]: an expert's slots, lowest
    #                                      first, padded with -1; max_replicas = num_replicas - num_logical + 1
    logical_replica_count: torch.Tensor  # int64 [L, num_logical]: how many slots hold each expert


def balanced_packing(weights: torch.Tensor, num_bins: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's n items [X, n] into ``num_bins`` bins of n / num_bins items, greedily: the heaviest
    item first, onto the lightest bin with room. (bin [X, n], position in its bin [X, n]), int64."""
    rows, n = weights.shape
    per_bin = n // num_bins
    order = weights.double().sort(dim=-1, descending=True, stable=True).indices.tolist()
    values = weights.double().tolist()
    bins = torch.empty(rows, n, dtype=torch.int64)
    positions = torch.empty(rows, n, dtype=torch.int64)
    for r in range(rows):
        open_bins = [(0.0, b) for b in range(num_bins)]  # (load, bin): the lightest, then the lowest, first
        filled = [0] * num_bins
        row_bins, row_pos = [0] * n, [0] * n
        for item in order[r]:
            load, b = heapq.heappop(open_bins)
            row_bins[item], row_pos[item] = b, filled[b]
            filled[b] += 1
            if filled[b] < per_bin:
                heapq.heappush(open_bins, (load + values[r][item], b))
        bins[r] = torch.tensor(row_bins)
        positions[r] = torch.tensor(row_pos)
    return bins, positions


def replicate_experts(weights: torch.Tensor, num_slots: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``num_slots`` replicas of each row's n experts [X, n]: one each, then every redundant slot to
    the expert with the highest load per replica. (slot -> expert [X, num_slots], replica count
    [X, n]), int64; slots n.. hold the redundant replicas in the order they were given."""
    rows, n = weights.shape
    slot_to_expert = torch.arange(num_slots, dtype=torch.int64).repeat(rows, 1)
    count = torch.ones(rows, n, dtype=torch.int64)
    every_row = torch.arange(rows)
    for slot in range(n, num_slots):
        hottest = (weights.double() / count).argmax(dim=-1)  # (the first of equals: the lower expert)
        slot_to_expert[:, slot] = hottest
        count[every_row, hottest] += 1
    return slot_to_expert, count


def check_sizes(num_logical: int, num_replicas: int, num_groups: int, num_nodes: int, num_gpus: int) -> None:
    """Raise ValueError, saying what to change, where the sizes cannot make a placement."""
    if min(num_logical, num_groups, num_nodes, num_gpus) < 1:
        raise ValueError(f"experts ({num_logical}), groups ({num_groups}), nodes ({num_nodes}) and GPUs "
                         f"({num_gpus}) must each be at least 1")
    if num_replicas < num_logical:
        raise ValueError(f"{num_replicas} replicas cannot hold {num_logical} logical experts: give at least "
                         "one slot per expert (num_replicas = experts + redundant experts)")
    if num_replicas % num_gpus:
        raise ValueError(f"{num_replicas} replicas do not divide over {num_gpus} GPUs; each GPU holds as many "
                         "slots: choose the redundant experts so that experts + redundant is a multiple of GPUs")
    if num_gpus % num_nodes:
        raise ValueError(f"{num_gpus} GPUs do not divide over {num_nodes} nodes; give each node as many GPUs")
    if num_logical % num_groups:
        raise ValueError(f"{num_logical} experts do not divide into {num_groups} groups of equal size")


def rebalance_experts(load: torch.Tensor, num_replicas: int, num_groups: int = 1, num_nodes: int = 1,
                      num_gpus: int = 1) -> Placement:
    """The placement of every layer's experts for ``load`` [L, num_logical] (tokens per expert over a
    window): the hierarchical policy where ``num_groups`` divides over ``num_nodes``, else the global one."""
    if load.dim() != 2:
        raise ValueError(f"load must be [num_moe_layers, num_logical_experts], got shape {tuple(load.shape)}")
    load = load.detach().double().cpu()
    if not torch.isfinite(load).all() or (load < 0).any():
        raise ValueError("load must be finite and non-negative (tokens per expert)")
    num_logical = load.shape[1]
    check_sizes(num_logical, num_replicas, num_groups, num_nodes, num_gpus)
    if num_groups % num_nodes:
        num_groups, num_nodes = 1, 1  # the global policy: every expert may go to any GPU
    physical_to_logical = _hierarchical(load, num_replicas, num_groups, num_nodes, num_gpus)
    return Placement(physical_to_logical, *expert_maps(physical_to_logical, num_logical))


def _hierarchical(load: torch.Tensor, num_replicas: int, num_groups: int, num_nodes: int,
                  num_gpus: int) -> torch.Tensor:
    """physical_to_logical [L, num_replicas] by the three steps of the module's docstring."""
    num_layers, num_logical = load.shape
    group_size = num_logical // num_groups
    experts_per_node, slots_per_node = num_logical // num_nodes, num_replicas // num_nodes
    # (1) groups to nodes; a node's experts are its groups' in packing order ("node-local" ids)
    node, pos = balanced_packing(load.view(num_layers, num_groups, group_size).sum(-1), num_nodes)
    first_local = (node * (num_groups // num_nodes) + pos) * group_size             # [L, groups]
    logical_to_local = (first_local[:, :, None] + torch.arange(group_size)).flatten(1)
    local_to_logical = _inverse(logical_to_local)
    # (2) replicas within each node, one row a (layer, node)
    node_load = load.gather(1, local_to_logical).view(-1, experts_per_node)
    slot_to_local, count = replicate_experts(node_load, slots_per_node)
    # (3) the node's replicas onto its GPUs by load per replica; a GPU's slots are contiguous
    per_replica = (node_load / count).gather(1, slot_to_local)
    gpu, pos = balanced_packing(per_replica, num_gpus // num_nodes)
    physical_to_slot = _inverse(gpu * (num_replicas // num_gpus) + pos)
    physical_to_local = slot_to_local.gather(1, physical_to_slot).view(num_layers, num_nodes, slots_per_node)
    physical_to_local = physical_to_local + (torch.arange(num_nodes) * experts_per_node)[:, None]
    return local_to_logical.gather(1, physical_to_local.flatten(1))


def _inverse(perm: torch.Tensor) -> torch.Tensor:
    """The inverse of each row's permutation [X, n]."""
    return torch.empty_like(perm).scatter_(1, perm, torch.arange(perm.shape[1]).expand_as(perm).contiguous())


def expert_maps(physical_to_logical: torch.Tensor, num_logical: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(logical_to_physical [L, num_logical, num_replicas - num_logical + 1], -1 padded, each expert's
    slots lowest first; logical_replica_count [L, num_logical]) from physical_to_logical [L, num_replicas]."""
    physical_to_logical = physical_to_logical.long()
    num_layers, num_replicas = physical_to_logical.shape
    width = num_replicas - num_logical + 1
    count = torch.zeros(num_layers, num_logical, dtype=torch.int64).scatter_add_(
        1, physical_to_logical, torch.ones_like(physical_to_logical))
    # slots sorted by (expert, slot); an entry's place among its expert's slots is its rank there
    order = (physical_to_logical * num_replicas + torch.arange(num_replicas)).argsort(dim=1)
    expert = physical_to_logical.gather(1, order)
    first = (count.cumsum(1) - count).gather(1, expert)
    rank = torch.arange(num_replicas) - first
    out = torch.full((num_layers, num_logical * width), -1, dtype=torch.int64)
    out.scatter_(1, expert * width + rank, order)
    return out.view(num_layers, num_logical, width), count


def identity_placement(num_layers: int, num_logical: int, num_replicas: int) -> torch.Tensor:
    """physical_to_logical [L, num_replicas] of the static sharding: slot p holds expert p mod num_logical."""
    return (torch.arange(num_replicas) % num_logical).repeat(num_layers, 1)


def rank_loads(load: torch.Tensor, physical_to_logical: torch.Tensor, num_ranks: int) -> torch.Tensor:
    """Tokens each rank computes per layer [L, num_ranks] for ``load`` [L, num_logical] under a
    placement, each expert's tokens split evenly among its replicas."""
    load, physical_to_logical = load.double(), physical_to_logical.long()
    ones = torch.ones(physical_to_logical.shape, dtype=load.dtype)
    count = torch.zeros_like(load).scatter_add_(1, physical_to_logical, ones)
    per_slot = (load / count.clamp(min=1)).gather(1, physical_to_logical)
    return per_slot.view(load.shape[0], num_ranks, -1).sum(-1)


def imbalance(load: torch.Tensor, physical_to_logical: torch.Tensor, num_ranks: int) -> float:
    """The busiest rank's tokens over the mean rank's, summed over layers (a layer waits for its
    busiest rank): sum_l max_r / sum_l mean_r; 0.0 when there is no load."""
    ranks = rank_loads(load, physical_to_logical, num_ranks)
    mean = ranks.mean(dim=1).sum().item()
    return ranks.amax(dim=1).sum().item() / mean if mean > 0 else 0.0
