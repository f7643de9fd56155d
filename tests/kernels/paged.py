"""Random paged KV caches for the attention kernel tests."""
from __future__ import annotations

import pytest
import torch

#: float32 and float16 everywhere (the interpreter on CPU); bfloat16 on a GPU only
DTYPES = [torch.float32, torch.float16, pytest.param(torch.bfloat16, marks=pytest.mark.gpu)]
TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def random_paged_kv(seq_lens, block_size, kv_heads, head_dim, dtype, device, seed=0, spare_blocks=3):
    """(k_cache, v_cache, block_tables): caches [num_slots, kv_heads, head_dim] of random values
    (unreferenced slots too, so reading a wrong slot shows), block tables [B, max_blocks] int32 of
    shuffled, non-contiguous block ids with one padding column of zeros."""
    g = torch.Generator().manual_seed(seed)
    per_seq = [-(-n // block_size) for n in seq_lens]
    total = sum(per_seq) + spare_blocks
    ids = torch.randperm(total, generator=g)
    tables = torch.zeros(len(seq_lens), max(per_seq) + 1, dtype=torch.int32)
    at = 0
    for i, n in enumerate(per_seq):
        tables[i, :n] = ids[at:at + n]
        at += n
    shape = (total * block_size, kv_heads, head_dim)
    k = torch.randn(shape, generator=g).to(dtype)
    v = torch.randn(shape, generator=g).to(dtype)
    return k.to(device), v.to(device), tables.to(device)


def randn(*shape, dtype, device, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype).to(device)


def i32(values, device):
    return torch.tensor(values, dtype=torch.int32, device=device)
