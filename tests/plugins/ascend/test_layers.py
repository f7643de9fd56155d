"""RMSNorm and rotary embedding through the fused-op wrappers equal the model definitions' layers.

Oracle: deepinfer.models.layers (RMSNorm, RotaryEmbedding), checked against transformers elsewhere.
With the stand-ins the wrappers' argument building (shapes, layouts, the residual variant) runs;
without the ops they fall back to plain torch.
"""
from __future__ import annotations

import pytest
import torch

from deepinfer.models.layers import RMSNorm, RotaryEmbedding
from deepinfer_builtin.devices.ascend.layers import apply_rotary, rms_norm
from tests.plugins.ascend.standins import standin_npu

WITH_OPS = pytest.mark.parametrize("missing", [(), ("npu_rms_norm", "npu_add_rms_norm", "npu_rotary_mul")],
                                   ids=["fused", "fallback"])


@WITH_OPS
def test_rms_norm_with_and_without_residual_matches_the_model_layer(missing):
    torch.manual_seed(0)
    norm = RMSNorm(64, 1e-6)
    norm.weight.data = torch.randn(64)
    x, res = torch.randn(7, 64), torch.randn(7, 64)
    npu = standin_npu(missing)
    torch.testing.assert_close(rms_norm(npu, x, norm.weight, 1e-6), norm(x), rtol=0, atol=1e-6)
    y, new_res = rms_norm(npu, x, norm.weight, 1e-6, residual=res)
    ref_y, ref_res = norm(x, res)
    torch.testing.assert_close(y, ref_y, rtol=0, atol=1e-6)
    torch.testing.assert_close(new_res, ref_res, rtol=0, atol=0)
    assert bool(npu.calls) == (not missing)


@WITH_OPS
def test_rotary_matches_the_model_layer_for_query_and_grouped_key_heads(missing):
    torch.manual_seed(0)
    rope = RotaryEmbedding(16, 128, 10000.0, None)
    rope.build(torch.device("cpu"), torch.float32)
    positions = torch.tensor([0, 1, 2, 40, 41, 7])
    q, k = torch.randn(6, 4, 16), torch.randn(6, 2, 16)
    npu = standin_npu(missing)
    ours = apply_rotary(npu, q, k, rope.cos[positions], rope.sin[positions])
    for a, b in zip(ours, rope(positions, q, k), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    assert bool(npu.calls) == (not missing)
