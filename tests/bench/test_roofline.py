"""The roofline arithmetic against the figures worked out in ../shared/BENCHMARKS.md."""
from __future__ import annotations

import pytest

from deepinfer.bench.roofline import CEILINGS, ModelFacts, decode_bytes, prefill_flops
from deepinfer.bench.workloads import fixed

# Llama-3.2-1B shape in bf16: 16 layers, 8 KV heads of 64 -> 32 KiB of KV per token
LLAMA_1B = ModelFacts(params=1_235_814_400, weight_bytes=2_471_628_800, kv_bytes_per_token=16 * 2 * 8 * 64 * 2,
                      attn_flops_per_token_pair=16 * 4 * 32 * 64)


def test_batch1_decode_roofline_matches_the_weights_bound():
    wl = fixed(1, 512, 256, 1000)
    seconds = decode_bytes(LLAMA_1B, wl) / CEILINGS["NVIDIA H200"].bandwidth
    # weights alone: 2.47 GB per step -> 0.58 ms -> 1,712 tok/s; the KV read adds under 1%
    assert 256 / seconds == pytest.approx(1697, abs=5)


def test_prefill_flops_are_two_per_parameter_per_token_plus_causal_attention():
    wl = fixed(4, 4096, 1, 1000)
    flops = prefill_flops(LLAMA_1B, wl)
    dense = 2 * LLAMA_1B.params * 4 * 4096
    attention = 4 * LLAMA_1B.attn_flops_per_token_pair * 4096 * 4097 / 2
    assert flops == pytest.approx(dense + attention)
    assert dense / CEILINGS["NVIDIA H200"].bf16_flops == pytest.approx(0.0504, abs=1e-3)
