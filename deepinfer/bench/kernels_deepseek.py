"""Check and time the DeepSeek-V2/V3 kernels (MLA decode, FP8 block GEMM) on a CUDA GPU.

    python -m deepinfer.bench.kernels_deepseek --out DIR [--quick]

Writes DIR/kernels_deepseek.md (the table of deepinfer.bench.kernels) and prints it; exits 1 if a
check fails. MLA decode: bytes read (latent cache rows + queries) per second against the card's
copy ceiling. FP8 GEMM: the Triton kernel against bf16 torch.matmul of the same shape (the speedup
column), and torch._scaled_mm's block-scaled path beside it, at DeepSeek-V2-Lite and V3 shapes.
"""
from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

import torch
import triton

import deepinfer_kernels as K
from deepinfer.bench import kernels as base
from deepinfer.bench.ceilings import card_ceiling

#: (model, layer, N, K) of the linear layers: V2-Lite (hidden 2048, 16 heads, expert width 1408)
#: and V3 (hidden 7168, 128 heads, expert width 2048)
GEMMS = [("V2-Lite", "expert gate_up", 2816, 2048), ("V2-Lite", "expert down", 2048, 1408),
         ("V2-Lite", "q_proj", 3072, 2048), ("V3", "expert gate_up", 4096, 7168), ("V3", "expert down", 7168, 2048),
         ("V3", "q_b_proj", 24576, 1536), ("V3", "o_proj", 7168, 16384)]
MLA = [(1, 512), (1, 4096), (64, 512), (64, 4096)]  # (batch, context)


def bench_mla_decode(table: base.Table, b: int, seq: int, heads: int, ms: int, d: int = 576, dv: int = 512,
                     block_size: int = 64) -> None:
    lens = [seq] * b
    kv, _, tables = base.paged(lens, block_size, 1, d)
    q = torch.randn(b, heads, d, device=base.DEV, dtype=base.BF16)
    args = (q, kv, tables, torch.tensor(lens, dtype=torch.int32, device=base.DEV), block_size, dv, 192 ** -0.5, seq)
    out = K.mla_decode_attention(*args)
    ref = K.mla_decode_attention_ref(*args)
    t = base.time_ms(lambda: K.mla_decode_attention(*args), ms) / 1e3
    t_ref = base.time_ms(lambda: K.mla_decode_attention_ref(*args), max(5, ms // 10)) / 1e3
    tbs = (sum(lens) * d * 2 + q.numel() * 2) / t / 1e12
    table.add("mla_decode_attention", f"B={b} len={seq} H={heads} D={d}/{dv} page={block_size}", out, ref,
              "attention", t, t_ref, f"{tbs:.2f} TB/s ({100 * tbs / base.CEILING_TBS:.0f}% of {base.CEILING_TBS:.2f})")


def bench_fp8_gemm(table: base.Table, m: int, n: int, k: int, label: str, ms: int) -> None:
    """Triton FP8 (activation quantization included) against bf16 torch.matmul; _scaled_mm beside."""
    x = torch.randn(m, k, device=base.DEV, dtype=base.BF16)
    w = torch.randn(n, k, device=base.DEV, dtype=base.BF16) * k ** -0.5
    wq, ws = K.block_quantize_fp8(w)

    def fp8(backend: str = "triton"):
        xq, xs = K.per_token_group_quant_fp8(x, column_major_scales=backend == "scaled_mm")
        return K.fp8_block_gemm(xq, xs, wq, ws, base.BF16, backend=backend)

    out = fp8()
    ref = K.fp8_block_gemm_ref(*K.per_token_group_quant_fp8_ref(x), wq, ws, torch.float32)
    t = base.time_ms(fp8, ms) / 1e3
    t_bf16 = base.time_ms(lambda: x @ w.T, ms) / 1e3
    try:
        scaled = fp8("scaled_mm")
        ok = (scaled.float() - ref).norm() / ref.norm() < 4e-3
        other = f"_scaled_mm {base.time_ms(lambda: fp8('scaled_mm'), ms) * 1e3:.1f} us" + ("" if ok else " WRONG")
        table.failed |= not ok
    except (RuntimeError, ValueError) as exc:  # not this card, or a torch without the recipe
        other = f"_scaled_mm: {str(exc).splitlines()[0][:60]}"
    table.add("fp8_block_gemm", f"{label} M={m} N={n} K={k}", out, ref, "elementwise", t, t_bf16,
              f"{2 * m * n * k / t / 1e12:.0f} TFLOP/s; {other}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="directory for kernels_deepseek.md")
    ap.add_argument("--quick", action="store_true", help="fewer shapes and repetitions")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available() or K.triton_interpreted():
        print("deepinfer.bench.kernels_deepseek needs a CUDA GPU and TRITON_INTERPRET unset", file=sys.stderr)
        return 2
    base.CEILING_TBS = card_ceiling(torch.device("cuda"))[1].bandwidth / 1e12
    ms = 30 if args.quick else 200
    table = base.Table()
    for heads in (128, 16):  # V3, V2-Lite
        for b, seq in MLA[1:3] if args.quick else MLA:
            bench_mla_decode(table, b, seq, heads, ms)
    for m in (1, 4096) if args.quick else (1, 64, 4096):
        for model, layer, n, k in GEMMS[2:5] if args.quick else GEMMS:
            bench_fp8_gemm(table, m, n, k, f"{model} {layer}", ms)
    props = torch.cuda.get_device_properties(0)
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    text = (f"# DeepSeek kernels on {props.name}\n\n`python -m deepinfer.bench.kernels_deepseek --out {args.out}"
            f"{' --quick' if args.quick else ''}`, {now}; torch {torch.__version__}, triton {triton.__version__}, "
            f"median of do_bench (L2 flushed). MLA: bytes read (latent rows + queries) / time, ceiling "
            f"{base.CEILING_TBS:.2f} TB/s (the card's copy). FP8 GEMM: 'torch ref us' is bf16 torch.matmul of the "
            f"same shape; the FP8 times include quantizing the activations.\n\n{table.markdown()}\n")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernels_deepseek.md").write_text(text)
    print(text)
    print("ALL CHECKS PASSED" if not table.failed else "SOME CHECKS FAILED")
    return 1 if table.failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
