"""H200: o_proj's registers against decode attention's. o's default tile (16 rows by 2,048, 8 warps)
takes 181 registers a thread, 46K of an SM's 64K, and attention's pass 1 (4 warps) 255, 32K: so an
o program cannot be resident beside an attention program, and o's programs on SMs where attention
still runs start (and read their weights) only after it ends. Variants: the default; 4 warps (255
registers and a 92-byte spill: 32K); 8 warps capped at 128 registers (maxnreg: 32K, spilling); 16
warps (105 registers). Batch 1, Llama-3.2-1B shape, bf16, 16 whole layers in one CUDA graph
(``llama_gemv_layers.layer_chain``), median of interleaved trials. Writes $OUT/o_regs.txt.

    python3 h200_o_regs.py [--ctx 640,1024] [--trials 5]
"""
import argparse
import sys

import torch
from llama_gemv_layers import compare_chains, layer_chain, layer_tiles, llama_layers, paged_context, per_length

from deepinfer_kernels.gemv import GemvConfig

ap = argparse.ArgumentParser()
ap.add_argument("--ctx", default="640,1024")
ap.add_argument("--trials", type=int, default=5)
a = ap.parse_args()
gm = sys.modules["deepinfer_kernels.gemv"]
REAL = gm._gemv_kernel


class Capped:
    """the GEMV kernel, launched with ``maxnreg`` where a program has 16 rows (o's tile)"""

    def __getitem__(self, grid):
        launch = REAL[grid]

        def run(*args, **kwargs):
            return launch(*args, **({**kwargs, "maxnreg": 128} if kwargs.get("BLOCK_N") == 16 else kwargs))

        return run


dev, dt = torch.device("cuda"), torch.bfloat16
inputs, tiles = llama_layers(dev, dt), layer_tiles(dev)
VARIANTS = {"o 8 warps (default)": (None, False), "o 4 warps": (GemvConfig(16, 2048, 1, 4), False),
            "o 8 warps, maxnreg 128": (None, True), "o 16 warps": (GemvConfig(16, 2048, 1, 16), False)}


def one_length(ctx: int, lines: list[str]) -> None:
    at = paged_context(ctx, dev, dt)

    def run(v, res, caches):
        o_tile, capped = VARIANTS[v]
        gm._gemv_kernel = Capped() if capped else REAL
        try:
            return layer_chain(inputs, at, res, caches, tiles, 8192, o_tile=o_tile, evict="evict_first")
        finally:
            gm._gemv_kernel = REAL

    compare_chains(run, VARIANTS, inputs, at, a.trials, lines, f"ctx {ctx}")


per_length(one_length, a.ctx, "o_regs.txt")
