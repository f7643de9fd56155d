"""This process's place among the ranks: its rank in a tensor-parallel group or in an expert-parallel
one, the group's size, and the collectives the model layers call (one group a process, set once
before the model is built)."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True, slots=True)
class TensorParallel:
    """Rank ``rank`` of ``size`` ranks that hold one model's shards; ``group`` is their process group
    (None: the default group). Size 1 is a model on one device: no collective is ever called."""

    rank: int = 0
    size: int = 1
    group: Any = None
    local_rank: int = 0  # among the ranks on this host: which of its devices this rank takes

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of ``x`` over the ranks, in place (row-parallel outputs, vocab-parallel embeddings)."""
        dist.all_reduce(x, group=self.group)
        return x

    def gather_to_driver(self, x: torch.Tensor) -> torch.Tensor | None:
        """Every rank's ``x`` [R, n] side by side [R, size * n] on rank 0 (the driver, which samples);
        None on the other ranks."""
        if self.rank != 0:
            dist.gather(x.contiguous(), None, dst=0, group=self.group)
            return None
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.gather(x.contiguous(), parts, dst=0, group=self.group)
        return torch.cat(parts, dim=-1)

    def smallest(self, value: int, device: torch.device) -> int:
        """The smallest of every rank's ``value`` (the KV blocks every rank has memory for)."""
        if self.size == 1:
            return value
        t = torch.tensor([value], dtype=torch.long, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.group)
        return int(t.item())


@dataclass(slots=True)
class ExpertParallel:
    """Rank ``rank`` of ``size`` data-parallel ranks (each its own requests) over which a
    mixture-of-experts model's routed experts are sharded (``shards_experts``). A MoE layer
    has ``num_logical + num_redundant_experts`` physical slots, as many on each rank. ``announce``
    (rank 0 only, set by its driver) tells the other ranks to join a collective that is not part
    of a step (reading the expert load, applying a placement) before rank 0 enters it."""

    rank: int = 0
    size: int = 1
    group: Any = None
    num_redundant_experts: int = 0
    announce: Callable[..., None] | None = None
    #: False: data-parallel replicas that each hold every expert (only the load counts are summed)
    shards_experts: bool = True

    @property
    def sharded(self) -> bool:
        """Whether the routed experts are split over the ranks (else each rank holds them all)."""
        return self.size > 1 and self.shards_experts

    def exchange(self, x: torch.Tensor, send_counts: list[int], recv_counts: list[int]) -> torch.Tensor:
        """Rows of ``x`` sent to each rank in turn (``send_counts`` of them to rank r), and the rows
        every rank sent this one, rank by rank (``all_to_all_single``)."""
        out = x.new_empty((sum(recv_counts), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), recv_counts, send_counts, group=self.group)
        return out

    def counts(self, send_counts: torch.Tensor) -> list[int]:
        """How many rows each rank will send this one, given how many this one sends each [size]."""
        recv = torch.empty_like(send_counts)
        dist.all_to_all_single(recv, send_counts, group=self.group)
        return recv.tolist()


_current = TensorParallel()
_current_ep = ExpertParallel()


def tensor_parallel() -> TensorParallel:
    """The group the model being built in this process is sharded over (size 1 outside ``building``)."""
    return _current


def expert_parallel() -> ExpertParallel:
    """The ranks the routed experts of the model being built are sharded over (size 1 outside ``building``)."""
    return _current_ep


@contextmanager
def building(tp: TensorParallel, ep: ExpertParallel | None = None) -> Iterator[None]:
    """Models built inside shard themselves over ``tp``, and their routed experts over ``ep`` (their
    layers read them at construction)."""
    global _current, _current_ep
    before, before_ep = _current, _current_ep
    _current, _current_ep = tp, ep or ExpertParallel()
    try:
        yield
    finally:
        _current, _current_ep = before, before_ep
