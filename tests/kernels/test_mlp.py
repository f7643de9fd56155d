"""One token's gated MLP in one kernel (norm, gate/up, SiLU-mul, down, residual) against the eager ops."""
from __future__ import annotations

import pytest
import torch

from deepinfer_kernels import gemv, triton_interpreted
from deepinfer_kernels._launch import _COUNTERS
from deepinfer_kernels.mlp import MlpConfig, default_mlp_config, gemv_mlp, gemv_mlp_ref
from tests.kernels.paged import DTYPES, randn

TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}
#: a program over all of K in one step, K in several steps with a ragged last channel block, and
#: down's rows in several steps
CONFIGS = [MlpConfig(8, 64, 64, 2), MlpConfig(4, 16, 8, 3), MlpConfig(16, 8, 32, 1, num_warps=4)]


def _weights(dtype, device, k=40, inter=19, transposed=False):
    x = randn(1, k, dtype=dtype, device=device)
    gu = randn(2 * inter, k, dtype=dtype, device=device, seed=1) * 0.3
    down = randn(k, inter, dtype=dtype, device=device, seed=2) * 0.3
    if transposed:  # stored [I, K]: each program's columns of down are whole rows
        down = down.t().contiguous().t()
    nw = randn(k, dtype=dtype, device=device, seed=3)
    return x, gu, down, nw


def _counters_zero():
    return all(int(c.abs().sum()) == 0 for c in _COUNTERS.values())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
@pytest.mark.parametrize("transposed", [False, True])
def test_mlp_in_place_against_eager(dtype, cfg, transposed, device):
    x, gu, down, nw = _weights(dtype, device, transposed=transposed)
    want = gemv_mlp_ref(x.clone(), gu, down, nw, 1e-5)
    got = gemv_mlp(x, gu, down, nw, 1e-5, config=cfg)
    assert got.data_ptr() == x.data_ptr()
    torch.testing.assert_close(x, want, atol=TOL[dtype], rtol=TOL[dtype])
    assert _counters_zero()  # the tickets are reset for the next launch


@pytest.mark.parametrize("dtype", DTYPES)
def test_mlp_equals_the_two_gemvs(dtype, device):
    """The same rounding as the chain it replaces: gate/up with SiLU-mul, then down with the residual."""
    x, gu, down, nw = _weights(dtype, device, k=64, inter=48)
    chain = x.clone()
    act = gemv(chain, gu, norm_weight=nw, eps=1e-5, silu_mul=True)
    gemv(act, down, residual=chain)
    gemv_mlp(x, gu, down, nw, 1e-5, config=MlpConfig(16, 32, 32, 2))
    torch.testing.assert_close(x, chain, atol=TOL[dtype], rtol=TOL[dtype])


def test_mlp_same_bits_for_any_reducers(device):
    """The partials are summed in the same order whoever reduces: the result never depends on how
    many programs reduce (compiled; the interpreter always takes one)."""
    x, gu, down, nw = _weights(torch.float32, device, k=256, inter=96)
    outs = [gemv_mlp(x.clone(), gu, down, nw, 1e-5, config=MlpConfig(8, 64, 64, r)) for r in (1, 2, 4, 5)]
    for o in outs[1:]:
        assert torch.equal(o, outs[0])


def test_mlp_default_config(device):
    cfg = default_mlp_config(8192, 2048, torch.device("cuda", 0)) if device == "cuda" else None
    if cfg is not None:  # about two programs an SM, and room for every program while reducers wait
        assert cfg.block_i == 32 and 2 * cfg.reducers <= 132
    x, gu, down, nw = _weights(torch.float32, device, k=48, inter=200)
    want = gemv_mlp_ref(x.clone(), gu, down, nw)
    torch.testing.assert_close(gemv_mlp(x, gu, down, nw), want, atol=2e-5, rtol=2e-5)


def test_mlp_rejects_bad_shapes(device):
    x, gu, down, nw = _weights(torch.float32, device)
    with pytest.raises(ValueError, match=r"down must be \[40, 19\]"):
        gemv_mlp(x, gu, down.t().contiguous(), nw)
    with pytest.raises(ValueError, match="gate | up"):
        gemv_mlp(x, gu[:-1], down, nw)
    with pytest.raises(ValueError, match="powers of two"):
        gemv_mlp(x, gu, down, nw, config=MlpConfig(6, 16, 16, 1))
    with pytest.raises(ValueError, match="reducers"):
        gemv_mlp(x, gu, down, nw, config=MlpConfig(16, 16, 16, 0))
    with pytest.raises(ValueError, match="one contiguous row"):
        gemv_mlp(x.expand(2, -1), gu, down, nw)
    if not triton_interpreted():
        with pytest.raises(ValueError, match="reducers"):  # more reducers than programs
            gemv_mlp(x, gu, down, nw, config=MlpConfig(16, 16, 16, 3))
