"""What rank 0 broadcasts to the other ranks: a header a message, then the message's tensors.

Every message starts with a header of ``HEADER`` int64 values ``[command, a, b, 0]``:
- ``STEP``: a = the length of the packed step (``pack_step``), b = the number of samples still on
  the device that the step's placeholders stand for (0: none); then the packed step, then those samples.
- ``LOGITS``: a = rows; then the rows [a, hidden] of hidden states whose logits rank 0 asks for.
- ``STOP``: the workers leave their loop.
"""
from __future__ import annotations

from collections.abc import Sequence

STOP, STEP, LOGITS = 0, 1, 2
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
