"""SiLU-and-multiply against its torch reference."""
from __future__ import annotations

import pytest
import torch

from deepinfer_kernels import silu_and_mul, silu_and_mul_ref
from tests.kernels.paged import DTYPES, randn

TOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("inter", [40, 1500])  # one tile, and several (the tile is 1024 wide)
def test_silu_and_mul_matches_reference(inter, dtype, device):
    x = randn(3, 2 * inter, dtype=dtype, device=device) * 4
    out = silu_and_mul(x)
    assert out.shape == (3, inter)
    torch.testing.assert_close(out, silu_and_mul_ref(x), atol=TOL[dtype], rtol=TOL[dtype])
