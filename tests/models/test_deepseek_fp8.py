"""DeepSeek's block-scaled FP8 checkpoints, dequantized at load. Oracle: transformers running the
same model with each quantized weight replaced by its dequantized float32 value."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from deepinfer import LLM, SamplingParams
from deepinfer.core.model_config import ModelConfigError
from tests.tiny_models import hf_greedy, make_model

BLOCK = (16, 32)  # rows, columns: the tiny model's 40-row and 48-column weights end in partial blocks
E4M3_MAX = 448.0


def _quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(float8 weight, float32 scales [ceil(N/16), ceil(K/32)]): each block scaled to e4m3's range."""
    n, k = w.shape
    rows, cols = -(-n // BLOCK[0]), -(-k // BLOCK[1])
    padded = torch.zeros(rows * BLOCK[0], cols * BLOCK[1])
    padded[:n, :k] = w
    blocks = padded.view(rows, BLOCK[0], cols, BLOCK[1])
    scale = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12) / E4M3_MAX
    q = (blocks / scale[:, None, :, None]).view_as(padded)[:n, :k].to(torch.float8_e4m3fn)
    return q, scale


def _quantized(name: str, t: torch.Tensor) -> bool:  # as DeepSeek's checkpoints: the layers' projections
    return name.startswith("model.layers.") and t.dim() == 2 and not name.endswith("mlp.gate.weight")


def _fp8_checkpoint(src: Path, fp8: Path, oracle: Path) -> None:
    """``fp8``: src with its projections in FP8; ``oracle``: src with them dequantized (float32)."""
    tensors = load_file(src / "model.safetensors")
    quant, plain = {}, {}
    for name, t in tensors.items():
        if _quantized(name, t):
            q, scale = _quantize(t)
            quant[name], quant[name + "_scale_inv"] = q, scale
            plain[name] = q.float() * scale.repeat_interleave(BLOCK[0], 0)[:t.shape[0]].repeat_interleave(
                BLOCK[1], 1)[:, :t.shape[1]]
        else:
            quant[name] = plain[name] = t
    config = json.loads((src / "config.json").read_text())
    for out, state, extra in ((fp8, quant, {"quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
                                                                     "activation_scheme": "dynamic",
                                                                     "weight_block_size": list(BLOCK)}}),
                              (oracle, plain, {})):
        out.mkdir()
        save_file(state, out / "model.safetensors", metadata={"format": "pt"})
        (out / "config.json").write_text(json.dumps({**config, **extra}))


def test_fp8_checkpoint_gives_transformers_tokens_of_its_dequantized_weights(tmp_path):
    import transformers as tf

    original = make_model(tmp_path / "src", "deepseek_v3", with_tokenizer=False, n_group=4, topk_group=2)
    _fp8_checkpoint(tmp_path / "src", tmp_path / "fp8", tmp_path / "oracle")
    oracle = tf.AutoModelForCausalLM.from_pretrained(tmp_path / "oracle", dtype=torch.float32).eval()
    prompts = [[5, 6, 7], list(range(10, 50))]
    with torch.no_grad():  # guard: quantization changed the model
        ids = torch.tensor([prompts[1]])
        assert not torch.allclose(original(ids).logits, oracle(ids).logits, atol=1e-3)
    llm = LLM(str(tmp_path / "fp8"), dtype="float32", block_size=8, progress=False)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0, max_tokens=16, ignore_eos=True), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [hf_greedy(oracle, p, 16) for p in prompts]


@pytest.mark.parametrize("quant", [{"quant_method": "awq"}, {"quant_method": "fp8", "fmt": "e5m2",
                                                               "weight_block_size": [128, 128]},
                                   {"quant_method": "fp8", "fmt": "e4m3"}])
def test_other_quantizations_are_refused_with_what_is_supported(tmp_path, quant):
    make_model(tmp_path, "deepseek_v2", with_tokenizer=False)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "quantization_config": quant}))
    with pytest.raises(ModelConfigError, match="quantization_config .* supported: quant_method fp8, fmt e4m3"):
        LLM(str(tmp_path), dtype="float32", progress=False)


def test_fp8_weights_pair_with_their_scales_in_either_order_and_unpaired_ones_are_refused():
    from deepinfer.core.loader import WeightsError
    from deepinfer.models.fp8 import dequantized

    w = torch.randn(40, 48)
    q, scale = _quantize(w)
    want = q.float() * scale.repeat_interleave(16, 0)[:40].repeat_interleave(32, 1)[:, :48]
    norm = torch.ones(48)
    for stream in ([("a.weight", q), ("a.weight_scale_inv", scale), ("n.weight", norm)],
                   [("a.weight_scale_inv", scale), ("n.weight", norm), ("a.weight", q)]):
        got = dict(dequantized(stream, BLOCK))
        assert got.keys() == {"a.weight", "n.weight"} and torch.equal(got["n.weight"], norm)
        torch.testing.assert_close(got["a.weight"], want, rtol=0, atol=0)
        assert (got["a.weight"] - w).abs().max() < 0.07 * w.abs().max()  # (e4m3 keeps 3 mantissa bits)
    with pytest.raises(WeightsError, match=r"lack their weight or _scale_inv partner: \['b.weight'\]"):
        list(dequantized([("b.weight", q)], BLOCK))
    with pytest.raises(WeightsError, match=r"needs scales of shape \(3, 2\)"):
        list(dequantized([("a.weight", q), ("a.weight_scale_inv", scale[:2])], BLOCK))


