"""FP8 block-scaled GEMM (DeepSeek-V3's format) and its quantizations: the quantizers against the
format's definition, the activation-quantization kernel against its reference bit for bit, and the
GEMM against float32 matmul of the dequantized operands.

The Triton interpreter multiplies float8 tiles exactly (their products are exact in float32), so
the GEMM kernel runs on the CPU with real float8 operands; only its conversion float32 -> float8
is wrong there, which the quantization kernel does in integer arithmetic under the interpreter
(the compiled conversion is tested on a GPU)."""
from __future__ import annotations

import pytest
import torch

from deepinfer_kernels import (
    block_quantize_fp8,
    dequantize_block_fp8,
    fp8_block_gemm,
    fp8_block_gemm_ref,
    per_token_group_quant_fp8,
    per_token_group_quant_fp8_ref,
)
from tests.kernels.paged import DTYPES, randn

FP8 = torch.float8_e4m3fn


def awkward(m, k, dtype, device, seed=1):
    """Random rows spanning many magnitudes, an all-zero group, values on float8 rounding edges."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.exp2(torch.randint(-12, 8, (m, 1), generator=g).float())
    x[0, :128] = 0.0
    x[-1, 128:136] = torch.tensor([448.0, -0.4997, 0.4997, 0.1239, 1.9507, -0.0, 1e-6, 3.0])  # 448: amax of group
    return x.to(dtype).to(device)


def check_format(x, q, scale, rows, cols):
    """The block format's definition, computed independently of the quantizers: each block's scale
    is its amax / 448 (1e-10 / 448 for an all-zero block), its amax becomes +-448 exactly, and every
    value is within float8's half step: 2^-4 relative, or 2^-10 of the scale below 2^-6 of it."""
    n, k = x.shape
    r, c = torch.arange(n) // rows, torch.arange(k) // cols
    xf = x.float().cpu()
    amax = torch.stack([torch.stack([xf[r == i][:, c == j].abs().max() for j in range(scale.shape[1])])
                        for i in range(scale.shape[0])])
    torch.testing.assert_close(scale.cpu(), amax.clamp(min=1e-10) / 448, atol=0, rtol=0)
    s = scale.cpu()[r][:, c]
    back = q.float().cpu() * s
    assert ((back - xf).abs() <= xf.abs() * 2 ** -4 + s * 2 ** -10).all()
    at_max = xf.abs() == amax[r][:, c]
    assert torch.equal(q.float().cpu().abs()[at_max & (xf != 0)], torch.full_like(xf[at_max & (xf != 0)], 448.0))


@pytest.mark.parametrize("dtype", DTYPES)
def test_group_quant_kernel_gives_the_bits_of_the_reference(dtype, device):
    x = awkward(5, 300, dtype, device)  # 3 groups, the last of 44 columns
    q, s = per_token_group_quant_fp8(x)
    q_ref, s_ref = per_token_group_quant_fp8_ref(x)
    assert q.dtype == FP8 and q.shape == (5, 300) and s.shape == (5, 3)
    assert torch.equal(s, s_ref)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))


def test_group_quant_reference_follows_the_format(device):
    x = awkward(5, 300, torch.float32, device)
    q, s = per_token_group_quant_fp8_ref(x)
    check_format(x, q, s, 1, 128)


def test_group_quant_writes_column_major_scales_on_request(device):
    x = awkward(6, 256, torch.float32, device)
    _, s = per_token_group_quant_fp8(x, column_major_scales=True)
    assert s.stride() == (1, 6)
    assert torch.equal(s, per_token_group_quant_fp8_ref(x)[1])


def test_block_quantize_follows_the_format(device):
    w = awkward(200, 300, torch.float32, device, seed=2)  # partial blocks in both dimensions
    q, s = block_quantize_fp8(w)
    assert q.dtype == FP8 and q.shape == (200, 300) and s.shape == (2, 3)
    check_format(w, q, s, 128, 128)


