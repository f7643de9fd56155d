"""On an Ascend NPU: the real torch-npu ops agree with the CPU stand-ins the other tests rely on,
and the engine on the NPU agrees with the torch backend.

Marked `ascend`: skipped wherever torch_npu cannot be imported. Nothing here has run yet; the
first run on Ascend hardware is what checks the stand-ins (and so every other test here).
Run with `pytest -m ascend tests/plugins/ascend`.
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from deepinfer.plugins import AttentionLayerSpec, NoOptions, StepBatch
from tests.plugins.ascend.standin_plugin import StandinAscendAttention
from tests.plugins.ascend.standins import standin_npu

pytestmark = pytest.mark.ascend
NPU = "npu:0"
BF16_ATOL = 2e-2


@pytest.fixture(scope="module")
def torch_npu():
    import torch_npu

    return torch_npu


def _step(q_lens: list[int], ctx_lens: list[int], block_size: int, device: str) -> StepBatch:
    """A step like the model runner builds: sequence i owns blocks 1 + i * n .. (n each), shuffled."""
    seq_lens = [q + c for q, c in zip(q_lens, ctx_lens, strict=True)]
    n = max(math.ceil(s / block_size) for s in seq_lens)
    perm = torch.randperm(len(q_lens) * n, generator=torch.Generator().manual_seed(0)) + 1
    tables = perm.view(len(q_lens), n).to(torch.int32)
    slots, pos = [], []
    for i, (q, c) in enumerate(zip(q_lens, ctx_lens, strict=True)):
        p = torch.arange(c, c + q)
        pos.append(p)
        slots.append(tables[i, p // block_size].long() * block_size + p % block_size)
    qsl = torch.zeros(len(q_lens) + 1, dtype=torch.int32)
    qsl[1:] = torch.tensor(q_lens).cumsum(0)
    return StepBatch(
        input_ids=torch.zeros(sum(q_lens), dtype=torch.long, device=device), positions=torch.cat(pos).to(device),
        slot_mapping=torch.cat(slots).to(device), query_start_loc=qsl.to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        context_lens=torch.tensor(ctx_lens, dtype=torch.int32, device=device), block_tables=tables.to(device),
        query_lens_cpu=tuple(q_lens), seq_lens_cpu=tuple(seq_lens), block_size=block_size,
        max_query_len=max(q_lens), max_seq_len=max(seq_lens))


@pytest.mark.parametrize("window", [None, 100])
@pytest.mark.parametrize(("q_lens", "ctx_lens"), [([300, 17, 1], [0, 200, 250]), ([1, 1, 1], [5, 130, 399])],
                         ids=["prefill-extend-decode", "decode-only"])
def test_attention_forward_on_the_npu_matches_the_standins(torch_npu, window, q_lens, ctx_lens):
    from deepinfer_builtin.attention.ascend import AscendAttention

    spec = AttentionLayerSpec(0, num_heads=8, num_kv_heads=2, head_dim=128, sliding_window=window, scale=128 ** -0.5)
    ctx = SimpleNamespace(config=SimpleNamespace(block_size=128), layers=[spec])
    real, standin = AscendAttention(NoOptions(), ctx), StandinAscendAttention(NoOptions(), ctx)
    num_blocks = 1 + len(q_lens) * math.ceil(max(q + c for q, c in zip(q_lens, ctx_lens)) / 128)
    torch.manual_seed(0)
    cache = torch.randn(2, num_blocks, 128, 2, 128, dtype=torch.bfloat16)  # stands for earlier steps' KV
    t = sum(q_lens)
    q, k, v = (torch.randn(t, h, 128, dtype=torch.bfloat16) for h in (8, 2, 2))
    npu_cache = cache.to(NPU)
    out = real.forward(spec, q.to(NPU), k.to(NPU), v.to(NPU), npu_cache,
                       real.build_metadata(_step(q_lens, ctx_lens, 128, NPU)))
    ref = standin.forward(spec, q, k, v, cache, standin.build_metadata(_step(q_lens, ctx_lens, 128, "cpu")))
    torch.testing.assert_close(npu_cache.cpu(), cache, rtol=0, atol=0)  # the KV writes
    torch.testing.assert_close(out.float().cpu(), ref.float(), rtol=0, atol=BF16_ATOL)


@pytest.mark.parametrize("op", ["npu_scatter_pa_kv_cache", "_npu_reshape_and_cache"])
def test_kv_writes_match_the_standins(torch_npu, op):
    if not hasattr(torch_npu, op):
        pytest.skip(f"this torch_npu has no {op}")
    torch.manual_seed(0)
    key, value = torch.randn(40, 2, 128, dtype=torch.bfloat16), torch.randn(40, 2, 128, dtype=torch.bfloat16)
    slots = torch.randperm(4 * 128)[:40].to(torch.int32)
    caches = [torch.zeros(4, 128, 2, 128, dtype=torch.bfloat16) for _ in range(2)]
    npu_caches = [c.to(NPU) for c in caches]
    args = {"key": key.to(NPU), "value": value.to(NPU), "key_cache": npu_caches[0], "value_cache": npu_caches[1]}
    if op == "npu_scatter_pa_kv_cache":
        torch_npu.npu_scatter_pa_kv_cache(*args.values(), slots.to(NPU))
    else:
        torch_npu._npu_reshape_and_cache(**args, slot_indices=slots.to(NPU))
    getattr(standin_npu(), op)(key, value, caches[0], caches[1], slots)
    for a, b in zip(npu_caches, caches, strict=True):
        torch.testing.assert_close(a.cpu(), b, rtol=0, atol=0)


def test_rms_norm_and_rotary_ops_match_the_standins(torch_npu):
    from deepinfer_builtin.devices.ascend.layers import apply_rotary, rms_norm

    torch.manual_seed(0)
    x, res, w = torch.randn(9, 256, dtype=torch.bfloat16), torch.randn(9, 256, dtype=torch.bfloat16), torch.randn(256)
    w = w.to(torch.bfloat16)
    ours = rms_norm(torch_npu, x.to(NPU), w.to(NPU), 1e-6, residual=res.to(NPU))
    ref = rms_norm(standin_npu(), x, w, 1e-6, residual=res)
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a.float().cpu(), b.float(), rtol=0, atol=BF16_ATOL * 4)
    q, k = torch.randn(9, 8, 128, dtype=torch.bfloat16), torch.randn(9, 2, 128, dtype=torch.bfloat16)
    angle = torch.rand(9, 64) * 6.28
    cos, sin = (torch.cat([f(angle)] * 2, -1).to(torch.bfloat16) for f in (torch.cos, torch.sin))
    ours = apply_rotary(torch_npu, q.to(NPU), k.to(NPU), cos.to(NPU), sin.to(NPU))
    ref = apply_rotary(standin_npu(), q, k, cos, sin)
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a.float().cpu(), b.float(), rtol=0, atol=BF16_ATOL)


def test_device_answers_memory_streams_events_and_graphs(torch_npu):
    from deepinfer.core.config import EngineConfig
    from deepinfer.core.metrics import Metrics
    from deepinfer.plugins import EngineContext
    from deepinfer_builtin.devices.ascend.device import AscendDevice, AscendOptions

    assert AscendDevice.unavailable_reason() is None
    ctx = EngineContext(config=EngineConfig(gpu_memory_utilization=0.5), metrics=Metrics())
    dev = AscendDevice(AscendOptions(), ctx)
    assert ctx.config.block_size == 128
    assert dev.torch_device.type == "npu" and dev.kv_cache_budget(0) > 0
    stream, event = dev.stream(), dev.event()
    with torch.npu.stream(stream):
        x = torch.ones(4, device=dev.torch_device) * 2
        event.record()
    event.synchronize()
    graph = dev.new_graph()
    if graph is not None:  # eager otherwise
        static = torch.zeros(4, device=dev.torch_device)
        with dev.capture(graph):
            static.add_(x)
        graph.replay()
        dev.synchronize()
        assert static.cpu().tolist() == [4.0] * 4  # once at capture, once at replay


def test_engine_on_the_npu_matches_the_torch_backend(tmp_path):
    from deepinfer import LLM, SamplingParams
    from tests.tiny_models import hybrid, make_model

    make_model(tmp_path, "qwen3", dtype=torch.bfloat16, hidden_size=256, num_attention_heads=4, num_key_value_heads=2,
               head_dim=128, **hybrid(100))
    prompts = [{"prompt_token_ids": [(7 * i + j) % 300 + 6 for j in range(n)]} for i, n in enumerate((250, 40, 130))]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, prompt_logprobs=1)
    ours = LLM(str(tmp_path), device="ascend", dtype="bfloat16", block_size=128, progress=False)
    ref = LLM(str(tmp_path), device="cpu", dtype="float32", block_size=128, progress=False)
    for a, b in zip(ours.generate(prompts, params, use_tqdm=False), ref.generate(prompts, params, use_tqdm=False),
                    strict=True):
        for x, y in zip(a.prompt_logprobs[1:], b.prompt_logprobs[1:], strict=True):
            token = next(iter(y))
            assert abs(x[token] - y[token]) < 0.1  # bf16 on the NPU against float32 on the CPU