# ------------------------------------------------------------------------- quantization: fp8
def _hf_fp8_twin(model):
    """transformers' model with each weight that ``quantization: fp8`` quantizes replaced by its
    128x128-block FP8 values: every decoder projection but kv_b_proj (the absorbed attention reads
    it per head) and the routed experts (the fused MoE kernel's dtype)."""
    from deepinfer_kernels.fp8_gemm import block_quantize_fp8, dequantize_block_fp8

    def fp8(t):
        return dequantize_block_fp8(*block_quantize_fp8(t), t.dtype)

    state, twin = model.state_dict(), {}
    for name, t in state.items():
        if (name.startswith("model.layers.") and t.dim() == 2 and "kv_b_proj" not in name
                and ".experts." not in name and not name.endswith("mlp.gate.weight")):
            if name.endswith("up_proj.weight"):
                continue  # (with its gate: the model keeps [gate | up] as one weight, quantized whole)
            if name.endswith("gate_proj.weight"):
                up = name.replace("gate_proj", "up_proj")
                twin[name], twin[up] = fp8(torch.cat([t, state[up]])).split(t.shape[0])
            else:
                twin[name] = fp8(t)
    model.load_state_dict(twin, strict=False)
    return model


def _fp8_ops_on_cpu(calls):
    """The device's fp8_block_linear as torch ops (dequantize, matmul), counting its calls."""
    from deepinfer_kernels.fp8_gemm import dequantize_block_fp8

    def fp8_block_linear(x, weight, scale_inv):
        calls.append(weight.dtype)
        return torch.nn.functional.linear(x, dequantize_block_fp8(weight, scale_inv, x.dtype))
    return fp8_block_linear


@pytest.mark.parametrize("with_op", [False, True])
def test_quantization_fp8_gives_transformers_tokens_of_the_fp8_weights(tmp_path, monkeypatch, with_op):
    """Without the device's FP8 GEMM (the CPU) the weights keep FP8's values in float32; with one
    (here torch ops standing in for it) they stay float8 and go through it: the same tokens."""
    from deepinfer import builder

    original = make_model(tmp_path, "deepseek_v3", with_tokenizer=False, n_group=4, topk_group=2)
    prompts = [[5, 6, 7], list(range(10, 50))]
    ids = torch.tensor([prompts[1]])
    with torch.no_grad():
        plain = original(ids).logits
        twin = _hf_fp8_twin(original)
        assert not torch.allclose(plain, twin(ids).logits, atol=1e-4)  # guard: the quantization matters
    expected = [hf_greedy(twin, p, 16) for p in prompts]
    calls = []
    if with_op:
        use_fp8 = builder.use_fp8
        monkeypatch.setattr(builder, "use_fp8", lambda model, q, op: use_fp8(model, q, _fp8_ops_on_cpu(calls)))
    llm = LLM(str(tmp_path), dtype="float32", block_size=8, quantization="fp8", device="cpu", progress=False)
    model = llm.engine.runner.model
    kinds = {lin.weight.dtype for lin in model.fp8_linears()}
    assert kinds == ({torch.float8_e4m3fn} if with_op else {torch.float32})
    assert model.model.layers[0].self_attn.kv_b_proj.weight.dtype == torch.float32
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0, max_tokens=16, ignore_eos=True), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == expected
    assert bool(calls) == with_op


def test_quantization_fp8_is_refused_for_a_model_without_fp8_layers(tmp_path):
    make_model(tmp_path, "llama", with_tokenizer=False)
    with pytest.raises(ValueError, match="quantization fp8 is not supported for LlamaForCausalLM"):
        LLM(str(tmp_path), dtype="float32", quantization="fp8", device="cpu", progress=False)


def test_fp8_values_without_a_gemm_stay_in_the_weights_storage():
    """Without the device's FP8 GEMM the weight takes FP8's values where it is: device graphs
    captured before read that storage (a new tensor left them reading freed memory)."""
    from deepinfer.models.layers import Linear
    from deepinfer_kernels.fp8_gemm import block_quantize_fp8, dequantize_block_fp8

    lin = Linear(200, 130, bias=False)
    torch.nn.init.normal_(lin.weight)
    want = dequantize_block_fp8(*block_quantize_fp8(lin.weight.data), lin.weight.dtype)
    ptr = lin.weight.data_ptr()
    lin.quantize_fp8(None)
    assert lin.weight.data_ptr() == ptr
    assert torch.equal(lin.weight.data, want) and not torch.equal(want, torch.zeros_like(want))


@pytest.mark.gpu
def test_fp8_gemm_on_a_gpu_keeps_the_bf16_twins_logprobs(tmp_path):
    """On an NVIDIA GPU: the FP8 GEMM path (weights in 128x128 blocks, activations per token in
    groups of 128) against the same model in bfloat16 with the weights' FP8 values; the prompt
    logprobs of the reference's own tokens agree within 0.1 (FP8's activation rounding, bf16 sums)."""
    make_model(tmp_path, "deepseek_v3", with_tokenizer=False, n_group=4, topk_group=2)
    prompt = list(range(10, 90))
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0)
    got = {}
    for q in ("fp8", None):
        llm = LLM(str(tmp_path), device="sm90", dtype="bfloat16", quantization=q, num_kv_blocks=64,
                  max_model_len=128, progress=False)
        if q is None:
            for lin in llm.engine.runner.model.fp8_linears():
                lin.quantize_fp8(None)  # the twin: FP8's weight values, bf16 GEMMs
        else:
            assert {lin.weight.dtype for lin in llm.engine.runner.model.fp8_linears()} == {torch.float8_e4m3fn}
        out = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0]
        got[q] = [lp[tok] for lp, tok in zip(out.prompt_logprobs[1:], prompt[1:], strict=True)]
        del llm
    diff = max(abs(a - b) for a, b in zip(got["fp8"], got[None], strict=True))
    assert diff < 0.1, diff
