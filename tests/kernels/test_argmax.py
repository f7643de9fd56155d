"""Row-wise argmax over chunks of the vocabulary against torch.argmax, ties included."""
from __future__ import annotations

import pytest
import torch

from deepinfer_kernels import argmax, argmax_ref
from deepinfer_kernels._launch import _COUNTERS
from tests.kernels.paged import DTYPES, randn


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("chunk", [None, 16, 64, 512])  # None: torch's argmax (a small vocabulary); 512: one chunk
def test_argmax_matches_torch(dtype, chunk, device):
    x = randn(3, 301, dtype=dtype, device=device)  # 301: a ragged last chunk
    x[1, 290] = 50.0  # the maximum in the ragged chunk
    x[2, 5] = x[2, 200] = 60.0  # a tie across chunks: the first index wins, as in torch
    got = argmax(x, chunk=chunk)
    assert got.dtype == torch.int64
    assert got.tolist() == argmax_ref(x).tolist()
    assert got[2].item() == 5
    assert all(int(c.abs().sum()) == 0 for c in _COUNTERS.values())  # ready for the next launch


def test_argmax_tie_inside_a_chunk_and_bad_input(device):
    x = torch.zeros(1, 40, device=device)
    x[0, 17] = x[0, 9] = 1.0
    assert argmax(x, chunk=64).item() == 9
    with pytest.raises(ValueError, match=r"logits \[B, V\]"):
        argmax(torch.zeros(4, device=device))
