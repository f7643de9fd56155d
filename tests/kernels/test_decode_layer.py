"""The fused single-token decoder layer against the torch reference (GEMV references, float32 attention)."""
from __future__ import annotations

import pytest
import torch

from deepinfer_kernels.decode_layer import LayerConfig, LayerWeights, PagedKV, decode_layer, decode_layer_ref
from deepinfer_kernels.gemv import _COUNTERS
from tests.kernels.paged import DTYPES, TOL, random_paged_kv, randn

H, KV, D, HID, INTER, BS = 4, 2, 16, 64, 96, 4


def _layer(dtype, device, qk_norm):
    def w(*shape, seed):
        return (randn(*shape, dtype=dtype, device=device, seed=seed) * 0.2).contiguous()

    return LayerWeights(qkv=w((H + 2 * KV) * D, HID, seed=1), o=w(HID, H * D, seed=2), gate_up=w(2 * INTER, HID, seed=3),
                        down=w(HID, INTER, seed=4), input_norm=1 + w(HID, seed=5), post_norm=1 + w(HID, seed=6),
                        eps=1e-5, q_norm=1 + w(D, seed=7) if qk_norm else None,
                        k_norm=1 + w(D, seed=8) if qk_norm else None, qk_eps=1e-6)


def _rotary(dtype, device):
    ang = torch.outer(torch.arange(64.0), 1.0 / 100 ** (torch.arange(0, D, 2) / D))
    return (torch.cat([ang, ang], -1).cos().to(dtype).to(device), torch.cat([ang, ang], -1).sin().to(dtype).to(device))


def _run(fn, dtype, device, seq_len, window, qk_norm, cfg):
    """One layer step for the token at position seq_len - 1; returns (residual, k_cache, v_cache)."""
    k_cache, v_cache, tables = random_paged_kv([seq_len], BS, KV, D, dtype, device, seed=seq_len)
    slot = tables[0, (seq_len - 1) // BS].long() * BS + (seq_len - 1) % BS
    kv = PagedKV(k_cache, v_cache, slot.reshape(1), tables[0].contiguous(),
                 torch.tensor([seq_len], dtype=torch.int32, device=device), BS, D ** -0.5, window)
    cos, sin = _rotary(dtype, device)
    res = randn(1, HID, dtype=dtype, device=device, seed=9)
    out = fn(res, _layer(dtype, device, qk_norm), H, KV, cos, sin,
             torch.tensor([seq_len - 1], device=device), kv, config=cfg)
    assert out.data_ptr() == res.data_ptr()  # in place
    return res, k_cache, v_cache


CFGS = [None, LayerConfig((2, 16), (4, 32), (2, 32), (8, 16), splits=3, block_keys=16)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize("seq_len,window", [(1, None), (23, None), (40, 9)])
@pytest.mark.parametrize("cfg", CFGS, ids=["default", "small-tiles"])
def test_layer_matches_reference(dtype, qk_norm, seq_len, window, cfg, device):
    if qk_norm and cfg is not None:
        cfg = LayerConfig((D // 2, 16), cfg.o, cfg.gate_up, cfg.down, cfg.splits, cfg.block_keys)
    got, gk, gv = _run(decode_layer, dtype, device, seq_len, window, qk_norm, cfg)
    want, wk, wv = _run(decode_layer_ref, dtype, device, seq_len, window, qk_norm, cfg)
    tol = TOL[dtype] * 10  # ~8 roundings in a row, and attention summed in another order
    torch.testing.assert_close(gk, wk, atol=tol, rtol=tol)  # the new key and value, and nothing else
    torch.testing.assert_close(gv, wv, atol=tol, rtol=tol)
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)
    # every launch leaves its counters zero for the next one
    assert all(int(c.abs().sum()) == 0 for c in _COUNTERS.values())


def test_consecutive_layers_alternate_counters(device):
    """Two layers in a row on the two counter sets, as a model runs them."""
    cos, sin = _rotary(torch.float32, device)
    k_cache, v_cache, tables = random_paged_kv([10], BS, KV, D, torch.float32, device)
    slot = (tables[0, 9 // BS].long() * BS + 9 % BS).reshape(1)
    kv = PagedKV(k_cache, v_cache, slot, tables[0].contiguous(), torch.tensor([10], dtype=torch.int32, device=device),
                 BS, D ** -0.5)
    layers = [_layer(torch.float32, device, False), _layer(torch.float32, device, True)]
    got = randn(1, HID, dtype=torch.float32, device=device, seed=9)
    want = got.clone()
    pos = torch.tensor([9], device=device)
    for i, w in enumerate(layers):
        decode_layer(got, w, H, KV, cos, sin, pos, kv, parity=i)
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    for w in layers:
        decode_layer_ref(want, w, H, KV, cos, sin, pos, PagedKV(ref_k, ref_v, *list(kv.__dict__.values())[2:]))
    torch.testing.assert_close(got, want, atol=2e-4, rtol=2e-4)


def test_bad_input_is_refused(device):
    cos, sin = _rotary(torch.float32, device)
    k_cache, v_cache, tables = random_paged_kv([5], BS, KV, D, torch.float32, device)
    kv = PagedKV(k_cache, v_cache, torch.tensor([4], device=device), tables[0].contiguous(),
                 torch.tensor([5], dtype=torch.int32, device=device), BS, 0.25)
    w = _layer(torch.float32, device, False)
    res = randn(1, HID, dtype=torch.float32, device=device)
    pos = torch.tensor([4], device=device)
    with pytest.raises(ValueError, match=r"residual of one token"):
        decode_layer(res.expand(2, HID), w, H, KV, cos, sin, pos, kv)
    with pytest.raises(ValueError, match=r"weight o must be"):
        decode_layer(res, LayerWeights(**{**w.__dict__, "o": w.o[:, :-1]}), H, KV, cos, sin, pos, kv)
    with pytest.raises(ValueError, match=r"tiles .* do not fit"):
        decode_layer(res, w, H, KV, cos, sin, pos, kv, config=LayerConfig((3, 16), (4, 32), (2, 32), (8, 16)))
    with pytest.raises(ValueError, match=r"caches"):
        decode_layer(res, w, H, KV, cos, sin, pos, PagedKV(k_cache[:, :1], v_cache[:, :1], *list(kv.__dict__.values())[2:]))
    torch.testing.assert_close(res, randn(1, HID, dtype=torch.float32, device=device))  # nothing was touched
