"""H200: decode attention's pipeline stages in steps of one token (one tile a split: the loop runs
once, so stages buy no overlap and cost shared memory), and the keys read before the PDL wait
(f0b4711's kernel file, which the call carried as benchmarks/paged_attention_preload_f0b4711.py:
`git show f0b4711:kernels/paged_attention.py`) with fewer stages. Batch 1, Llama-3.2-1B shape,
bf16, 16 whole layers in one CUDA graph (``llama_gemv_layers.layer_chain``), median of interleaved
trials. Writes $OUT/attn_stages.txt.

    python3 h200_attn_stages.py [--ctx 640,1024] [--trials 5]
"""
import argparse
import importlib.util

import torch
from llama_gemv_layers import PassOne, compare_chains, layer_chain, layer_tiles, llama_layers, paged_context, per_length

ap = argparse.ArgumentParser()
ap.add_argument("--ctx", default="640,1024")
ap.add_argument("--trials", type=int, default=5)
a = ap.parse_args()
spec = importlib.util.spec_from_file_location("preload", "paged_attention_preload_f0b4711.py")
pre = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pre)
dev, dt = torch.device("cuda"), torch.bfloat16
inputs, tiles = llama_layers(dev, dt), layer_tiles(dev)
PRE = pre._decode_split_kernel
VARIANTS = {"2 stages (default)": PassOne(), "1 stage": PassOne(num_stages=1), "3 stages": PassOne(num_stages=3),
            "keys early, 2 stages": PassOne(PRE, PRELOAD=True),
            "keys early, 1 stage": PassOne(PRE, PRELOAD=True, num_stages=1)}


def one_length(ctx: int, lines: list[str]) -> None:
    at = paged_context(ctx, dev, dt)

    def run(v, res, caches):
        return layer_chain(inputs, at, res, caches, tiles, 8192, VARIANTS[v], evict="evict_first")

    compare_chains(run, VARIANTS, inputs, at, a.trials, lines, f"ctx {ctx}")


per_length(one_length, a.ctx, "attn_stages.txt")
