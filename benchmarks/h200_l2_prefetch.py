"""(Ran at 4f7db5d, reverted after: slower.) H200: the single-token qkv GEMV's programs, once
done, ask the L2 for gate/up's first rows (both halves), which arrive while attention runs; gate/up
then reads them from the L2. Batch 1, Llama-3.2-1B shape, bf16, 16 whole layers in one CUDA graph
(``llama_gemv_layers.layer_chain``, every weight load evict_first), median of interleaved trials,
by MB prefetched a layer. Writes $OUT/l2_prefetch.txt.

    python3 h200_l2_prefetch.py [--ctx 640,1024] [--mb 0,8,12,16,24] [--trials 5]
"""
import argparse

import torch
from llama_gemv_layers import compare_chains, layer_chain, layer_tiles, llama_layers, paged_context, per_length

ap = argparse.ArgumentParser()
ap.add_argument("--ctx", default="640,1024")
ap.add_argument("--mb", default="0,8,12,16,24")
ap.add_argument("--trials", type=int, default=5)
a = ap.parse_args()
dev, dt = torch.device("cuda"), torch.bfloat16
inputs, tiles = llama_layers(dev, dt), layer_tiles(dev)
VARIANTS = {f"prefetch {mb} MB": float(mb) for mb in a.mb.split(",")}


def one_length(ctx: int, lines: list[str]) -> None:
    at = paged_context(ctx, dev, dt)

    def run(v, res, caches):
        return layer_chain(inputs, at, res, caches, tiles, 8192, evict="evict_first", prefetch_mb=VARIANTS[v])

    compare_chains(run, VARIANTS, inputs, at, a.trials, lines, f"ctx {ctx}")


per_length(one_length, a.ctx, "l2_prefetch.txt")
