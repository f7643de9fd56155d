"""(Ran at f0b4711, reverted after: slower at 640 and 1,024 keys.) H200: decode attention reading
its first split's keys and values before its PDL wait (the newest key and value again after it)
against reading them all after the wait. Batch 1, Llama-3.2-1B shape, bf16, 16 whole layers in one
CUDA graph (``llama_gemv_layers.layer_chain``) with the default tiles, the partials sized for 8,192
keys as a captured step's are; median of interleaved trials. Variants: keys after the wait (as
before), before it with 4 warps (the default), before it with 8 warps. Writes $OUT/preload.txt.

    python3 h200_preload.py [--ctx 640,1024,2048] [--trials 5]
"""
import argparse

import torch
from llama_gemv_layers import PassOne, compare_chains, layer_chain, layer_tiles, llama_layers, paged_context, per_length

ap = argparse.ArgumentParser()
ap.add_argument("--ctx", default="640,1024,2048")
ap.add_argument("--trials", type=int, default=5)
a = ap.parse_args()
dev, dt = torch.device("cuda"), torch.bfloat16
inputs, tiles = llama_layers(dev, dt), layer_tiles(dev)
VARIANTS = {"after the wait": PassOne(PRELOAD=False), "before, 4 warps": PassOne(),
            "before, 8 warps": PassOne(num_warps=8)}


def one_length(ctx: int, lines: list[str]) -> None:
    at = paged_context(ctx, dev, dt)

    def run(v, res, caches):
        return layer_chain(inputs, at, res, caches, tiles, 8192, VARIANTS[v], evict="evict_first")

    compare_chains(run, VARIANTS, inputs, at, a.trials, lines, f"ctx {ctx}")


per_length(one_length, a.ctx, "preload.txt")
