"""A step's batch built on the host: every sequence's tokens, positions, KV slots and block
table, for an eager forward (graph replays fill static inputs instead: graphs.py)."""
from __future__ import annotations

import numpy as np
import torch

from deepinfer.core.fused_ops import FusedOps
from deepinfer.core.graphs import resolve_placeholders
from deepinfer.core.step_batch import KVGroupBatch, StepBatch


def _tables(block_ids: list[list[int]]) -> np.ndarray:
    tables = np.zeros((len(block_ids), max([1, *map(len, block_ids)])), dtype=np.int32)
    for i, ids in enumerate(block_ids):
        tables[i, :len(ids)] = ids
    return tables


def _group(slots: np.ndarray, tables: np.ndarray, device: torch.device) -> KVGroupBatch:
    skip = slots < 0
    rows = torch.from_numpy(np.flatnonzero(~skip)).to(device) if skip.any() else None
    return KVGroupBatch(torch.from_numpy(slots).to(device), torch.from_numpy(tables).to(device), rows)


def build_step_batch(seqs: list[tuple[list[int], int, list[int]]], block_size: int,
                     device: torch.device, sliding: list[tuple[list[int], int]] | None = None,
                     prev_tokens: torch.Tensor | None = None, ops: FusedOps | None = None) -> StepBatch:
    """A StepBatch from (token ids to compute, position of the first, block table) per sequence.

    ``sliding``, when sliding-window layers keep a KV pool of their own: per sequence, that pool's
    block table and ``replay_until`` (positions before it get no full-attention KV write). A
    negative token id -(r+1) stands for ``prev_tokens[r]`` (a sample still on the device),
    resolved with the device's fused ``ops`` where they offer it (see ``resolve_placeholders``)."""
    bs = block_size
    ids: list[int] = []
    pos_parts, slot_parts, sliding_parts = [], [], []
    q_lens, seq_lens, ctx_lens = [], [], []
    for i, (tokens, start, block_ids) in enumerate(seqs):
        n = len(tokens)
        ids.extend(tokens)
        pos = np.arange(start, start + n, dtype=np.int64)
        slots = np.asarray(block_ids, dtype=np.int64)[pos // bs] * bs + pos % bs
        if sliding is not None:
            table, replay_until = sliding[i]
            slots[pos < replay_until] = -1  # full-attention KV of a replay is cached already
            sliding_parts.append(np.asarray(table, dtype=np.int64)[pos // bs] * bs + pos % bs)
        pos_parts.append(pos)
        slot_parts.append(slots)
        q_lens.append(n)
        seq_lens.append(start + n)
        ctx_lens.append(start)
    tables = _tables([b for _, _, b in seqs])
    slot_mapping = np.concatenate(slot_parts)
    groups = (_group(slot_mapping, tables, device),)
    if sliding is not None:
        groups += (_group(np.concatenate(sliding_parts), _tables([t for t, _ in sliding]), device),)
    qsl = np.zeros(len(q_lens) + 1, dtype=np.int32)
    np.cumsum(q_lens, out=qsl[1:])
    input_ids = torch.tensor(ids, dtype=torch.long, device=device)
    if prev_tokens is not None:
        input_ids = resolve_placeholders(input_ids, prev_tokens, ops=ops)
    return StepBatch(
        input_ids=input_ids,
        positions=torch.from_numpy(np.concatenate(pos_parts)).to(device),
        slot_mapping=groups[0].slot_mapping,
        query_start_loc=torch.from_numpy(qsl).to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        context_lens=torch.tensor(ctx_lens, dtype=torch.int32, device=device),
        block_tables=groups[0].block_tables,
        query_lens_cpu=tuple(q_lens),
        seq_lens_cpu=tuple(seq_lens),
        block_size=bs,
        max_query_len=max(q_lens),
        max_seq_len=max(seq_lens),
        kv_groups=groups,
    )
