"""H200: decode attention's pipeline stages in steps of one token (one tile a split: the loop runs
once, so stages buy no overlap and cost shared memory), and the keys read before the PDL wait
(f0b4711's kernel file, which the call carried as benchmarks/paged_attention_preload_f0b4711.py:
`git show f0b4711:kernels/paged_attention.py`)
with fewer stages. Batch 1, Llama-3.2-1B shape, bf16, PDL, 16 whole layers in one CUDA graph,
median of interleaved trials. Writes $OUT/attn_stages.txt.

    python3 h200_attn_stages.py [--ctx 640,1024] [--trials 5]
"""
import argparse
import importlib.util
import sys

import torch
from graph_timing import graph_time
from llama_gemv_layers import KV, D, H, layer_tiles, llama_layers, paged_context, per_length

import deepinfer_kernels as dk

ap = argparse.ArgumentParser()
ap.add_argument("--ctx", default="640,1024")
ap.add_argument("--trials", type=int, default=5)
a = ap.parse_args()
pa = sys.modules["deepinfer_kernels.paged_attention"]
REAL = pa._decode_split_kernel
spec = importlib.util.spec_from_file_location("preload", "paged_attention_preload_f0b4711.py")
pre = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pre)


class Launch:
    """pass 1 as paged_decode_attention launches it, from ``kern``, some launch arguments replaced"""

    def __init__(self, kern, **changes) -> None:
        self.kern, self.changes = kern, changes

    def __getitem__(self, grid):
        launch = self.kern[grid]

        def run(*args, **kwargs):
            return launch(*args, **{**kwargs, **self.changes})

        return run


dev, dt, PAGE, CAP = torch.device("cuda"), torch.bfloat16, 16, 8192
inputs = llama_layers(dev, dt)
layers, cos, sin, res0 = (inputs[k] for k in ("layers", "cos", "sin", "res0"))
CFG = layer_tiles(dev)
PRE = pre._decode_split_kernel
VARIANTS = {"2 stages (default)": Launch(REAL), "1 stage": Launch(REAL, num_stages=1),
            "3 stages": Launch(REAL, num_stages=3), "keys early, 2 stages": Launch(PRE, PRELOAD=True),
            "keys early, 1 stage": Launch(PRE, PRELOAD=True, num_stages=1)}


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
    lines.append(f"ctx {ctx}: max |difference| of the residual from '{first}': " + ", ".join(
        f"{v} {(outs[v] - outs[first]).abs().max().item():.3g}" for v in VARIANTS))
    chains = {v: [] for v in VARIANTS}
    state = {v: (res0.clone(), [(k.clone(), x.clone()) for k, x in caches]) for v in VARIANTS}
    for _ in range(a.trials):
        for v in VARIANTS:
            chains[v].append(graph_time(lambda v=v: layers_chain(v, *state[v])))
    for v in VARIANTS:
        c = sorted(chains[v])[a.trials // 2]
        lines.append(f"ctx {ctx}: {v:22s} 16 layers {c:7.1f} us  (trials {', '.join(f'{x:.1f}' for x in chains[v])})")
    print("\n".join(lines[-1 - len(VARIANTS):]), flush=True)


per_length(one_length, a.ctx, "attn_stages.txt")
