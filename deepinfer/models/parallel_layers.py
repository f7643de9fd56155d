"""Tensor-parallel layers: a row-parallel linear (one all-reduce), a vocab-parallel embedding and LM
head, and the rules that say which slice of a checkpoint tensor a rank holds. Column-parallel
layers need no class of their own: they are plain ``Linear`` layers of the rank's output features."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from deepinfer.models.layers import Linear
from deepinfer.parallel.state import TensorParallel


def vocab_shard(vocab_size: int, tp: TensorParallel) -> tuple[int, int, int]:
    """(first row, rows held, rows a rank's shard has) of a vocabulary split over the ranks: every
    shard has ceil(V / size) rows, the last one's tail is padding (zero rows, logits cut off)."""
    per = -(-vocab_size // tp.size)
    start = min(tp.rank * per, vocab_size)
    return start, min(vocab_size, start + per) - start, per


def kv_head_shard(num_kv_heads: int, tp: TensorParallel) -> tuple[int, int]:
    """(first KV head, KV heads) a rank holds: an equal share, or, where there are fewer KV heads than
    ranks, the one KV head its query heads read (each replicated on size / num_kv_heads ranks)."""
    if num_kv_heads >= tp.size:
        per = num_kv_heads // tp.size
        return tp.rank * per, per
    return tp.rank // (tp.size // num_kv_heads), 1


class RowParallelLinear(Linear):
    """A linear layer whose input features are split over the ranks: each computes a partial sum of
    the whole output, and one all-reduce adds them (no bias: the family's row-parallel layers have none)."""

    def __init__(self, in_features: int, out_features: int, tp: TensorParallel) -> None:
        super().__init__(in_features, out_features, bias=False)
        self.tp = tp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tp.all_reduce(super().forward(x))


class VocabParallelEmbedding(nn.Module):
    """The embedding table split by rows over the ranks: a rank looks up the ids it holds (zeros for
    the others) and one all-reduce assembles every token's vector."""

    def __init__(self, vocab_size: int, hidden: int, tp: TensorParallel) -> None:
        super().__init__()
        self.tp = tp
        self.start, self.rows, per = vocab_shard(vocab_size, tp)
        self.weight = nn.Parameter(torch.empty(per, hidden))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.start
        outside = (local < 0) | (local >= self.rows)
        x = F.embedding(local.masked_fill(outside, 0), self.weight)
        return self.tp.all_reduce(x.masked_fill_(outside.unsqueeze(-1), 0))


def parallel_logits(x: torch.Tensor, weight: torch.Tensor, vocab_size: int, tp: TensorParallel,
                    linear_op=None) -> torch.Tensor | None:
    """Logits of normed rows ``x`` through a vocab-parallel LM head ``weight`` (this rank's rows):
    every rank's part gathered on rank 0, the padding cut off; None on the other ranks."""
    local = (F.linear if linear_op is None else linear_op)(x, weight)
    full = tp.gather_to_driver(local)
    return None if full is None else full[:, :vocab_size]
