"""The ascend attention backend's argument building, run on the CPU with the torch-npu stand-ins,
against the `torch` reference backend on a tiny model with a sliding-window and a full layer.

Oracle: the `torch` backend (itself checked against transformers). What runs here is the plugin's
own code (KV layout, metadata, every argument of every torch-npu call); only the ops are
stand-ins (standins.py), so these tests say nothing about the real kernels' numerics.
"""
from __future__ import annotations

import random

import pytest

from deepinfer import LLM, SamplingParams
from deepinfer_builtin.devices.ascend.ops import TORCH_NPU_LIMITS
from tests.plugins.ascend.standin_plugin import StandinAscendAttention

pytestmark = pytest.mark.usefixtures("standin_registered")


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(6, 320) for _ in range(rng.randrange(3, 60))] for _ in range(n)]


def _run(model: str, plugins: list[str], prompts, params, **config):
    llm = LLM(model, device="cpu", dtype="float32", plugins=plugins, kv_cache_memory_gb=0.01, progress=False, **config)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    llm.engine.kv.pool.check_all_free()
    return outs


def _assert_same(ours, ref) -> None:
    for a, b in zip(ours, ref, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert len(a.prompt_logprobs) == len(b.prompt_logprobs)
        for x, y in zip(a.prompt_logprobs, b.prompt_logprobs, strict=True):
            if x is None:
                assert y is None
                continue
            assert x.keys() == y.keys()
            assert all(abs(x[t] - y[t]) <= 1e-5 for t in x)


GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, prompt_logprobs=3)


@pytest.mark.parametrize("config", [
    pytest.param({"block_size": 4, "max_num_batched_tokens": 16}, id="block4-chunked"),
    pytest.param({"block_size": 128}, id="block128"),
])
def test_matches_torch_backend_on_prefill_extend_and_decode(qwen3_swa, config):
    prompts = _prompts(6)  # 3..59 tokens: most longer than the 12-token window
    ref = _run(qwen3_swa, [], prompts, GREEDY, **config)
    ours = _run(qwen3_swa, ["ascend-standin"], prompts, GREEDY, **config)
    _assert_same(ours, ref)
    calls = {(name, layout, mode, masked) for name, layout, mode, masked, _ in StandinAscendAttention.last.npu.calls}
    # both kernels' paths ran: TND causal (full layer), TND band (sliding layer), BSH decode with and
    # without the window mask, and the KV writes
    assert {("npu_fused_infer_attention_score", "TND", 3, True), ("npu_fused_infer_attention_score", "TND", 4, True),
            ("npu_fused_infer_attention_score", "BSH", 0, True), ("npu_fused_infer_attention_score", "BSH", 0, False),
            ("npu_scatter_pa_kv_cache", None, None, False)} <= calls


def test_band_keeps_the_token_and_the_window_minus_one_before_it(qwen3_swa):
    _run(qwen3_swa, ["ascend-standin"], _prompts(1), GREEDY, block_size=4)
    pre = {p for name, layout, mode, _, p in StandinAscendAttention.last.npu.calls if mode == 4}
    assert pre == {11}  # window 12 (deepinfer: the token and the 11 before it) -> pre_tokens 11


def test_falls_back_to_npu_reshape_and_cache_with_int32_slots(qwen3_swa, monkeypatch):
    monkeypatch.setattr(StandinAscendAttention, "missing", ("npu_scatter_pa_kv_cache",))
    prompts = _prompts(3, seed=2)
    ref = _run(qwen3_swa, [], prompts, GREEDY, block_size=8)
    ours = _run(qwen3_swa, ["ascend-standin"], prompts, GREEDY, block_size=8)
    _assert_same(ours, ref)
    names = {c[0] for c in StandinAscendAttention.last.npu.calls}
    assert "_npu_reshape_and_cache" in names and "npu_scatter_pa_kv_cache" not in names


def test_seeded_sampling_is_the_same_alone_and_batched(qwen3_swa):
    seeded = SamplingParams(temperature=0.9, top_p=0.95, top_k=50, seed=1234, max_tokens=20, ignore_eos=True)
    others = SamplingParams(temperature=1.0, max_tokens=30, ignore_eos=True)
    prompts = _prompts(6, seed=1)
    llm = LLM(qwen3_swa, device="cpu", dtype="float32", plugins=["ascend-standin"], block_size=4,
              kv_cache_memory_gb=0.01, progress=False)
    alone = llm.generate({"prompt_token_ids": prompts[0]}, seeded, use_tqdm=False)[0].outputs[0].token_ids
    batch = llm.generate([{"prompt_token_ids": p} for p in prompts], [seeded] + [others] * 5, use_tqdm=False)
    assert batch[0].outputs[0].token_ids == alone


def test_block_sizes_the_paged_kernel_cannot_take_are_refused_before_loading(qwen3_swa, monkeypatch):
    monkeypatch.setattr(StandinAscendAttention, "limits_for_test", TORCH_NPU_LIMITS)
    with pytest.raises(ValueError, match=r"block_size in \[128, 256, 384, 512\].*got 16.*--block-size 128"):
        LLM(qwen3_swa, device="cpu", plugins=["ascend-standin"], block_size=16, progress=False)


def test_dtypes_and_head_dims_the_kernel_cannot_take_are_refused(qwen3_swa, monkeypatch):
    monkeypatch.setattr(StandinAscendAttention, "limits_for_test", TORCH_NPU_LIMITS)
    with pytest.raises(ValueError, match="head_dim .*64, 128, 192.* has 16"):
        LLM(qwen3_swa, device="cpu", dtype="bfloat16", plugins=["ascend-standin"], block_size=128, progress=False)
    with pytest.raises(ValueError, match="runs in float16, bfloat16, not float32.*--dtype bfloat16"):
        TORCH_NPU_LIMITS.check_layer(128, __import__("torch").float32)


def test_swa_replay_is_refused_it_needs_per_group_block_tables(qwen3_swa):
    from deepinfer.plugins import PluginError

    with pytest.raises(PluginError, match="attention plugin 'ascend-standin' cannot keep the sliding-window"):
        LLM(qwen3_swa, device="cpu", dtype="float32", plugins=["ascend-standin", "prefix-cache", "swa-replay"],
            block_size=128, kv_cache_memory_gb=0.01, progress=False)