def test_dequantize_multiplies_each_entry_by_its_blocks_scale(device):
    g = torch.Generator().manual_seed(3)
    q = (torch.randn(200, 300, generator=g) * 50).to(FP8).to(device)
    s = torch.rand(2, 3, generator=g).to(device)
    out = dequantize_block_fp8(q, s)
    for i, j in [(0, 0), (127, 128), (128, 127), (199, 299), (130, 256)]:
        assert out[i, j] == q[i, j].float() * s[i // 128, j // 128]
    rows = dequantize_block_fp8(q, s[:1, :], block=(200, 128))  # one block of rows
    assert torch.equal(rows[150], q[150].float() * s[0, torch.arange(300, device=device) // 128])


def operands(m, n, k, device, seed=4):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(device)
    w = (torch.randn(n, k, generator=g) * k ** -0.5).to(device)
    return x, w, *per_token_group_quant_fp8_ref(x), *block_quantize_fp8(w)


def test_reference_gemm_is_close_to_the_unquantized_product(device):
    """The scales' sense (multiplied, not divided) and the block indexing: quantization error only."""
    x, w, xq, xs, wq, ws = operands(20, 200, 300, device)
    ref = fp8_block_gemm_ref(xq, xs, wq, ws, torch.float32)
    exact = x @ w.T
    assert (ref - exact).norm() / exact.norm() < 0.05


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float16])
# config: (BLOCK_M, BLOCK_N, warps, stages, split_k); K = 300 is 3 blocks, split 2 + 1, or one each
@pytest.mark.parametrize("m, config", [(1, None), (20, None), (20, (16, 64, 4, 2, 1)), (70, (64, 32, 4, 2, 1)),
                                       (3, (16, 64, 4, 2, 2)), (1, (16, 32, 4, 2, 5))])
def test_gemm_matches_reference(m, config, out_dtype, device):
    _, _, xq, xs, wq, ws = operands(m, 200, 300, device)  # N and K not multiples of the tiles
    out = fp8_block_gemm(xq, xs, wq, ws, out_dtype, config=config)
    ref = fp8_block_gemm_ref(xq, xs, wq, ws, out_dtype)
    assert out.dtype == out_dtype and out.shape == (m, 200)
    # the interpreter's fp8 products are exact; a GPU's fp8 tensor cores sum a block at reduced precision
    tol = 1e-5 if out_dtype == torch.float32 and device == "cpu" else 3e-3
    torch.testing.assert_close(out, ref, atol=tol, rtol=tol)


def test_gemm_takes_column_major_activation_scales(device):
    _, _, xq, xs, wq, ws = operands(6, 64, 256, device)
    cm = xs.t().contiguous().t()
    assert torch.equal(fp8_block_gemm(xq, cm, wq, ws, torch.float32), fp8_block_gemm(xq, xs, wq, ws, torch.float32))


@pytest.mark.parametrize("bad, match", [
    ("dtype", "must be float8_e4m3fn"),
    ("scale", r"must be \[4, 2\] and \[1, 2\]"),
    ("backend", "backend 'cublas'"),
])
def test_gemm_refuses_bad_inputs(bad, match, device):
    _, _, xq, xs, wq, ws = operands(4, 64, 256, device)
    args = {"dtype": (xq.float(), xs, wq, ws), "scale": (xq, xs[:, :1], wq, ws), "backend": (xq, xs, wq, ws)}[bad]
    with pytest.raises(ValueError, match=match):
        fp8_block_gemm(*args, torch.float32, backend="cublas" if bad == "backend" else "triton")


def test_block_quantize_refuses_a_vector(device):
    with pytest.raises(ValueError, match="expected"):
        block_quantize_fp8(torch.zeros(128, device=device))


# compiled, at DeepSeek-V2-Lite / V3 shapes, bf16 activations
@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["triton", "scaled_mm"])
@pytest.mark.parametrize("n, k", [(2048, 7168), (1408, 2048), (7168, 1408)])
@pytest.mark.parametrize("m", [1, 64, 4096])
def test_gemm_at_deepseek_shapes(m, n, k, backend, device):
    if device != "cuda":
        pytest.skip("needs a GPU")
    if backend == "scaled_mm" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("torch._scaled_mm's 1x128 / 128x128 recipe runs on compute capability 9.0 only")
    x = randn(m, k, dtype=torch.bfloat16, device=device)
    w = randn(n, k, dtype=torch.bfloat16, device=device, seed=2) * k ** -0.5
    xq, xs = per_token_group_quant_fp8(x, column_major_scales=backend == "scaled_mm")
    wq, ws = block_quantize_fp8(w)
    if backend == "scaled_mm" and k % 512:  # K = 1408: 11 blocks, a layout torch 2.11 cannot pass to cuBLASLt
        with pytest.raises(ValueError, match="multiple of 512"):
            fp8_block_gemm(xq, xs, wq, ws, torch.bfloat16, backend=backend)
        return
    out = fp8_block_gemm(xq, xs, wq, ws, torch.bfloat16, backend=backend)
    ref = fp8_block_gemm_ref(xq, xs, wq, ws, torch.float32)
    assert out.shape == (m, n) and out.dtype == torch.bfloat16
    assert ((out.float() - ref).norm() / ref.norm()).item() < 4e-3  # bf16 rounding of the output: ~1e-3


@pytest.mark.gpu
def test_group_quant_kernel_compiled_cast_gives_the_bits_of_torch(device):
    if device != "cuda":
        pytest.skip("needs a GPU")
    x = awkward(64, 7168, torch.bfloat16, device)
    q, s = per_token_group_quant_fp8(x)
    q_ref, s_ref = per_token_group_quant_fp8_ref(x)
    assert torch.equal(s, s_ref)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))
