"""(Ran at f0b4711, reverted after: slower at 640 and 1,024 keys.) H200: decode attention reading its first split's keys and values before its PDL wait (the
newest key and value again after it) against reading them all after the wait. Batch 1,
Llama-3.2-1B shape, bf16, PDL, 16 whole layers in one CUDA graph (qkv writing the cache,
attention merging in pass 1, o, gate/up, down) with the default tiles, the partials sized for
8,192 keys as a captured step's are; median of interleaved trials. Variants: keys after the wait
(as before), before it with 4 warps (the default), before it with 8 warps. Writes
$OUT/preload.txt.

    python3 h200_preload.py [--ctx 640,1024,2048] [--trials 5]
"""
import argparse
import sys

import torch
from graph_timing import graph_time
from llama_gemv_layers import KV, D, H, layer_tiles, llama_layers, paged_context, per_length

import deepinfer_kernels as dk

ap = argparse.ArgumentParser()
ap.add_argument("--ctx", default="640,1024,2048")
ap.add_argument("--trials", type=int, default=5)
a = ap.parse_args()
pa = sys.modules["deepinfer_kernels.paged_attention"]
REAL = pa._decode_split_kernel


class Launch:
    """pass 1 as paged_decode_attention launches it, with some of its launch arguments replaced"""

    def __init__(self, **changes) -> None:
        self.changes = changes

    def __getitem__(self, grid):
        launch = REAL[grid]

        def run(*args, **kwargs):
            return launch(*args, **{**kwargs, **self.changes})

        return run


dev, dt, PAGE, CAP = torch.device("cuda"), torch.bfloat16, 16, 8192
inputs = llama_layers(dev, dt)
layers, cos, sin, res0 = (inputs[k] for k in ("layers", "cos", "sin", "res0"))
CFG = layer_tiles(dev)
VARIANTS = {"after the wait": Launch(PRELOAD=False), "before, 4 warps": Launch(),
            "before, 8 warps": Launch(num_warps=8)}


def one_length(ctx: int, lines: list[str]) -> None:
    tables, lens, pos, slot, caches = paged_context(ctx, dev, dt, PAGE)

    def layers_chain(v, res, cs):
        pa._decode_split_kernel = VARIANTS[v]
        try:
            for ly, c in zip(layers, cs):
                qkv = dk.gemv_qkv_rotary(res, ly["qkv"], ly["n1"], 1e-5, cos, sin, pos, H, KV, config=CFG["qkv"],
                                         pdl=True, kv_cache=(c[0], c[1], slot), evict="evict_first")
                at = dk.paged_decode_attention(qkv[:, :H * D].view(1, H, D), c[0], c[1], tables, lens, PAGE,
                                               D ** -0.5, None, CAP, 128, pdl=True, merge_in_pass=True)
                dk.gemv(at.reshape(1, H * D), ly["o"], residual=res, config=CFG["o"], pdl=True, evict="evict_first")
                act = dk.gemv(res, ly["gu"], norm_weight=ly["n2"], eps=1e-5, silu_mul=True, config=CFG["gu"],
                              pdl=True, evict="evict_first")
                dk.gemv(act, ly["down"], residual=res, config=CFG["down"], pdl=True, evict="evict_first")
        finally:
            pa._decode_split_kernel = REAL
        return res

    outs = {v: layers_chain(v, res0.clone(), [(k.clone(), x.clone()) for k, x in caches]).float() for v in VARIANTS}
    first = next(iter(VARIANTS))
    for v in VARIANTS:
        lines.append(f"ctx {ctx}: {v:16s} residual after 16 layers: max |difference| from '{first}' "
                     f"{(outs[v] - outs[first]).abs().max().item():.3g}")
    chains = {v: [] for v in VARIANTS}
    state = {v: (res0.clone(), [(k.clone(), x.clone()) for k, x in caches]) for v in VARIANTS}
    for _ in range(a.trials):
        for v in VARIANTS:
            chains[v].append(graph_time(lambda v=v: layers_chain(v, *state[v])))
    for v in VARIANTS:
        c = sorted(chains[v])[a.trials // 2]
        lines.append(f"ctx {ctx}: {v:16s} 16 layers {c:7.1f} us  (trials {', '.join(f'{x:.1f}' for x in chains[v])})")
    print("\n".join(lines[-2 * len(VARIANTS):]), flush=True)


per_length(one_length, a.ctx, "preload.txt")
