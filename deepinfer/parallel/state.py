"""This process's place in a tensor-parallel group: its rank, the group's size, and the collectives
the model layers call (one group a process, set once before the model is built)."""
from __future__ import annotations

from collections.abc import Iterator
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


_current = TensorParallel()


def tensor_parallel() -> TensorParallel:
    """The group the model being built in this process is sharded over (size 1 outside ``building``)."""
    return _current


@contextmanager
def building(tp: TensorParallel) -> Iterator[None]:
    """Models built inside shard themselves over ``tp`` (their layers read it at construction)."""
    global _current
    before, _current = _current, tp
    try:
        yield
    finally:
        _current = before
