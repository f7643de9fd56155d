"""H200: an upper bound for moving decode attention's merge out of its kernel. Batch 1, Llama-3.2-1B
shape, bf16, PDL, 16 whole layers in one CUDA graph (qkv writing the cache, attention, o, gate/up,
down), median of interleaved trials: attention as now (pass 1 merges its splits: a counter, then
the partials' reads) against pass 1 writing its partials only (no counter, no merge; o then reads
a stale output, so only the times mean anything), each with the o GEMV's tile of 4 rows a program
(the default when this ran) and with 16 rows (the default since). Writes $OUT/merge_bound.txt.

    python3 h200_merge_bound.py [--ctx 640,1024] [--trials 5]
"""
import argparse
import sys

import torch
from graph_timing import graph_time
from llama_gemv_layers import KV, D, H, layer_tiles, llama_layers, paged_context, per_length

import deepinfer_kernels as dk
from deepinfer_kernels.gemv import GemvConfig

ap = argparse.ArgumentParser()
ap.add_argument("--ctx", default="640,1024")
ap.add_argument("--trials", type=int, default=5)
a = ap.parse_args()
pa = sys.modules["deepinfer_kernels.paged_attention"]
REAL = pa._decode_split_kernel


class NoMerge:
    """pass 1 as launched by paged_decode_attention, with its merge turned off"""

    def __getitem__(self, grid):
        launch = REAL[grid]

        def run(*args, **kwargs):
            kwargs["MERGE"] = False
            return launch(*args, **kwargs)

        return run


dev, dt, PAGE = torch.device("cuda"), torch.bfloat16, 16
inputs = llama_layers(dev, dt)
layers, cos, sin, res0 = (inputs[k] for k in ("layers", "cos", "sin", "res0"))
CFG = layer_tiles(dev)
O4, O16 = GemvConfig(4, 2048, 1, 8), GemvConfig(16, 2048, 1, 8)  # o: the default before session 16, after
VARIANTS = {"merge in pass 1, o 4 rows": (True, O4), "no merge, o 4 rows": (False, O4),
            "merge in pass 1, o 16 rows": (True, O16), "no merge, o 16 rows": (False, O16)}


def one_length(ctx: int, lines: list[str]) -> None:
    tables, lens, pos, slot, caches = paged_context(ctx, dev, dt, PAGE)

    def layers_chain(v, res, cs):
        merge, ocfg = VARIANTS[v]
        pa._decode_split_kernel = REAL if merge else NoMerge()
        try:
            for ly, c in zip(layers, cs):
                qkv = dk.gemv_qkv_rotary(res, ly["qkv"], ly["n1"], 1e-5, cos, sin, pos, H, KV, config=CFG["qkv"],
                                         pdl=True, kv_cache=(c[0], c[1], slot))
                at = dk.paged_decode_attention(qkv[:, :H * D].view(1, H, D), c[0], c[1], tables, lens, PAGE,
                                               D ** -0.5, None, ctx, 128, pdl=True, merge_in_pass=True)
                dk.gemv(at.reshape(1, H * D), ly["o"], residual=res, config=ocfg, pdl=True)
                act = dk.gemv(res, ly["gu"], norm_weight=ly["n2"], eps=1e-5, silu_mul=True, config=CFG["gu"],
                              pdl=True)
                dk.gemv(act, ly["down"], residual=res, config=CFG["down"], pdl=True)
        finally:
            pa._decode_split_kernel = REAL
        return res

    chains = {v: [] for v in VARIANTS}
    state = {v: (res0.clone(), [(k.clone(), x.clone()) for k, x in caches]) for v in VARIANTS}
    for _ in range(a.trials):
        for v in VARIANTS:
            chains[v].append(graph_time(lambda v=v: layers_chain(v, *state[v])))
    for v in VARIANTS:
        c = sorted(chains[v])[a.trials // 2]
        lines.append(f"ctx {ctx}: {v:28s} 16 layers {c:7.1f} us  (trials {', '.join(f'{x:.1f}' for x in chains[v])})")
        print(lines[-1], flush=True)


per_length(one_length, a.ctx, "merge_bound.txt")
