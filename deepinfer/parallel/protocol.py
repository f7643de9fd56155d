"""What rank 0 broadcasts to the other ranks: a header a message, then the message's tensors.

Every message starts with a header of ``HEADER`` int64 values ``[command, a, b, 0]``:
- ``STEP``: a = the length of the packed step (``pack_step``), b = the number of samples still on
  the device that the step's placeholders stand for (0: none); then the packed step, then those samples.
- ``LOGITS``: a = rows; then the rows [a, hidden] of hidden states whose logits rank 0 asks for.
- ``STOP``: the workers leave their loop.

With data parallelism (each rank its own requests for attention and the dense layers):
- ``DP_STEP``: as ``STEP``, the packed step followed by each sequence's rank (``pack_dp_step``); every
  rank runs its own sequences (a rank with none still joins the experts' exchanges), then sends its
  last hidden states to rank 0 (``dist.gather``, padded to the most rows any rank computed).
- ``EXPERT_LOAD``: the ranks add their expert load counters up on rank 0 (``dist.reduce``).
- ``EXPERT_RESET``: the ranks set their expert load counters to zero.
- ``PLACE``: a new expert placement: physical_to_logical, logical_to_physical and
  logical_replica_count follow (int64, shapes from the model); the ranks exchange expert weights.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

STOP, STEP, LOGITS, DP_STEP, EXPERT_LOAD, EXPERT_RESET, PLACE = 0, 1, 2, 3, 4, 5, 6
#: what the model announces (``ExpertParallel.announce``) -> the command that tells the ranks
ANNOUNCED = {"expert_load": EXPERT_LOAD, "reset_expert_load": EXPERT_RESET, "place": PLACE}
HEADER = 4

StepSeqs = list[tuple[list[int], int, list[int]]]
Sliding = list[tuple[list[int], int]] | None


def pack_step(seqs: StepSeqs, sliding: Sliding) -> list[int]:
    """One int list for a step's sequences (tokens to compute, first position, block table) and,
    with a sliding-window pool, each one's table there and replay_until."""
    out = [len(seqs), int(sliding is not None)]
    for i, (tokens, start, blocks) in enumerate(seqs):
        out += [len(tokens), start, len(blocks), *tokens, *blocks]
        if sliding is not None:
            table, replay_until = sliding[i]
            out += [len(table), replay_until, *table]
    return out


def unpack_step(values: Sequence[int]) -> tuple[StepSeqs, Sliding]:
    """``pack_step``'s sequences and sliding tables back."""
    n, has_sliding = values[0], values[1]
    at, seqs, sliding = 2, [], [] if has_sliding else None
    for _ in range(n):
        num_tokens, start, num_blocks = values[at:at + 3]
        at += 3
        tokens = list(values[at:at + num_tokens])
        at += num_tokens
        seqs.append((tokens, start, list(values[at:at + num_blocks])))
        at += num_blocks
        if sliding is not None:
            num_table, replay_until = values[at:at + 2]
            sliding.append((list(values[at + 2:at + 2 + num_table]), replay_until))
            at += 2 + num_table
    return seqs, sliding


def pack_dp_step(seqs: StepSeqs, owners: list[int]) -> list[int]:
    """A data-parallel step: ``pack_step``'s sequences, then the rank each sequence runs on."""
    return pack_step(seqs, None) + owners


def unpack_dp_step(values: Sequence[int]) -> tuple[StepSeqs, list[int]]:
    """``pack_dp_step``'s sequences and their ranks back."""
    seqs, _ = unpack_step(values)
    return seqs, list(values[len(values) - len(seqs):])


def rows_of(seqs: StepSeqs, owners: list[int], rank: int) -> list[int]:
    """The step's rows (tokens, in the order of its sequences) that ``rank`` computes."""
    rows, at = [], 0
    for (tokens, _, _), owner in zip(seqs, owners, strict=True):
        if owner == rank:
            rows += range(at, at + len(tokens))
        at += len(tokens)
    return rows


def send_payload(payload: list[int], prev: torch.Tensor | None, device: torch.device, group: Any) -> None:
    """Rank 0's part of a step after its header: the packed step, then the samples its placeholders
    stand for (if any)."""
    dist.broadcast(torch.tensor(payload, dtype=torch.long, device=device), src=0, group=group)
    if prev is not None:
        dist.broadcast(prev.long().contiguous(), src=0, group=group)


def receive_payload(length: int, num_prev: int, device: torch.device, group: Any
                    ) -> tuple[list[int], torch.Tensor | None]:
    """Another rank's part of a step after its header (``length`` and ``num_prev`` from it): the packed
    step, and the samples its placeholders stand for (None: none)."""
    payload = torch.empty(length, dtype=torch.long, device=device)
    dist.broadcast(payload, src=0, group=group)
    prev = None
    if num_prev:
        prev = torch.empty(num_prev, dtype=torch.long, device=device)
        dist.broadcast(prev, src=0, group=group)
    return payload.tolist(), prev
