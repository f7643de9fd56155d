"""Data-parallel attention: each rank runs its own requests through attention and the dense layers
(a whole replica of them), with the routed experts shared over the ranks when expert parallelism
is on. Rank 0 still plans every step, over one KV pool made of every rank's blocks
(``PartitionedKV``): rank r's cache holds blocks r * blocks_per_rank onwards, and all of a
request's blocks are on one rank, which is the rank that runs it. Rank 0 sends every rank the step
with each sequence's rank, runs its own, and gathers the other ranks' last hidden states to compute
logits and sample."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from deepinfer.core.eager_batch import build_step_batch
from deepinfer.parallel.driver import Driver
from deepinfer.parallel.launch import Ranks
from deepinfer.parallel.protocol import (
    ANNOUNCED,
    DP_STEP,
    EXPERT_LOAD,
    EXPERT_RESET,
    PLACE,
    StepSeqs,
    pack_dp_step,
    receive_payload,
    rows_of,
    send_payload,
    unpack_dp_step,
)
from deepinfer.parallel.state import TensorParallel


def own_hidden(model: Any, seqs: StepSeqs, owners: list[int], rank: int, blocks_per_rank: int,
               forward: Callable[[StepSeqs], torch.Tensor], dtype: torch.dtype, device: torch.device
               ) -> torch.Tensor:
    """This rank's sequences of the step (their block ids made this rank's cache's) through
    ``forward``; a rank with none runs the model's expert exchanges over zero tokens
    (``idle_forward``), so that the other ranks' complete."""
    first = rank * blocks_per_rank
    mine = [(tokens, start, [b - first for b in blocks])
            for (tokens, start, blocks), o in zip(seqs, owners, strict=True) if o == rank]
    if mine:
        return forward(mine)
    if (idle := getattr(model, "idle_forward", None)) is not None:
        idle()
    return torch.empty(0, model.config.hidden_size, dtype=dtype, device=device)


def gather_hidden(hidden: torch.Tensor, seqs: StepSeqs, owners: list[int], world: TensorParallel
                  ) -> torch.Tensor | None:
    """Every rank's hidden rows put back in the step's row order, on rank 0 (None elsewhere)."""
    rows = [rows_of(seqs, owners, r) for r in range(world.size)]
    padded = hidden.new_zeros(max(map(len, rows)), hidden.shape[1])
    padded[:hidden.shape[0]] = hidden
    if world.rank != 0:
        dist.gather(padded, None, dst=0, group=world.group)
        return None
    parts = [torch.empty_like(padded) for _ in range(world.size)]
    dist.gather(padded, parts, dst=0, group=world.group)
    full = hidden.new_empty(sum(map(len, rows)), hidden.shape[1])
    for r, index in enumerate(rows):
        if index:
            full[torch.tensor(index, device=full.device)] = parts[r][:len(index)]
    return full


class DataParallelDriver(Driver):
    """Rank 0's end with data-parallel attention: runs the steps (``run_step``, in place of the
    runner's own forward), each sequence on the rank its blocks are on, and tells the ranks when the
    model announces a collective outside a step (the expert load, a new expert placement)."""

    runs_step = True

    def __init__(self, ranks: Ranks, device: torch.device, model: Any, dtype: torch.dtype,
                 blocks_per_rank: int) -> None:
        super().__init__(ranks, device)
        self.model = model
        self.dtype = dtype
        self.blocks_per_rank = blocks_per_rank
        if (ep := getattr(model, "ep", None)) is not None and ep.size > 1:
            ep.announce = self.announce

    def owners(self, requests: list[Any]) -> list[int]:
        """Each request's rank: the one its blocks are on (``PartitionedKV``: every block of a request
        is in one rank's range, and a scheduled request holds at least one)."""
        return [req.block_ids[0] // self.blocks_per_rank for req in requests]

    def run_step(self, requests: list[Any], seqs: StepSeqs, prev: torch.Tensor | None,
                 forward: Callable[[StepSeqs], torch.Tensor]) -> torch.Tensor:
        """Every rank runs its sequences of the step; rank 0's ``forward`` runs its own. The hidden
        states of every row, in the step's order."""
        owners = self.owners(requests)
        payload = pack_dp_step(seqs, owners)
        self._header(DP_STEP, len(payload), 0 if prev is None else prev.numel())
        send_payload(payload, prev, self.device, self.ranks.tp.group)
        hidden = own_hidden(self.model, seqs, owners, 0, self.blocks_per_rank, forward, self.dtype, self.device)
        return gather_hidden(hidden, seqs, owners, self.ranks.tp)

    def send_logits(self, hidden: torch.Tensor) -> None:
        """Rank 0 holds the whole LM head: the other ranks take no part in logits."""

    def announce(self, what: str, *tensors: torch.Tensor) -> None:
        """Tell the ranks to join the model's collective ``what`` (``protocol.ANNOUNCED``), with its
        tensors; a rank found dead here ends the ranks with a ``WorkerError`` naming it, as in a step."""
        try:
            self._header(ANNOUNCED[what])
            for t in tensors:
                dist.broadcast(t.long().contiguous().to(self.device), src=0, group=self.ranks.tp.group)
        except Exception as e:
            raise self.failure(e) from e


def serve_dp_step(model: Any, attention: Any, kv_caches: list[Any], block_size: int, blocks_per_rank: int,
                  device: torch.device, dtype: torch.dtype, world: TensorParallel, length: int,
                  num_prev: int) -> None:
    """A worker's part of a ``DP_STEP``: its sequences of the step, then its hidden rows to rank 0."""
    payload, prev = receive_payload(length, num_prev, device, world.group)
    seqs, owners = unpack_dp_step(payload)

    def forward(mine: StepSeqs) -> torch.Tensor:
        batch = build_step_batch(mine, block_size, device, None, prev, ops=model.fused_ops)
        return model(batch.input_ids, batch.positions, kv_caches, attention.build_metadata(batch))

    gather_hidden(own_hidden(model, seqs, owners, world.rank, blocks_per_rank, forward, dtype, device), seqs,
                  owners, world)


def serve_expert_command(model: Any, command: int, device: torch.device, world: TensorParallel) -> None:
    """A worker's part of what the model announced on rank 0 (the expert load, a new placement)."""
    if command == EXPERT_LOAD:
        model.expert_load()
    elif command == EXPERT_RESET:
        model.reset_expert_load()
    elif command == PLACE:
        moe = model.moe_layers()[0]
        layers, logical, slots = len(model.moe_layers()), moe.gate.weight.shape[0], moe.num_physical
        maps = [torch.empty(shape, dtype=torch.long, device=device)
                for shape in ((layers, slots), (layers, logical, slots - logical + 1), (layers, logical))]
        for t in maps:
            dist.broadcast(t, src=0, group=world.group)
        model.apply_placement(*(t.cpu() for t in maps))
