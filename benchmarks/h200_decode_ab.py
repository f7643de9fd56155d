"""H200, session 3 (run K): decode attention with a CUDA graph's grid (sized for 8,192 tokens) with
and without the program cap, and the split size. (Run K's copy also timed a two-pass argmax
against torch.argmax; it was slower, 84.8 against 38.8 us for one row of 128,256, and was dropped
with its code.) Batch-1 rows here time the host launch too: see h200_decode_sweep.py. The random
caches now come from bench_kernels.paged (same sizes as in run K, other random values)."""
from functools import partial

import torch

import deepinfer_kernels as K
from deepinfer_kernels.bench_kernels import paged, time_ms

g = torch.Generator(device="cuda").manual_seed(0)
for b, h, kvh, d, lo, hi in ((256, 16, 8, 128, 100, 1500), (64, 16, 8, 128, 100, 1500), (1, 32, 8, 64, 530, 531)):
    lens = torch.randint(lo, hi, (b,), generator=g, device="cuda").tolist()
    k, v, tables = paged(lens, 16, kvh, d, seed=b)
    q = torch.randn(b, h, d, device="cuda", dtype=torch.bfloat16)
    seq = torch.tensor(lens, dtype=torch.int32, device="cuda")
    nbytes = sum(lens) * kvh * d * 4
    base = None
    for split in (256, 128, 64):
        for cap_name, cap in (("uncapped", 1 << 30), ("cap 1024", 1024), ("cap 4096", 4096)):
            for grid_len, name in ((8192, "graph grid 8192"), (max(lens), "exact grid")):
                fn = partial(K.paged_decode_attention, q, k, v, tables, seq, 16, d ** -0.5, None, grid_len, split, cap)
                out = fn()
                if base is None:
                    base = out
                same = "same bits" if split == 256 and torch.equal(out, base) else ("" if split != 256 else "DIFFERENT")
                t = time_ms(fn, 200)
                print(f"decode B={b} H={h}/{kvh} D={d} lens {lo}-{hi} split {split} {cap_name} {name}: "
                      f"{t * 1e3:.1f} us {nbytes / t / 1e9:.2f} TB/s {same}", flush=True)
