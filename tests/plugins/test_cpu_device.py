"""The `cpu` device's bfloat16 linear layers: on AVX2 CPUs without AVX-512 deepinfer's kernel, or
float32 for many rows; on AVX-512 CPUs the kernel for a few rows, torch's matmul for more."""
from __future__ import annotations

import pydantic
import pytest
import torch
import torch.nn.functional as F

from deepinfer import LLM, SamplingParams
from deepinfer_builtin.devices import cpu
from tests.tiny_models import make_model


@pytest.fixture
def mm_calls(monkeypatch):
    """Shapes of the torch.mm calls made meanwhile (the float32 route's; F.linear does not call it)."""
    calls = []
    mm = torch.mm
    monkeypatch.setattr(torch, "mm", lambda a, b, **kw: calls.append((a.shape, b.shape)) or mm(a, b, **kw))
    return calls


@pytest.mark.parametrize("rows", [2, 4, 9])
@pytest.mark.parametrize("with_bias", [False, True])
def test_widened_linear_is_the_exact_product_rounded_once(mm_calls, rows, with_bias):
    torch.manual_seed(rows)
    # 71 output rows of 24 in pieces of 5 rows (chunk 120 elements): 15 pieces, the last of 1 row
    weight = torch.randn(71, 24).bfloat16()
    bias = torch.randn(71).bfloat16() if with_bias else None
    x = torch.randn(2, rows, 24).bfloat16()
    out = cpu.widened_linear(x, weight, bias, from_rows=4, chunk=120)
    assert out.shape == (2, rows, 71) and out.dtype == torch.bfloat16
    # 2 x rows >= 4 rows: the float32 route, one matmul a piece, over all the rows at once
    assert mm_calls == [((2 * rows, 24), (24, 5))] * 14 + [((2 * rows, 24), (24, 1))]
    exact = x.double() @ weight.double().t()
    if bias is not None:
        exact += bias.double()
    # within one bfloat16 rounding (2^-8 relative) of the exact result, plus float32's accumulation
    assert ((out.double() - exact).abs() <= exact.abs() * 2 ** -8 + 1e-4).all()


def test_widened_linear_leaves_few_rows_other_dtypes_and_compiled_code_to_torch(mm_calls):
    torch.manual_seed(0)
    weight = torch.randn(40, 16).bfloat16()
    x = torch.randn(3, 16).bfloat16()
    assert torch.equal(cpu.widened_linear(x, weight, from_rows=4), F.linear(x, weight))
    w32, x32 = weight.float(), torch.randn(8, 16)
    assert torch.equal(cpu.widened_linear(x32, w32, from_rows=1), F.linear(x32, w32))
    assert mm_calls == []
    # a float32 x with a bfloat16 weight is refused as F.linear refuses it, whatever the rows
    with pytest.raises(RuntimeError):
        cpu.widened_linear(x32, weight, from_rows=1)
    compiled = torch.compile(lambda a, w: cpu.widened_linear(a, w, from_rows=1, chunk=64), backend="eager",
                             fullgraph=True)
    assert torch.equal(compiled(x, weight), F.linear(x, weight))


#: the kernel can run here (an x86-64 CPU with AVX2, a C++ compiler and ninja)
KERNEL = cpu.cpu_bf16.unavailable_reason() is None
needs_kernel = pytest.mark.skipif(not KERNEL, reason=f"deepinfer's kernel: {cpu.cpu_bf16.unavailable_reason()}")


@pytest.mark.parametrize("slow, native, options, dtype, offered", [
    (True, False, {}, torch.bfloat16, True), (True, False, {"bf16_kernel_rows": 0}, torch.bfloat16, True),
    (True, False, {"bf16_float32_rows": 0}, torch.bfloat16, KERNEL),
    (True, False, {"bf16_kernel_rows": 0, "bf16_float32_rows": 0}, torch.bfloat16, False),
    (True, False, {}, torch.float32, False), (False, False, {}, torch.bfloat16, False),
    (False, True, {}, torch.bfloat16, KERNEL), (False, True, {"bf16_kernel_rows": 0}, torch.bfloat16, False),
    (False, True, {"bf16_kernel_rows": 0, "bf16_float32_rows": 9}, torch.bfloat16, False),
    (False, True, {}, torch.float32, False)])
