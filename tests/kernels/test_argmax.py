"""Row-wise argmax over chunks of the vocabulary against torch.argmax, ties included."""
from __future__ import annotations

import sys

import pytest
import torch

from deepinfer_kernels import argmax, argmax_prob, argmax_prob_ref, argmax_ref
from deepinfer_kernels._launch import _COUNTERS
from tests.kernels.paged import DTYPES, randn


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("chunk", [16, 64, 512])  # 512: one chunk
def test_argmax_matches_torch(dtype, chunk, device):
    x = randn(3, 301, dtype=dtype, device=device)  # 301: a ragged last chunk
    x[1, 290] = 50.0  # the maximum in the ragged chunk
    x[2, 5] = x[2, 200] = 60.0  # a tie across chunks: the first index wins, as in torch
    got = argmax(x, chunk=chunk)
    assert got.dtype == torch.int64
    assert got.tolist() == argmax_ref(x).tolist()
    assert got[2].item() == 5
    assert all(int(c.abs().sum()) == 0 for c in _COUNTERS.values())  # ready for the next launch


def test_without_a_chunk_small_vocabularies_take_torch_and_large_ones_the_kernel(device, monkeypatch):
    import deepinfer_kernels.argmax  # noqa: F401 (the module: the package exports the function)

    mod = sys.modules["deepinfer_kernels.argmax"]
    launches = []
    kernel = mod._argmax_kernel

    class Recording:
        def __getitem__(self, grid):
            launches.append(grid)
            return kernel[grid]

    monkeypatch.setattr(mod, "_argmax_kernel", Recording())
    for v, kernel_runs in ((mod.TORCH_UP_TO, False), (mod.TORCH_UP_TO + 1, True)):
        x = torch.zeros(2, v, device=device)
        x[0, v - 1] = 3.0  # the maximum in the last (ragged) chunk
        x[1, 7] = x[1, v - 2] = 2.0  # a tie across chunks: the first wins
        launches.clear()
        assert argmax(x).tolist() == [v - 1, 7] == argmax_ref(x).tolist()
        assert bool(launches) == kernel_runs
    assert launches == [(2, 5)]  # 16,385 entries: four chunks of 4,096 and one of 1


@pytest.mark.parametrize("chunk", [64, None])  # None: this vocabulary takes torch's argmax
def test_argmax_into_a_given_tensor(chunk, device):
    x = randn(3, 200, dtype=torch.float32, device=device)
    buf = torch.full((5,), -7, dtype=torch.int64, device=device)
    got = argmax(x, chunk=chunk, out=buf[:3])
    assert got.data_ptr() == buf.data_ptr()
    assert buf.tolist() == argmax_ref(x).tolist() + [-7, -7]  # the rest of the buffer untouched
    for bad in (buf[:2], buf[:3].to(torch.int32), buf[::2][:3]):
        with pytest.raises(ValueError, match=r"out must be a contiguous int64 \[3\]"):
            argmax(x, chunk=chunk, out=bad)


def test_argmax_tie_inside_a_chunk_and_bad_input(device):
    x = torch.zeros(1, 40, device=device)
    x[0, 17] = x[0, 9] = 1.0
    assert argmax(x, chunk=64).item() == 9
    with pytest.raises(ValueError, match=r"logits \[B, V\]"):
        argmax(torch.zeros(4, device=device))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("chunk", [16, 64, 512, None])  # 512: one chunk; None: the default
def test_argmax_prob_matches_the_softmax_maximum(dtype, chunk, device):
    x = randn(4, 301, dtype=dtype, device=device) * 3
    x[1, 290] = 9.0  # the maximum in the ragged last chunk
    x[2, 5] = x[2, 200] = 12.0  # a tie across chunks: the first index, probability of one of them
    x[3] = 0.0  # flat: every entry has probability 1/301
    prob, idx = argmax_prob(x, chunk=chunk)
    ref_prob, _ = argmax_prob_ref(x)
    assert prob.dtype == torch.float32 and idx.dtype == torch.int64
    assert idx.tolist() == argmax_ref(x).tolist()  # the first index of the maximum
    torch.testing.assert_close(prob, ref_prob, rtol=1e-5, atol=1e-6)
    assert abs(prob[3].item() - 1 / 301) < 1e-7
    assert all(int(c.abs().sum()) == 0 for c in _COUNTERS.values())


def test_argmax_prob_of_no_rows_and_bad_input(device):
    prob, idx = argmax_prob(torch.zeros(0, 10, device=device))
    assert prob.shape == idx.shape == (0,)
    with pytest.raises(ValueError, match="empty vocabulary"):
        argmax_prob(torch.zeros(2, 0, device=device))
    with pytest.raises(ValueError, match=r"logits \[B, V\]"):
        argmax_prob(torch.zeros(2, 8, device=device)[:, ::2])


@pytest.mark.gpu
def test_programmatic_launch_gives_the_same_index(device):
    from deepinfer_kernels import pdl_supported

    if not pdl_supported(torch.device(device)):
        pytest.skip("programmatic dependent launch needs compute capability 9.0+ and Triton 3.4+")
    x = randn(2, 128256, dtype=torch.bfloat16, device=device)
    x[1, 70000] = x[1, 90000] = 40.0  # a tie across chunks: the first wins
    assert argmax(x, pdl=True).tolist() == argmax_ref(x).tolist()
    prob, idx = argmax_prob(x, pdl=True)
    ref_prob, ref_idx = argmax_prob_ref(x)
    assert idx.tolist() == ref_idx.tolist() and torch.allclose(prob, ref_prob, rtol=1e-4)
    assert all(int(c.abs().sum()) == 0 for c in _COUNTERS.values())
