"""The inputs of one forward step, built once by the model runner and read by every layer."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class KVGroupBatch:
    """One KV group's view of a step: where each token's KV goes (negative: not written, it is
    cached already) and each sequence's block table in that group's pool."""

    slot_mapping: torch.Tensor          # [T] int64
    block_tables: torch.Tensor          # [B, max_blocks] int32
    write_rows: torch.Tensor | None     # [W] int64 rows of T with a slot >= 0 (None: every row)


@dataclass(frozen=True, slots=True)
class StepBatch:
    """Flattened tokens of one step and the paged-cache facts attention needs.

    Sequence ``i`` contributes tokens ``query_start_loc[i]:query_start_loc[i+1]`` of ``input_ids``;
    they sit at positions ``context_lens[i] ..< seq_lens[i]`` of that sequence, whose KV lives in
    the blocks ``block_tables[i]`` (padded with 0). ``kv_groups[g]`` is KV group g's slots and tables
    (group 0's are ``slot_mapping`` and ``block_tables``); layers pick theirs by ``kv_group``.
    """

    input_ids: torch.Tensor        # [T] int64
    positions: torch.Tensor        # [T] int64
    slot_mapping: torch.Tensor     # [T] int64, block_id * block_size + offset
    query_start_loc: torch.Tensor  # [B+1] int32 (device)
    seq_lens: torch.Tensor         # [B] int32 (device)
    context_lens: torch.Tensor     # [B] int32 (device): tokens already in the cache
    block_tables: torch.Tensor     # [B, max_blocks] int32 (device)
    query_lens_cpu: tuple[int, ...]
    seq_lens_cpu: tuple[int, ...]
    block_size: int
    max_query_len: int
    max_seq_len: int
    kv_groups: tuple[KVGroupBatch, ...] = ()
    #: [B] bool (device), only in graphs of Q query rows per sequence (speculative verification):
    #: sequence i's only real token is its first row (the rest is padding). A backend that sends a
    #: mixed step's one-token runs to its decode kernel does so for these rows too, from this flag,
    #: so that a request's numbers do not depend on whether the others speculate.
    single_runs: torch.Tensor | None = None

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens_cpu)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def is_decode_only(self) -> bool:
        return self.max_query_len == 1
