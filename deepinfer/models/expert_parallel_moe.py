"""Routed experts sharded over expert-parallel ranks (``ExpertParallel``): each rank holds
``num_physical / size`` physical expert slots; a token's (token, expert) pairs go to their slots'
ranks and come back with ``all_to_all_single``, and are weighted and summed on the token's own rank.
Also what a model needs around it: the checkpoint's experts cut to a rank's slots, the load summed
over the ranks, and the weights moved between ranks when a new placement is applied (EPLB).

Slot p is on rank p // slots_per_rank. Until the first placement, slot p holds logical expert
p mod num_logical (``PlacesExperts``)."""
from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
import torch.distributed as dist
from torch import nn

from deepinfer.models.deepseek_weights import _EXPERT
from deepinfer.models.moe import MoE, Routing, physical_expert_ids, sorted_expert_rows
from deepinfer.parallel.state import ExpertParallel


def initial_placement(num_logical: int, num_physical: int) -> torch.Tensor:
    """physical_to_logical [num_physical] before any placement: slot p holds expert p mod num_logical."""
    return torch.arange(num_physical, dtype=torch.int64, device="cpu") % num_logical


def expert_maps(physical_to_logical: torch.Tensor, num_logical: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(logical_to_physical [num_logical, num_physical - num_logical + 1], -1 padded, each expert's
    slots lowest first; logical_replica_count [num_logical]) from one layer's physical_to_logical."""
    num_physical = physical_to_logical.shape[0]
    l2p = torch.full((num_logical, num_physical - num_logical + 1), -1, dtype=torch.int64, device="cpu")
    count = torch.zeros(num_logical, dtype=torch.int64, device="cpu")
    for p, e in enumerate(physical_to_logical.tolist()):
        l2p[e, count[e]] = p
        count[e] += 1
    return l2p, count


class ExpertParallelMoE(MoE):
    """A MoE layer whose routed experts are this rank's slots (``w13`` [slots_per_rank, 2I, D],
    ``w2`` [slots_per_rank, D, I]); the router, the load counters (of this rank's tokens, by logical
    expert) and the shared experts are whole on every rank."""

    def __init__(self, hidden: int, num_experts: int, intermediate: int, num_shared: int, routing: Routing,
                 ep: ExpertParallel) -> None:
        super().__init__(hidden, num_experts, intermediate, num_shared, routing)
        self.ep = ep
        self.num_physical = num_experts + ep.num_redundant_experts
        self.slots_per_rank = self.num_physical // ep.size
        self.w13 = nn.Parameter(torch.empty(self.slots_per_rank, 2 * intermediate, hidden))
        self.w2 = nn.Parameter(torch.empty(self.slots_per_rank, hidden, intermediate))
        # the placement in force: physical_to_logical on the host, the routing maps on the device
        # (set at load, ``reset_placement``: a model built on the meta device has no tensors yet)
        self.physical_to_logical = [p % num_experts for p in range(self.num_physical)]
        self.logical_to_physical: torch.Tensor | None = None
        self.logical_replica_count: torch.Tensor | None = None

    def slot_experts(self) -> list[int]:
        """The logical expert each of this rank's slots holds."""
        first = self.ep.rank * self.slots_per_rank
        return self.physical_to_logical[first:first + self.slots_per_rank]

    def reset_placement(self) -> None:
        """Route by the placement before any (slot p holds expert p mod num_logical)."""
        p2l = initial_placement(self.gate.weight.shape[0], self.num_physical)
        self.use_placement(p2l, *expert_maps(p2l, self.gate.weight.shape[0]))

    def use_placement(self, physical_to_logical: torch.Tensor, logical_to_physical: torch.Tensor,
                      logical_replica_count: torch.Tensor) -> None:
        """Route by these maps (this layer's rows of a placement) from the next forward on."""
        device = self.w13.device
        self.physical_to_logical = physical_to_logical.tolist()
        self.logical_to_physical = logical_to_physical.long().to(device)
        self.logical_replica_count = logical_replica_count.long().to(device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Also on zero tokens (a rank with no sequence this step still joins the exchanges)."""
        topk_weights, topk_ids = self.gate(x, getattr(self.fused_ops, "grouped_topk", None))
        flat = topk_ids.reshape(-1)
        self.expert_load.index_add_(0, flat, self.one.expand(flat.shape[0]))
        out = self._dispatch_combine(x, topk_weights, topk_ids)
        return out if self.shared_experts is None else self.shared_experts(x, add_to=out)

    def _dispatch_combine(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        ep, k, per = self.ep, topk_ids.shape[1], self.slots_per_rank
        slots = physical_expert_ids(topk_ids, self.logical_to_physical, self.logical_replica_count)
        slots = slots.reshape(-1).long()
        order = slots.argsort(stable=True)  # (slot order is rank order: each rank's pairs are contiguous)
        slots = slots[order]
        send_t = torch.bincount(slots // per, minlength=ep.size)
        recv = ep.counts(send_t)
        send = send_t.tolist()
        rows = ep.exchange(x[order // k], send, recv)
        local = ep.exchange(slots % per, send, recv)
        by_slot = local.argsort(stable=True)
        out = torch.empty_like(rows)
        out[by_slot] = sorted_expert_rows(rows[by_slot], torch.bincount(local, minlength=per).tolist(),
                                          self.w13, self.w2, self.linear_op)
        back = ep.exchange(out, recv, send)
        # (weighted in float32 and added in slot order, as the single-process ``moe_experts`` does)
        scaled = (back.float() * topk_weights.reshape(-1)[order, None]).to(x.dtype)
        return torch.zeros_like(x).index_add_(0, order // k, scaled)

    def move_to(self, physical_to_logical: torch.Tensor) -> None:
        """Exchange expert weights so that this rank's slots hold what ``physical_to_logical`` (this
        layer's new map, the same on every rank) places there: a slot whose expert is already on its
        rank copies it there; any other gets it from the rank of the expert's lowest slot before."""
        old, new = self.physical_to_logical, physical_to_logical.tolist()
        local, sends, recvs = _move_plan(old, new, self.slots_per_rank, self.ep.rank, self.ep.size)
        for w in (self.w13, self.w2):
            moved = torch.empty_like(w.data)
            for dst, src in local:
                moved[dst] = w.data[src]
            send_slots = [s for per_rank in sends for s in per_rank]
            recv_slots = [s for per_rank in recvs for s in per_rank]
            got = self.ep.exchange(w.data[send_slots], [len(s) for s in sends], [len(s) for s in recvs])
            if recv_slots:
                moved[recv_slots] = got
            w.data.copy_(moved)


def _move_plan(old: list[int], new: list[int], per: int, rank: int, size: int
               ) -> tuple[list[tuple[int, int]], list[list[int]], list[list[int]]]:
    """This rank's part of a move from ``old`` to ``new`` placement (physical_to_logical lists):
    (local copies (new slot, old slot), the old local slots to send each rank, the new local slots
    to fill from each rank, in the order that rank sends them); slots are local (0..per-1)."""
    first: dict[int, int] = {}
    for p, e in enumerate(old):
        first.setdefault(e, p)
    local: list[tuple[int, int]] = []
    sends: list[list[int]] = [[] for _ in range(size)]
    recvs: list[list[int]] = [[] for _ in range(size)]
    for p, e in enumerate(new):
        dst = p // per
        held = [q for q in range(dst * per, (dst + 1) * per) if old[q] == e]
        if held:
            if dst == rank:
                local.append((p - dst * per, held[0] - dst * per))
            continue
        src = first[e] // per
        if src == rank:
            sends[dst].append(first[e] - rank * per)
        if dst == rank:
            recvs[src].append(p - rank * per)
    return local, sends, recvs


def local_expert_tensors(weights: Iterable[tuple[str, torch.Tensor]], slot_experts: list[int]
                         ) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint with each layer's routed experts as this rank's slots: expert e's tensors
    under the index of every local slot holding e (none if no slot does), transformers' stacked
    ``experts.gate_up_proj`` / ``experts.down_proj`` [E, ...] cut to the slots' rows."""
    for name, t in weights:
        if m := _EXPERT.match(name):
            e = int(m.group(2))
            for slot, held in enumerate(slot_experts):
                if held == e:
                    yield f"{m.group(1)}.experts.{slot}.{m.group(3)}.weight", t
        elif name.endswith((".experts.gate_up_proj", ".experts.down_proj")):
            yield name, t[slot_experts]
        else:
            yield name, t


def holds_expert(name: str, slot_experts: list[int]) -> bool:
    """False for a checkpoint tensor of a routed expert no slot of this rank holds (not to be read)."""
    m = _EXPERT.match(name)
    return m is None or int(m.group(2)) in slot_experts


def summed_load(moes: list[MoE], ep: ExpertParallel) -> torch.Tensor:
    """Every rank's expert load counters [num_moe_layers, num_logical] added up on rank 0, on the
    host (the other ranks' return value is meaningless). Rank 0 announces it first."""
    if ep.announce is not None:
        ep.announce("expert_load")
    load = torch.stack([m.expert_load for m in moes])
    dist.reduce(load, dst=0, group=ep.group)
    return load.cpu()


def place(moes: list[ExpertParallelMoE], physical_to_logical: torch.Tensor, logical_to_physical: torch.Tensor,
          logical_replica_count: torch.Tensor) -> None:
    """Move every layer's weights to a new placement and route by it (rank 0 announces it first,
    with the maps, which the other ranks receive and pass here)."""
    ep = moes[0].ep
    if ep.announce is not None:
        ep.announce("place", physical_to_logical, logical_to_physical, logical_replica_count)
    for i, moe in enumerate(moes):
        moe.move_to(physical_to_logical[i])
        moe.use_placement(physical_to_logical[i], logical_to_physical[i], logical_replica_count[i])
