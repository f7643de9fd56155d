"""The `cpu` device's bfloat16 linear layers in float32 (CPUs without bfloat16 dot products)."""
from __future__ import annotations

import pydantic
import pytest
import torch
import torch.nn.functional as F

from deepinfer import LLM, SamplingParams
from deepinfer_builtin import cpu
from tests.tiny_models import make_model


def _exact(x, weight, bias):
    out = x.double() @ weight.double().t()
    return out if bias is None else out + bias.double()


@pytest.mark.parametrize("rows", [3, 4, 9])
@pytest.mark.parametrize("with_bias", [False, True])
def test_widened_linear_is_the_exact_product_rounded_once(rows, with_bias):
    torch.manual_seed(rows)
    # 70 output rows of 24: pieces of 5 rows (chunk 120 elements), the last one short
    weight = torch.randn(70, 24).bfloat16()
    bias = torch.randn(70).bfloat16() if with_bias else None
    x = torch.randn(2, rows, 24).bfloat16()
    out = cpu.widened_linear(x, weight, bias, from_rows=4, chunk=120)
    assert out.shape == (2, rows, 70) and out.dtype == torch.bfloat16
    # 2 x rows rows >= 4 in every case: computed in float32, so within one bfloat16 rounding
    # (2^-8 relative) of the exact result, plus float32's accumulation error
    exact = _exact(x, weight, bias)
    assert ((out.double() - exact).abs() <= exact.abs() * 2 ** -8 + 1e-4).all()


def test_widened_linear_leaves_few_rows_and_other_dtypes_to_torch():
    torch.manual_seed(0)
    weight = torch.randn(40, 16).bfloat16()
    x = torch.randn(3, 16).bfloat16()
    assert torch.equal(cpu.widened_linear(x, weight, from_rows=4), F.linear(x, weight))
    w32, x32 = weight.float(), torch.randn(8, 16)
    assert torch.equal(cpu.widened_linear(x32, w32, from_rows=1), F.linear(x32, w32))


@pytest.mark.parametrize("native, rows, offered", [(False, 4, True), (False, 0, False), (True, 4, False)])
def test_the_device_offers_it_only_without_native_bf16(monkeypatch, tmp_path, native, rows, offered):
    monkeypatch.setattr(cpu, "native_bf16", lambda: native)
    make_model(tmp_path, "llama", dtype=torch.bfloat16)
    llm = LLM(str(tmp_path), progress=False, plugin_options={"cpu": {"bf16_float32_rows": rows}})
    model = llm.engine.runner.model
    linears = [m for m in model.modules() if hasattr(m, "linear_op")]
    # the model itself (a tied LM head), an untied LM head, each layer's qkv, o, gate_up and down
    assert len(linears) == 1 + (model.lm_head is not None) + 4 * model.config.num_hidden_layers
    assert all((m.linear_op is not None) == offered for m in linears)


def test_bf16_prompt_logprobs_through_float32_linears_match_transformers(monkeypatch, tmp_path):
    monkeypatch.setattr(cpu, "native_bf16", lambda: False)
    calls = []
    widened = cpu.widened_linear
    monkeypatch.setattr(cpu, "widened_linear", lambda *a, **k: calls.append(a[0].shape) or widened(*a, **k))
    model = make_model(tmp_path, "llama", dtype=torch.bfloat16)
    llm = LLM(str(tmp_path), progress=False, plugin_options={"cpu": {"bf16_float32_rows": 1}})
    prompt = list(range(3, 40))
    out = llm.generate({"prompt_token_ids": prompt}, SamplingParams(max_tokens=4, prompt_logprobs=0),
                       use_tqdm=False)[0]
    assert calls  # the prompt's and the decode steps' linears went through it
    with torch.no_grad():
        ref = model.float()(torch.tensor([prompt])).logits[0].log_softmax(-1)
    errs = [abs(out.prompt_logprobs[i][prompt[i]] - ref[i - 1, prompt[i]].item()) for i in range(1, len(prompt))]
    assert max(errs) < 5e-2


def test_a_negative_row_threshold_is_refused(tmp_path):
    make_model(tmp_path, "llama", dtype=torch.bfloat16)
    with pytest.raises((ValueError, pydantic.ValidationError), match="bf16_float32_rows"):
        LLM(str(tmp_path), progress=False, plugin_options={"cpu": {"bf16_float32_rows": -1}})


def test_a_draft_model_gets_it_too(monkeypatch):
    monkeypatch.setattr(cpu, "native_bf16", lambda: False)
    llm = LLM(progress=False, plugins=["draft-model"])  # the demo pair, bfloat16
    draft = llm.engine.drafter.runner.model
    assert draft is not llm.engine.runner.model
    assert all(m.linear_op is not None for m in draft.modules() if hasattr(m, "linear_op"))