def test_the_device_offers_it_only_for_bf16_where_it_beats_torchs(monkeypatch, tmp_path, slow, native, options,
                                                                 dtype, offered):
    monkeypatch.setattr(cpu, "slow_bf16_matmul", lambda: slow)
    monkeypatch.setattr(cpu, "native_bf16_matmul", lambda: native)
    make_model(tmp_path, "llama", dtype=dtype)
    llm = LLM(str(tmp_path), progress=False, plugin_options={"cpu": options})
    model = llm.engine.runner.model
    linears = [m for m in model.modules() if hasattr(m, "linear_op")]
    # the model itself (a tied LM head), an untied LM head, each layer's qkv, o, gate_up and down
    assert len(linears) == 1 + (model.lm_head is not None) + 4 * model.config.num_hidden_layers
    assert all((m.linear_op is not None) == offered for m in linears)


@pytest.fixture
def kernel_calls(monkeypatch):
    """(rows, weight shape) of the kernel's calls made meanwhile, through the device's linear."""
    calls = []
    kernel = cpu.cpu_bf16.bf16_linear
    monkeypatch.setattr(cpu.cpu_bf16, "bf16_linear",
                        lambda x, w, b=None: calls.append((x.numel() // x.shape[-1], tuple(w.shape))) or kernel(x, w, b))
    return calls


@pytest.mark.parametrize("route", [pytest.param("kernel", marks=needs_kernel), "float32",
                                   pytest.param("avx512", marks=needs_kernel)])
def test_bf16_prompt_logprobs_through_the_devices_linears_match_transformers(monkeypatch, mm_calls, kernel_calls,
                                                                            tmp_path, route):
    # an AVX2 CPU without AVX-512, or ("avx512") one with it: the kernel up to 6 or 16 rows, torch's matmul beyond
    monkeypatch.setattr(cpu, "slow_bf16_matmul", lambda: route != "avx512")
    monkeypatch.setattr(cpu, "native_bf16_matmul", lambda: route == "avx512")
    model = make_model(tmp_path, "llama", dtype=torch.bfloat16)
    options = {"bf16_kernel_rows": 0, "bf16_float32_rows": 1} if route == "float32" else \
        {} if route == "avx512" else {"bf16_kernel_rows": 8}
    llm = LLM(str(tmp_path), progress=False, plugin_options={"cpu": options})
    prompt = list(range(3, 40))
    out = llm.generate({"prompt_token_ids": prompt}, SamplingParams(max_tokens=4, prompt_logprobs=0),
                       use_tqdm=False)[0]
    linears = [m for m in llm.engine.runner.model.modules() if hasattr(m, "linear_op") and hasattr(m, "weight")]
    weights = {tuple(m.weight.shape) for m in linears}
    assert len(linears) == 4 * model.config.num_hidden_layers + 1  # the LM head is untied here
    # every linear of the prompt's step and of the 3 decode steps (4 a layer and the LM head)
    if route == "float32":  # each of one piece (the tiny model's weights are below the chunk)
        assert not kernel_calls and len(mm_calls) >= 4 * (4 * model.config.num_hidden_layers + 1)
        assert {tuple(b)[::-1] for _, b in mm_calls} == weights
    else:  # the 3 decode steps' one row through the kernel (and the LM head's for the prompt's last
        # token); the 37-token prompt's layers and logprobs in float32 (over 8 rows), or on an AVX-512
        # CPU through torch's bfloat16 matmul (F.linear, which calls no torch.mm)
        head = tuple(llm.engine.runner.model.lm_head.weight.shape)
        assert len([c for c in kernel_calls if c[1] != head]) == 3 * 4 * model.config.num_hidden_layers
        assert len([c for c in kernel_calls if c[1] == head]) == 4
        assert {w for _, w in kernel_calls} == weights and {r for r, _ in kernel_calls} == {1}
        assert {tuple(b)[::-1] for _, b in mm_calls} == (set() if route == "avx512" else weights)
    with torch.no_grad():
        ref = model.float()(torch.tensor([prompt])).logits[0].log_softmax(-1)
    errs = [abs(out.prompt_logprobs[i][prompt[i]] - ref[i - 1, prompt[i]].item()) for i in range(1, len(prompt))]
    assert max(errs) < 5e-2


@needs_kernel
def test_on_an_avx512_cpu_the_kernel_takes_a_few_rows_and_torch_the_rest(monkeypatch, mm_calls, kernel_calls):
    monkeypatch.setattr(cpu, "slow_bf16_matmul", lambda: False)
    monkeypatch.setattr(cpu, "native_bf16_matmul", lambda: True)
    op = cpu.CPUDevice(cpu.CPUOptions(), None).linear_op(torch.bfloat16)
    torch.manual_seed(0)
    weight = torch.randn(40, 24).bfloat16()
    limit = cpu.AVX512_KERNEL_ROWS[cpu.cpu_bf16.kernel_kind()]
    for rows in (1, limit, limit + 1, 2 * limit + 3):
        x = torch.randn(rows, 24).bfloat16()
        out = op(x, weight)
        if rows > limit:
            assert torch.equal(out, F.linear(x, weight))
        else:  # each output a float32 dot product rounded once
            exact = x.double() @ weight.double().t()
            assert ((out.double() - exact).abs() <= exact.abs() * 2 ** -8 + 1e-4).all()
    assert [r for r, _ in kernel_calls] == [1, limit] and mm_calls == []  # (no float32 route there)


@pytest.mark.parametrize("slow, native, options, target, draft", [
    (True, False, {}, torch.bfloat16, torch.bfloat16 if KERNEL else torch.float32),
    (True, False, {"bf16_kernel_rows": 0}, torch.bfloat16, torch.float32),
    (False, False, {}, torch.bfloat16, torch.float32),
    (True, False, {}, torch.float16, torch.float32), (True, False, {}, torch.float32, torch.float32),
    # an AVX-512 CPU: torch's bfloat16 single-token matmul beats float32's, with or without the kernel
    (False, True, {}, torch.bfloat16, torch.bfloat16), (False, True, {"bf16_kernel_rows": 0}, torch.bfloat16,
                                                         torch.bfloat16),
    (False, True, {}, torch.float16, torch.float32)])
def test_a_half_precision_targets_draft_is_float32_unless_bf16_is_faster(monkeypatch, slow, native, options,
                                                                        target, draft):
    monkeypatch.setattr(cpu, "slow_bf16_matmul", lambda: slow)
    monkeypatch.setattr(cpu, "native_bf16_matmul", lambda: native)
    assert cpu.CPUDevice(cpu.CPUOptions(**options), None).draft_dtype(target) == draft


@pytest.mark.slow
@needs_kernel
def test_a_bf16_draft_model_gets_it_too(monkeypatch, kernel_calls):
    monkeypatch.setattr(cpu, "slow_bf16_matmul", lambda: True)
    # the demo pair; the draft of a bfloat16 target is bfloat16 where the device has a bfloat16 matmul
    llm = LLM(progress=False, plugins=["draft-model"], plugin_options={"draft-model": {"compile": False}})
    draft = llm.engine.drafter.runner.draft.model
    assert draft is not llm.engine.runner.model and draft.model.embed_tokens.weight.dtype == torch.bfloat16
    linears = [m for m in draft.modules() if hasattr(m, "linear_op")]
    assert linears and all(m.linear_op is not None for m in linears)
    llm.generate({"prompt_token_ids": list(range(5, 30))}, SamplingParams(max_tokens=8), use_tqdm=False)
    hidden = draft.config.hidden_size
    assert any(w[1] == hidden for _, w in kernel_calls)  # the draft's own matmuls went through the kernel


@pytest.mark.parametrize("option", ["bf16_float32_rows", "bf16_kernel_rows"])
def test_a_negative_row_threshold_is_refused(tmp_path, option):
    make_model(tmp_path, "llama", dtype=torch.bfloat16)
    with pytest.raises((ValueError, pydantic.ValidationError), match=option):
        LLM(str(tmp_path), progress=False, plugin_options={"cpu": {option: -1}})
