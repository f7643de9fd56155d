"""H200: prefill attention's tiles (block_m, block_n, warps, stages) on the shapes that matter: one
512-token prompt (the latency workload's first token) of Llama-3.2-1B (32 heads, 8 kv heads, 64 wide)
and Qwen3-0.6B (16 / 8 / 128), four 4,096-token prompts (the prefill workload) and a batch of 8
prompts of 100 to 1,024 tokens (the throughput workload's prefills). 16 launches in one CUDA graph,
bf16, median of interleaved trials; each tile's output against the default's. Writes
$OUT/prefill_tiles.txt.

    python3 h200_prefill_tiles.py [--trials 3]
"""
import argparse
import os

import torch
from graph_timing import graph_time

import deepinfer_kernels as dk

ap = argparse.ArgumentParser()
ap.add_argument("--trials", type=int, default=3)
a = ap.parse_args()
dev, dt, PAGE = torch.device("cuda"), torch.bfloat16, 16
TILES = [(64, 64, 4, 2), (64, 64, 4, 3), (64, 128, 4, 2), (64, 128, 8, 2), (128, 64, 8, 2), (128, 64, 4, 2),
         (128, 128, 8, 2), (128, 32, 4, 2), (32, 64, 4, 2), (128, 64, 8, 3), (64, 32, 4, 2), (32, 32, 4, 2)]
SHAPES = {"llama 1x512": (32, 8, 64, [512]), "qwen3 1x512": (16, 8, 128, [512]),
          "llama 4x4096": (32, 8, 64, [4096] * 4),
          "qwen3 8 mixed": (16, 8, 128, [100, 1024, 350, 777, 512, 220, 900, 640])}


def inputs(h, kv, d, lens):
    g = torch.Generator().manual_seed(0)
    pages = [-(-n // PAGE) for n in lens]
    ids = torch.randperm(sum(pages), generator=g)
    tables = torch.zeros(len(lens), max(pages), dtype=torch.int32)
    at = 0
    for i, p in enumerate(pages):
        tables[i, :p] = ids[at:at + p]
        at += p
    cache = [torch.randn(sum(pages) * PAGE, kv, d, generator=g).to(dev, dt) for _ in range(2)]
    q = torch.randn(sum(lens), h, d, generator=g).to(dev, dt)
    loc = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device=dev)
    n = torch.tensor(lens, dtype=torch.int32, device=dev)
    return (q, cache[0], cache[1], loc, n, n * 0, tables.to(dev), PAGE, d ** -0.5, None, max(lens))


lines = []
for name, (h, kv, d, lens) in SHAPES.items():
    args = inputs(h, kv, d, lens)
    flops = sum(4 * n * (n + 1) / 2 * d * h for n in lens)
    base = dk.paged_prefill_attention(*args)
    times, diffs = {t: [] for t in TILES}, {}
    for t in TILES:
        try:
            out = dk.paged_prefill_attention(*args, block_m=t[0], block_n=t[1], num_warps=t[2], num_stages=t[3])
            diffs[t] = (out.float() - base.float()).abs().max().item()
        except Exception as exc:  # noqa: BLE001  (a tile that does not fit: reported, not timed)
            diffs[t] = f"{type(exc).__name__}"
    for _ in range(a.trials):
        for t in TILES:
            if isinstance(diffs[t], float):
                times[t].append(graph_time(lambda t=t, args=args: dk.paged_prefill_attention(
                    *args, block_m=t[0], block_n=t[1], num_warps=t[2], num_stages=t[3]), reps=16))
    for t in TILES:
        if not times[t]:
            lines.append(f"{name:14s} {t}: {diffs[t]}")
            continue
        us = sorted(times[t])[a.trials // 2]
        lines.append(f"{name:14s} {t}: {us:8.1f} us a launch, {flops / us / 1e6:6.1f} TFLOP/s, "
                     f"max |diff| {diffs[t]:.3g}")
    print("\n".join(lines[-len(TILES):]), flush=True)
with open(os.path.join(os.environ.get("OUT", "."), "prefill_tiles.txt"), "w") as f:
    f.write("\n".join(lines) + "\n")
