"""Check the mixture-of-experts kernels against their torch references in bfloat16 on a CUDA GPU, and time both.

    python -m deepinfer.bench.moe_kernels --out DIR [--quick] [--tokens 1 64 4096]

At DeepSeek-V2-Lite's shape (hidden 2048, moe_intermediate 1408, 64 routed experts, top-6): the
fused MoE (``fused_moe``) against the torch loop over experts (``fused_moe_ref``), and the routing
(``grouped_topk``). Up to 64 tokens the table gives the share of the card's copy bandwidth (bytes:
the weights of the experts the tokens use, read once); at more, the share of its bf16 matmul rate
(6 * T * K * D * I FLOPs). Writes DIR/moe_kernels.md (written last) and prints it; the checks and the
table are those of ``deepinfer.bench.kernels``. Exits 1 if any check fails.
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
from deepinfer.bench.ceilings import Ceiling, card_ceiling

#: DeepSeek-V2-Lite's routed experts: hidden, moe_intermediate, experts, top-k
V2_LITE = (2048, 1408, 64, 6)
MEMORY_BOUND_TOKENS = 64  # up to this many tokens the table reports bandwidth, beyond it FLOPs
CEILING = Ceiling(3.03e12, 770e12)  # main() sets the card's own


def experts(e: int, d: int, inter: int, seed: int = 0):
    """Random bf16 w13 [e, 2I, d] and w2 [e, d, I] scaled to outputs of about 1."""
    g = torch.Generator(device=base.DEV).manual_seed(seed)
    w13 = torch.randn(e, 2 * inter, d, device=base.DEV, generator=g) * d ** -0.5
    w2 = torch.randn(e, d, inter, device=base.DEV, generator=g) * inter ** -0.5
    return w13.to(base.BF16), w2.to(base.BF16)


def bench_moe(table: base.Table, t: int, d: int, inter: int, e: int, k: int, ms: int, weights=None) -> None:
    """The fused MoE of ``t`` tokens routed by ``grouped_topk`` on random logits (renormalised)."""
    w13, w2 = weights if weights is not None else experts(e, d, inter)
    g = torch.Generator(device=base.DEV).manual_seed(t)
    x = torch.randn(t, d, device=base.DEV, generator=g).to(base.BF16)
    topk_weights, topk_ids = K.grouped_topk(torch.randn(t, e, device=base.DEV, generator=g), k, renormalize=True)

    def fused():
        return K.fused_moe(x, w13, w2, topk_weights, topk_ids, check_ids=False)

    def loop():
        return K.fused_moe_ref(x, w13, w2, topk_weights, topk_ids)

    out, ref = fused(), loop()
    secs = base.time_ms(fused, ms) / 1e3
    secs_ref = base.time_ms(loop, max(5, ms // 10)) / 1e3
    active = int(torch.unique(topk_ids).numel())
    if t <= MEMORY_BOUND_TOKENS:
        nbytes = active * 3 * inter * d * 2 + 2 * x.numel() * 2
        rate = nbytes / secs
        achieved = (f"{rate / 1e12:.2f} TB/s ({100 * rate / CEILING.bandwidth:.0f}% of "
                    f"{CEILING.bandwidth / 1e12:.2f}; {active} experts' weights)")
    else:
        rate = 6 * t * k * d * inter / secs
        achieved = f"{rate / 1e12:.0f} TFLOP/s ({100 * rate / CEILING.bf16_flops:.0f}% of {CEILING.bf16_flops / 1e12:.0f})"
    table.add("fused_moe", f"T={t} D={d} I={inter} E={e} K={k}", out, ref, "matmul", secs, secs_ref, achieved)


def bench_routing(table: base.Table, t: int, e: int, k: int, ms: int, **semantics) -> None:
    """``grouped_topk`` against its reference; the check is on the weights, the ids must be equal."""
    logits = torch.randn(t, e, device=base.DEV, generator=torch.Generator(device=base.DEV).manual_seed(e))
    bias = torch.rand(e, device=base.DEV) * 0.1 if semantics.get("scoring") == "sigmoid" else None
    out, ids = K.grouped_topk(logits, k, correction_bias=bias, **semantics)
    ref, ref_ids = K.grouped_topk_ref(logits, k, correction_bias=bias, **semantics)
    same = (ids == ref_ids).all(-1)
    secs = base.time_ms(lambda: K.grouped_topk(logits, k, correction_bias=bias, **semantics), ms) / 1e3
    secs_ref = base.time_ms(lambda: K.grouped_topk_ref(logits, k, correction_bias=bias, **semantics), ms) / 1e3
    shape = f"T={t} E={e} K={k} " + ",".join(f"{n}={v}" for n, v in semantics.items())
    if not bool(same.any()):
        table.note("grouped_topk", f"T={t} E={e} K={k}", False, "no row routed as the reference routes it")
        return
    # rows whose ids differ (a last-bit tie of two scores) are left out of the check; at most 0.1% may
    table.add("grouped_topk", shape, out[same], ref[same], "elementwise", secs, secs_ref,
              f"{int((~same).sum())} of {t} rows route otherwise")
    table.failed |= int((~same).sum()) > t // 1000


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="directory for moe_kernels.md")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 64, 4096], help="token counts of the fused MoE")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available() or K.triton_interpreted():
        print("deepinfer.bench.moe_kernels needs a CUDA GPU and TRITON_INTERPRET unset", file=sys.stderr)
        return 2
    global CEILING
    CEILING = card_ceiling(torch.device("cuda"))[1]
    ms = 30 if args.quick else 200
    table = base.Table()
    d, inter, e, k = V2_LITE
    weights = experts(e, d, inter)
    for t in args.tokens:
        bench_moe(table, t, d, inter, e, k, ms, weights)
    bench_routing(table, 4096, e, k, ms)  # V2-Lite: softmax, greedy
    bench_routing(table, 4096, 256, 8, ms, scoring="sigmoid", n_group=8, topk_group=4, renormalize=True,
                  routed_scaling_factor=2.5)  # V3
    props = torch.cuda.get_device_properties(0)
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    text = (f"# deepinfer_kernels' MoE kernels on {props.name}\n\n`python -m deepinfer.bench.moe_kernels --out "
            f"{args.out}{' --quick' if args.quick else ''}`, {now}; torch {torch.__version__}, triton "
            f"{triton.__version__}, bf16, median of do_bench (L2 flushed). Ceilings: {CEILING.bandwidth / 1e12:.2f} "
            f"TB/s copy, {CEILING.bf16_flops / 1e12:.0f} TFLOP/s bf16 ({CEILING.source}).\n\n{table.markdown()}\n")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "moe_kernels.md").write_text(text)
    print(text)
    print("ALL CHECKS PASSED" if not table.failed else "SOME CHECKS FAILED")
    return 1 if table.failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
