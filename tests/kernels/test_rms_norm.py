"""Fused RMSNorm (with and without the residual add) against its torch reference."""
from __future__ import annotations

import pytest
import torch

from deepinfer_kernels import rms_norm, rms_norm_ref
from tests.kernels.paged import DTYPES, randn

TOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_matches_reference(dtype, device):
    x = randn(5, 48, dtype=dtype, device=device)  # 48: not a power of two
    w = randn(48, dtype=dtype, device=device, seed=2)
    torch.testing.assert_close(rms_norm(x, w, 1e-6), rms_norm_ref(x, w, 1e-6), atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_adds_the_residual_first_and_returns_the_sum(dtype, device):
    x = randn(5, 48, dtype=dtype, device=device)
    res = randn(5, 48, dtype=dtype, device=device, seed=3)
    w = randn(48, dtype=dtype, device=device, seed=2)
    out, new_res = rms_norm(x, w, 1e-5, res)
    ref_out, ref_res = rms_norm_ref(x, w, 1e-5, res)
    assert torch.equal(new_res, ref_res)  # x + residual, rounded once to the dtype
    torch.testing.assert_close(out, ref_out, atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_per_head_on_a_strided_view(dtype, device):
    qkv = randn(3, 8 * 16, dtype=dtype, device=device)  # q/k norm: heads of a fused qkv projection
    q = qkv[:, :64].view(3, 4, 16)
    w = randn(16, dtype=dtype, device=device, seed=2)
    out = rms_norm(q, w, 1e-6)
    assert out.shape == (3, 4, 16) and out.is_contiguous()
    torch.testing.assert_close(out, rms_norm_ref(q, w, 1e-6), atol=TOL[dtype], rtol=TOL[dtype])
