"""Check every kernel against its torch reference in bfloat16 on a CUDA GPU, and time both.

    python -m deepinfer.bench.kernels --out DIR [--quick]

Writes DIR/kernels.md (a markdown table, written last) and prints it. For decode attention the
table gives the achieved bandwidth (KV, q and output bytes / time) against the card's copy ceiling
(deepinfer.bench.ceilings: recorded, or measured on the card); for prefill, attention TFLOP/s. Exits 1 if any check fails.
"""
from __future__ import annotations

import argparse
import datetime
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import triton

import deepinfer_kernels as K
from deepinfer.bench.ceilings import card_ceiling

CEILING_TBS = 4.23  # TB/s; main() sets the card's own
DEV = "cuda"  # a dry run of the script's own code may point this at the CPU interpreter
BF16 = torch.bfloat16
TOL = {"attention": 2e-2, "elementwise": 1e-2, "matmul": 2e-2}


def time_ms(fn: Callable[[], object], ms: int) -> float:
    """Median milliseconds of ``fn`` over about ``ms`` of runs, the L2 cache flushed before each."""
    return float(triton.testing.do_bench(fn, warmup=max(5, ms // 4), rep=ms, return_mode="median"))


def paged(lens: list[int], bs: int, kvh: int, d: int, seed: int = 0):
    """Random bf16 caches [slots, kvh, d] and shuffled block tables for sequences of ``lens``."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    per = [-(-n // bs) for n in lens]
    total = sum(per) + 1
    ids = torch.randperm(total, generator=g, device=DEV).to(torch.int32)
    tables = torch.zeros(len(lens), max(per), dtype=torch.int32, device=DEV)
    at = 0
    for i, n in enumerate(per):
        tables[i, :n] = ids[at:at + n]
        at += n
    k = torch.randn(total * bs, kvh, d, device=DEV, dtype=BF16, generator=g)
    v = torch.randn(total * bs, kvh, d, device=DEV, dtype=BF16, generator=g)
    return k, v, tables


class Table:
    """Rows of the report; ``failed`` is set by any check outside its tolerance."""

    def __init__(self) -> None:
        self.rows: list[list[str]] = []
        self.failed = False

    def add(self, kernel: str, shape: str, out, ref, kind: str, t_kernel: float, t_ref: float, achieved: str) -> None:
        err = (out.float() - ref.float()).abs().max().item()
        scale = ref.float().abs().max().item() or 1.0
        ok = err <= TOL[kind] * max(1.0, scale)
        self.failed |= not ok
        self.rows.append([kernel, shape, f"{err:.2e}", "ok" if ok else "FAIL", f"{t_kernel * 1e6:.1f}",
                          f"{t_ref * 1e6:.1f}", f"{t_ref / t_kernel:.1f}x", achieved])
        print(" | ".join(self.rows[-1]), flush=True)

    def note(self, kernel: str, shape: str, ok: bool, what: str) -> None:
        self.failed |= not ok
        self.rows.append([kernel, shape, "-", "ok" if ok else "FAIL", "-", "-", "-", what])
        print(" | ".join(self.rows[-1]), flush=True)

    def markdown(self) -> str:
        head = ["kernel", "shape", "max abs err", "check", "triton us", "torch ref us", "speedup", "achieved"]
        lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in self.rows])


def bench_decode(table: Table, b: int, seq: int, h: int, kvh: int, d: int, window: int | None, ms: int) -> None:
    bs = 16
    lens = [seq] * b
    k, v, tables = paged(lens, bs, kvh, d)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEV)
    q = torch.randn(b, h, d, device=DEV, dtype=BF16)
    args = (q, k, v, tables, seq_lens, bs, d ** -0.5, window, seq)
    out = K.paged_decode_attention(*args)
    ref = K.paged_decode_attention_ref(*args)
    t = time_ms(lambda: K.paged_decode_attention(*args), ms) / 1e3
    t_ref = time_ms(lambda: K.paged_decode_attention_ref(*args), max(5, ms // 10)) / 1e3
    kv_tokens = sum(min(n, window or n) for n in lens)
    nbytes = kv_tokens * kvh * d * 2 * 2 + 2 * q.numel() * 2
    tbs = nbytes / t / 1e12
    shape = f"B={b} len={seq} H={h}/{kvh} D={d}" + (f" W={window}" if window else "")
    table.add("paged_decode_attention", shape, out, ref, "attention", t, t_ref,
              f"{tbs:.2f} TB/s ({100 * tbs / CEILING_TBS:.0f}% of {CEILING_TBS})")


def check_decode_invariance(table: Table) -> None:
    lens = [3000, 17, 900, 4500, 1]
    k, v, tables = paged(lens, 16, 8, 128)
    q = torch.randn(len(lens), 32, 128, device=DEV, dtype=BF16)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEV)
    together = K.paged_decode_attention(q, k, v, tables, seq_lens, 16, 0.088)
    same = all(torch.equal(together[i], K.paged_decode_attention(q[i:i + 1], k, v, tables[i:i + 1],
                                                                 seq_lens[i:i + 1], 16, 0.088)[0])
               for i in range(len(lens)))
    table.note("paged_decode_attention", "lens 3000,17,900,4500,1", same, "batch-invariant (bit-exact alone vs batch)")


def bench_prefill(table: Table, n_seq: int, new: int, cached: int, h: int, kvh: int, d: int,
                  window: int | None, ms: int) -> None:
    bs = 16
    lens = [cached + new] * n_seq
    k, v, tables = paged(lens, bs, kvh, d)
    qsl = torch.arange(0, n_seq + 1, dtype=torch.int32, device=DEV) * new
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEV)
    ctx = torch.full((n_seq,), cached, dtype=torch.int32, device=DEV)
    q = torch.randn(n_seq * new, h, d, device=DEV, dtype=BF16)
    args = (q, k, v, qsl, seq_lens, ctx, tables, bs, d ** -0.5, window, new)
    out = K.paged_prefill_attention(*args)
    ref = K.paged_prefill_attention_ref(*args)
    t = time_ms(lambda: K.paged_prefill_attention(*args), ms) / 1e3
    t_ref = time_ms(lambda: K.paged_prefill_attention_ref(*args), max(3, ms // 10)) / 1e3
    pairs = sum(min(cached + i + 1, window or cached + i + 1) for i in range(new)) * n_seq
    tflops = 4 * pairs * h * d / t / 1e12
    shape = f"{n_seq}x{new} new after {cached} cached H={h}/{kvh} D={d}" + (f" W={window}" if window else "")
    table.add("paged_prefill_attention", shape, out, ref, "attention", t, t_ref, f"{tflops:.0f} TFLOP/s")


def _row(table: Table, name: str, shape: str, fn, ref_fn, nbytes: int, ms: int) -> None:
    """One elementwise kernel: check against the reference, time both, report bandwidth."""
    out, ref = fn(), ref_fn()
    t, t_ref = time_ms(fn, ms) / 1e3, time_ms(ref_fn, ms) / 1e3
    table.add(name, shape, out, ref, "elementwise", t, t_ref, f"{nbytes / t / 1e12:.2f} TB/s")


def bench_elementwise(table: Table, t_tok: int, ms: int) -> None:
    hidden, inter, h, kvh, d = 2048, 8192, 32, 8, 64
    x = torch.randn(t_tok, hidden, device=DEV, dtype=BF16)
    res = torch.randn_like(x)
    w = torch.randn(hidden, device=DEV, dtype=BF16)
    n = x.numel() * 2
    _row(table, "rms_norm", f"T={t_tok} N={hidden}", lambda: K.rms_norm(x, w, 1e-6),
         lambda: K.rms_norm_ref(x, w, 1e-6), 2 * n, ms)
    _row(table, "rms_norm +residual", f"T={t_tok} N={hidden}", lambda: torch.cat(K.rms_norm(x, w, 1e-6, res)),
         lambda: torch.cat(K.rms_norm_ref(x, w, 1e-6, res)), 4 * n, ms)
    qkv = torch.randn(t_tok, (h + 2 * kvh) * d, device=DEV, dtype=BF16)
    q, k, _ = qkv.split([h * d, kvh * d, kvh * d], dim=-1)
    q, k = q.view(t_tok, h, d), k.view(t_tok, kvh, d)
    inv = 1.0 / 500000 ** (torch.arange(0, d, 2, device=DEV).float() / d)
    emb = torch.outer(torch.arange(8192, device=DEV).float(), inv).repeat(1, 2)
    cos, sin = emb.cos().to(BF16), emb.sin().to(BF16)
    pos = torch.randint(0, 8192, (t_tok,), device=DEV)
    _row(table, "apply_rotary", f"T={t_tok} H={h}/{kvh} D={d}",
         lambda: torch.cat([o.flatten(1) for o in K.apply_rotary(q, k, cos, sin, pos)], 1),
         lambda: torch.cat([o.flatten(1) for o in K.apply_rotary_ref(q, k, cos, sin, pos)], 1),
         2 * t_tok * (h + kvh) * d * 2, ms)
    gu = torch.randn(t_tok, 2 * inter, device=DEV, dtype=BF16)
    _row(table, "silu_and_mul", f"T={t_tok} I={inter}", lambda: K.silu_and_mul(gu), lambda: K.silu_and_mul_ref(gu),
         3 * t_tok * inter * 2, ms)
    kv = torch.randn(2, t_tok, kvh, 128, device=DEV, dtype=BF16)
    slots = torch.randperm(4 * t_tok, device=DEV)[:t_tok]
    slots[::7] = -1
    cache, ref_cache = (torch.zeros(2, 4 * t_tok, kvh, 128, device=DEV, dtype=BF16) for _ in range(2))

    def write():
        K.write_kv_cache(kv[0], kv[1], cache[0], cache[1], slots)
        return cache

    def write_ref():
        K.write_kv_cache_ref(kv[0], kv[1], ref_cache[0], ref_cache[1], slots)
        return ref_cache

    _row(table, "write_kv_cache", f"T={t_tok} kvh={kvh} D=128, 1/7 skipped", write, write_ref,
         2 * kv.numel() * 2, ms)


def bench_single_token(table: Table, hidden: int, inter: int, h: int, kvh: int, d: int, vocab: int, ms: int) -> None:
    """The single-token GEMVs (batch-1 decode's projections) and the argmax, against their
    references. do_bench flushes the L2 between runs, so every weight is read from memory."""
    def w(rows, cols):
        return torch.randn(rows, cols, device=DEV, dtype=BF16) * cols ** -0.5

    x = torch.randn(1, hidden, device=DEV, dtype=BF16)
    nw = torch.rand(hidden, device=DEV, dtype=BF16) + 0.5
    w_qkv, w_o, w_gu, w_down = w((h + 2 * kvh) * d, hidden), w(hidden, h * d), w(2 * inter, hidden), w(hidden, inter)
    inv = 1.0 / 500000 ** (torch.arange(0, d, 2, device=DEV).float() / d)
    emb = torch.outer(torch.arange(64, device=DEV).float(), inv).repeat(1, 2)
    cos, sin = emb.cos().to(BF16), emb.sin().to(BF16)
    pos = torch.tensor([37], device=DEV)
    qkv_args = (x, w_qkv, nw, 1e-5, cos, sin, pos, h, kvh)
    _row(table, "gemv_qkv_rotary", f"[{(h + 2 * kvh) * d}, {hidden}] H={h}/{kvh} D={d}",
         lambda: K.gemv_qkv_rotary(*qkv_args), lambda: K.gemv_qkv_rotary_ref(*qkv_args), w_qkv.numel() * 2, ms)
    res = torch.randn(1, hidden, device=DEV, dtype=BF16)
    a = torch.randn(1, h * d, device=DEV, dtype=BF16)
    # the residual is added in place: each call starts from a fresh copy of it
    _row(table, "gemv +residual", f"[{hidden}, {h * d}]", lambda: K.gemv(a, w_o, residual=res.clone()),
         lambda: K.gemv_ref(a, w_o, residual=res.clone()), w_o.numel() * 2, ms)
    _row(table, "gemv norm+silu_mul", f"[{2 * inter}, {hidden}]",
         lambda: K.gemv(x, w_gu, norm_weight=nw, eps=1e-5, silu_mul=True),
         lambda: K.gemv_ref(x, w_gu, norm_weight=nw, eps=1e-5, silu_mul=True), w_gu.numel() * 2, ms)
    act = torch.randn(1, inter, device=DEV, dtype=BF16)
    _row(table, "gemv +residual", f"[{hidden}, {inter}]", lambda: K.gemv(act, w_down, residual=res.clone()),
         lambda: K.gemv_ref(act, w_down, residual=res.clone()), w_down.numel() * 2, ms)
    logits = torch.randn(4, vocab, device=DEV, dtype=BF16)
    _row(table, "argmax", f"[4, {vocab}]", lambda: K.argmax(logits), lambda: K.argmax_ref(logits),
         logits.numel() * 2, ms)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="directory for kernels.md")
    ap.add_argument("--quick", action="store_true", help="fewer shapes and repetitions")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available() or K.triton_interpreted():
        print("deepinfer.bench.kernels needs a CUDA GPU and TRITON_INTERPRET unset", file=sys.stderr)
        return 2
    global CEILING_TBS
    CEILING_TBS = card_ceiling(torch.device("cuda"))[1].bandwidth / 1e12
    ms = 30 if args.quick else 200  # milliseconds of runs per timing
    table = Table()
    decode = [(1, 4096, None), (64, 1024, None), (64, 4096, None), (256, 512, None), (64, 4096, 1024)]
    for b, seq, window in decode[1:3] if args.quick else decode:
        bench_decode(table, b, seq, 32, 8, 128, window, ms)
    bench_decode(table, 64, 2048, 16, 8, 128, None, ms)  # Qwen3-0.6B heads
    check_decode_invariance(table)
    prefill = [(4, 4096, 0, None), (4, 512, 3584, None), (4, 4096, 0, 1024)]
    for n, new, cached, window in prefill[:2] if args.quick else prefill:
        bench_prefill(table, n, new, cached, 32, 8, 128, window, ms)
    bench_elementwise(table, 8192, ms)
    bench_single_token(table, 2048, 8192, 32, 8, 64, 128256, ms)  # Llama-3.2-1B
    props = torch.cuda.get_device_properties(0)
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    text = (f"# deepinfer_kernels on {props.name}\n\n`python -m deepinfer.bench.kernels --out {args.out}"
            f"{' --quick' if args.quick else ''}`, {now}; torch {torch.__version__}, triton {triton.__version__}, "
            f"bf16, median of do_bench (L2 flushed). Decode ceiling: {CEILING_TBS:.2f} TB/s (the card's copy).\n\n"
            f"{table.markdown()}\n")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernels.md").write_text(text)
    print(text)
    print("ALL CHECKS PASSED" if not table.failed else "SOME CHECKS FAILED")
    return 1 if table.failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
