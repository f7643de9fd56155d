"""H200, session 3: decode attention tile sweep (keys per tile, warps, pipeline stages) at the
throughput workload's shape (Qwen3-0.6B: 16/8 heads, D=128, bf16), with a CUDA graph's grid (sized
for 8,192 tokens). Each variant is timed as a CUDA-graph replay of 20 calls, so host launch time
is not counted. The random caches now come from bench_kernels.paged (same sizes as in run M,
other random values)."""
import itertools
from functools import partial

import torch
from graph_timing import graph_time

import deepinfer_kernels as K
from deepinfer_kernels.bench_kernels import paged


def graph_us(fn, calls=20, reps=20):
    return graph_time(fn, reps=calls, trials=reps)


g = torch.Generator(device="cuda").manual_seed(0)
h, kvh, d = 16, 8, 128
for b, lo, hi in ((256, 300, 1500), (64, 500, 2000), (16, 800, 2000), (1, 530, 531)):
    lens = torch.randint(lo, hi, (b,), generator=g, device="cuda").tolist()
    k, v, tables = paged(lens, 16, kvh, d, seed=b)
    q = torch.randn(b, h, d, device="cuda", dtype=torch.bfloat16)
    seq = torch.tensor(lens, dtype=torch.int32, device="cuda")
    nbytes = sum(lens) * kvh * d * 4
    ref = K.paged_decode_attention(q, k, v, tables, seq, 16, d ** -0.5, None, 8192)
    rows = []
    for split, bn, warps, stages in itertools.product((256, 128), (32, 64, 128), (2, 4, 8), (1, 2, 3, 4)):
        if split % bn:
            continue
        fn = partial(K.paged_decode_attention, q, k, v, tables, seq, 16, d ** -0.5, None, 8192, split,
                     block_n=bn, num_warps=warps, num_stages=stages)
        try:
            out = fn()
            ok = (out.float() - ref.float()).abs().max().item() < 2e-2
            us = graph_us(fn)
        except Exception as exc:  # noqa: BLE001  (a variant that does not fit the shared memory)
            print(f"B={b} split {split} block_n {bn} warps {warps} stages {stages}: {type(exc).__name__}")
            continue
        rows.append((us, split, bn, warps, stages, ok))
    rows.sort()
    default = next(r for r in rows if r[1:5] == (256, 64, 4, 3))
    print(f"B={b} lens {lo}-{hi}: default (split 256, block_n 64, 4 warps, 3 stages) {default[0]:.1f} us "
          f"{nbytes / default[0] / 1e6:.2f} TB/s")
    for us, split, bn, warps, stages, ok in rows[:8]:
        print(f"  split {split} block_n {bn} warps {warps} stages {stages}: {us:.1f} us "
              f"{nbytes / us / 1e6:.2f} TB/s {'ok' if ok else 'WRONG'}", flush=True)
