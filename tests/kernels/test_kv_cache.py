"""KV-cache write against its torch reference: every kept slot written exactly, skipped slots untouched."""
from __future__ import annotations

import pytest
import torch

from deepinfer_kernels import write_kv_cache, write_kv_cache_ref
from tests.kernels.paged import DTYPES, randn


@pytest.mark.parametrize("dtype", DTYPES)
def test_write_matches_reference_and_skips_negative_slots(dtype, device):
    t, kvh, d = 6, 2, 24
    qkv = randn(t, (4 + 2 * kvh) * d, dtype=dtype, device=device)  # k and v as strided views of a fused qkv
    _, k, v = qkv.split([4 * d, kvh * d, kvh * d], dim=-1)
    k, v = k.view(t, kvh, d), v.view(t, kvh, d)
    slots = torch.tensor([9, -1, 0, 31, -1, 17], device=device)
    cache = randn(2, 32, kvh, d, dtype=dtype, device=device, seed=3)
    ref = cache.clone()
    write_kv_cache(k, v, cache[0], cache[1], slots)
    write_kv_cache_ref(k, v, ref[0], ref[1], slots)
    assert torch.equal(cache, ref)
    untouched = torch.ones(32, dtype=torch.bool)
    untouched[[9, 0, 31, 17]] = False
    assert torch.equal(cache[:, untouched], randn(2, 32, kvh, d, dtype=dtype, device=device, seed=3)[:, untouched])
