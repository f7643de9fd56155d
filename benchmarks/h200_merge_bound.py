"""H200: an upper bound for moving decode attention's merge out of its kernel. Batch 1, Llama-3.2-1B
shape, bf16, PDL, 16 whole layers in one CUDA graph (qkv writing the cache, attention, o, gate/up,
down), median of interleaved trials: attention as now (pass 1 merges its splits: a counter, then
the partials' reads) against pass 1 writing its partials only (no counter, no merge; o then reads
a stale output, so only the times mean anything), each with the o GEMV's tile of 4 rows a program
(the default when this ran) and with 16 rows (the default since). Writes $OUT/merge_bound.txt.

    python3 h200_merge_bound.py [--ctx 640,1024] [--trials 5]
"""
import argparse

import torch
from llama_gemv_layers import PassOne, compare_chains, layer_chain, layer_tiles, llama_layers, paged_context, per_length

from deepinfer_kernels.gemv import GemvConfig

ap = argparse.ArgumentParser()
ap.add_argument("--ctx", default="640,1024")
ap.add_argument("--trials", type=int, default=5)
a = ap.parse_args()
dev, dt = torch.device("cuda"), torch.bfloat16
inputs, tiles = llama_layers(dev, dt), layer_tiles(dev)
O4, O16 = GemvConfig(4, 2048, 1, 8), GemvConfig(16, 2048, 1, 8)  # o: the default before session 16, after
VARIANTS = {"merge in pass 1, o 4 rows": (None, O4), "no merge, o 4 rows": (PassOne(MERGE=False), O4),
            "merge in pass 1, o 16 rows": (None, O16), "no merge, o 16 rows": (PassOne(MERGE=False), O16)}


def one_length(ctx: int, lines: list[str]) -> None:
    at = paged_context(ctx, dev, dt)

    def run(v, res, caches):  # (partials sized for this length, as when this ran)
        pass_one, o_tile = VARIANTS[v]
        return layer_chain(inputs, at, res, caches, tiles, ctx, pass_one, o_tile)

    compare_chains(run, VARIANTS, inputs, at, a.trials, lines, f"ctx {ctx}", check=False)


per_length(one_length, a.ctx, "merge_bound.txt")
