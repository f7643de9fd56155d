"""Single-token projections (with norm, residual, SiLU-mul, rotary folded in) against the eager ops."""
from __future__ import annotations

import pytest
import torch

from deepinfer_kernels import GemvConfig, gemv, gemv_qkv_rotary, gemv_qkv_rotary_ref, gemv_ref
from deepinfer_kernels._launch import _COUNTERS
from tests.kernels.paged import DTYPES, randn

TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}
#: one program over all of K, and split K (with a ragged last slice, and a loop inside each slice)
CONFIGS = [GemvConfig(8, 16, 1), GemvConfig(4, 8, 3), GemvConfig(2, 4, 4), GemvConfig(4, 8, 2, prefetch=False)]


def _close(got, want, dtype):
    torch.testing.assert_close(got, want, atol=TOL[dtype], rtol=TOL[dtype])


def _counters_zero():
    return all(int(c.abs().sum()) == 0 for c in _COUNTERS.values())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_plain_and_normed_projection(dtype, cfg, device):
    x = randn(1, 40, dtype=dtype, device=device)  # K = 40, N = 27: neither fills a tile
    w = randn(27, 40, dtype=dtype, device=device, seed=1) * 0.3
    nw = randn(40, dtype=dtype, device=device, seed=2)
    _close(gemv(x, w, config=cfg), gemv_ref(x, w), dtype)
    _close(gemv(x, w, norm_weight=nw, eps=1e-5, config=cfg), gemv_ref(x, w, norm_weight=nw, eps=1e-5), dtype)
    assert _counters_zero()  # the split-K hand-off leaves its counters ready for the next launch


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_residual_add_in_place(dtype, cfg, device):
    x = randn(1, 40, dtype=dtype, device=device)
    w = randn(24, 40, dtype=dtype, device=device, seed=1) * 0.3
    res = randn(1, 24, dtype=dtype, device=device, seed=3)
    want = gemv_ref(x, w, residual=res.clone())
    got = gemv(x, w, residual=res, config=cfg)
    assert got.data_ptr() == res.data_ptr()
    _close(res, want, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_gate_up_with_silu_mul(dtype, cfg, device):
    x = randn(1, 40, dtype=dtype, device=device)
    w = randn(2 * 19, 40, dtype=dtype, device=device, seed=1) * 0.3  # I = 19
    nw = randn(40, dtype=dtype, device=device, seed=2)
    got = gemv(x, w, norm_weight=nw, silu_mul=True, config=cfg)
    assert got.shape == (1, 19)
    _close(got, gemv_ref(x, w, norm_weight=nw, silu_mul=True), dtype)


def _qkv_args(dtype, device, qk_norm):
    """gemv_qkv_rotary's positional arguments: 4 q heads, 2 kv heads, head_dim 8, K = 48, position 11."""
    h, kv, d, k = 4, 2, 8, 48
    x = randn(1, k, dtype=dtype, device=device)
    w = randn((h + 2 * kv) * d, k, dtype=dtype, device=device, seed=1) * 0.3
    nw = randn(k, dtype=dtype, device=device, seed=2)
    ang = torch.outer(torch.arange(16.0), torch.rand(d // 2, generator=torch.Generator().manual_seed(4)))
    cos = torch.cat([ang, ang], -1).cos().to(dtype).to(device)
    sin = torch.cat([ang, ang], -1).sin().to(dtype).to(device)
    qn = randn(d, dtype=dtype, device=device, seed=5) if qk_norm else None
    kn = randn(d, dtype=dtype, device=device, seed=6) if qk_norm else None
    return (x, w, nw, 1e-6, cos, sin, torch.tensor([11], device=device), h, kv, qn, kn, 1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize("cfg", [None, GemvConfig(2, 16, 1), GemvConfig(4, 8, 2)], ids=str)
def test_qkv_with_rotary(dtype, qk_norm, cfg, device):
    args = _qkv_args(dtype, device, qk_norm)
    x, w, nw, h, kv, d = args[0], args[1], args[2], args[7], args[8], args[4].shape[1]
    if qk_norm and cfg is not None:  # the q/k norm takes whole heads in a program
        with pytest.raises(ValueError, match="whole heads"):
            gemv_qkv_rotary(*args, config=GemvConfig(d // 4, 16, 1))
        cfg = GemvConfig(d // 2, cfg.block_k, cfg.split_k)
    got = gemv_qkv_rotary(*args, config=cfg)
    want = gemv_qkv_rotary_ref(*args)
    _close(got, want, dtype)
    # the v heads are the plain projection: no rotation, no norm
    _close(got[:, (h + kv) * d:], gemv_ref(x, w, norm_weight=nw)[:, (h + kv) * d:], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize("slot", [5, -1])
def test_qkv_writes_the_kv_cache(dtype, qk_norm, slot, device):
    """With kv_cache, the token's k (rotated) and v land at its slot, exactly as write_kv_cache puts
    them; nothing else in the caches changes; a negative slot writes nothing."""
    args = _qkv_args(dtype, device, qk_norm)
    h, kv, d = args[7], args[8], args[4].shape[1]
    caches = [randn(12, kv, d, dtype=dtype, device=device, seed=s) for s in (7, 8)]
    want = [c.clone() for c in caches]
    at = torch.tensor([slot], device=device)
    cfg = GemvConfig(d // 2, 16, 2) if qk_norm else GemvConfig(2, 16, 2)  # split K: the last program writes
    got = gemv_qkv_rotary(*args, config=cfg, kv_cache=(caches[0], caches[1], at))
    ref = gemv_qkv_rotary_ref(*args, kv_cache=(want[0], want[1], at))
    _close(got, ref, dtype)
    _close(caches[0], want[0], dtype)
    _close(caches[1], want[1], dtype)
    others = torch.arange(12, device=device) != slot
    assert torch.equal(caches[0][others], want[0][others]) and torch.equal(caches[1][others], want[1][others])
    if slot >= 0:  # the written key and value are the returned ones, bit for bit
        assert torch.equal(caches[0][slot].reshape(-1), got[0, h * d:(h + kv) * d])
        assert torch.equal(caches[1][slot].reshape(-1), got[0, (h + kv) * d:])


def test_bad_shapes_are_refused(device):
    x = randn(2, 16, dtype=torch.float32, device=device)
    w = randn(8, 16, dtype=torch.float32, device=device)
    with pytest.raises(ValueError, match=r"one row x \[1, K\]"):
        gemv(x, w)
    with pytest.raises(ValueError, match="silu_mul takes gate"):
        gemv(x[:1], w[:7], silu_mul=True)
    with pytest.raises(ValueError, match="residual must be"):
        gemv(x[:1], w, residual=torch.zeros(1, 9, device=device))
    with pytest.raises(ValueError, match="kv_cache takes float caches"):
        cos = torch.zeros(4, 8, device=device)
        gemv_qkv_rotary(x[:1], randn(4 * 8, 16, dtype=torch.float32, device=device), torch.ones(16, device=device),
                        1e-6, cos, cos, torch.tensor([0], device=device), 2, 1,
                        kv_cache=(torch.zeros(4, 2, 8, device=device),) * 2 + (torch.zeros(1, device=device),))
    with pytest.raises(ValueError, match="block_n 4 must divide"):
        cos = torch.zeros(4, 4, device=device)
        gemv_qkv_rotary(x[:1], randn(4 * 4, 16, dtype=torch.float32, device=device), torch.ones(16, device=device),
                        1e-6, cos, cos, torch.tensor([0], device=device), 2, 1, config=GemvConfig(4, 8, 1))


def test_fused_ops_offer_the_gemvs_only_when_asked(device):
    from deepinfer_kernels import FusedOps, rms_norm

    on, off = FusedOps(), FusedOps(single_token_gemv=False)
    assert off.gemv is None and off.gemv_qkv_rotary is None and off.rms_norm is rms_norm
    x = randn(1, 16, dtype=torch.float32, device=device)
    w = randn(8, 16, dtype=torch.float32, device=device, seed=1)
    _close(on.gemv(x, w), gemv_ref(x, w), torch.float32)  # no PDL off a Hopper GPU; same result on one


@pytest.mark.parametrize("dtype", DTYPES)
def test_l2_hints_change_no_result(dtype, device):
    x = randn(1, 48, dtype=dtype, device=device)
    w = randn(40, 48, dtype=dtype, device=device, seed=1)
    plain = gemv(x, w, norm_weight=torch.ones(48, dtype=dtype, device=device), config=GemvConfig(4, 16, 2))
    for evict in ("evict_first", "evict_last"):
        got = gemv(x, w, norm_weight=torch.ones(48, dtype=dtype, device=device), config=GemvConfig(4, 16, 2),
                   evict=evict)
        assert torch.equal(got, plain), evict
    with pytest.raises(ValueError, match="evict must be one of"):
        gemv(x, w, evict="evict_normal")


def test_fused_ops_keep_the_first_weights_in_the_l2_until_the_bytes_are_spent(device):
    from deepinfer_kernels import FusedOps

    ws = [torch.zeros(n, 8, device=device) for n in (10, 20, 40, 1)]  # 320, 640, 1,280, 32 bytes
    assert [FusedOps().evict_policy(w) for w in ws] == [""] * 4  # no budget: the default policy
    ops = FusedOps(l2_keep_bytes=1000)
    asked = [ops.evict_policy(w) for w in ws]
    # the first two fit (960 bytes); the third does not; the fourth still fits what is left; each
    # weight keeps the policy it was first given
    assert asked == ["evict_last", "evict_last", "evict_first", "evict_last"]
    assert [ops.evict_policy(w) for w in reversed(ws)] == asked[::-1]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cfg", [GemvConfig(2, 16, 1), GemvConfig(2, 8, 3)], ids=str)
@pytest.mark.parametrize("qk_norm", [False, True])
def test_epilogue_inputs_read_before_the_loop(dtype, cfg, qk_norm, device):
    """The epilogue's reads (residual, position, rotary tables, slot) are asked for ahead of the K
    loop: the outputs and the written cache match the reference, split K and a partial row block
    included."""
    args = _qkv_args(dtype, device, qk_norm)
    kv, d = args[8], args[4].shape[1]
    if qk_norm:  # whole heads in a program
        cfg = GemvConfig(d // 2, cfg.block_k, cfg.split_k)
    x, w = args[0], args[1][:27]  # N = 27: the last row block is partial
    res0 = randn(1, 27, dtype=dtype, device=device, seed=3)
    caches = [randn(12, kv, d, dtype=dtype, device=device, seed=s) for s in (7, 8)]
    want = [c.clone() for c in caches]
    at = torch.tensor([5], device=device)
    _close(gemv_qkv_rotary(*args, config=cfg, kv_cache=(caches[0], caches[1], at)),
           gemv_qkv_rotary_ref(*args, kv_cache=(want[0], want[1], at)), dtype)
    _close(caches[0], want[0], dtype)
    _close(caches[1], want[1], dtype)
    _close(gemv(x, w, residual=res0.clone(), config=cfg), gemv_ref(x, w, residual=res0.clone()), dtype)
    assert _counters_zero()
