"""(Ran at dcc3ce0, which held paged_decode_attention_partials; reverted after.) H200: decode
attention's splits merged by o_proj's GEMV as it reads them, against pass 1's merge.
Batch 1, Llama-3.2-1B shape, bf16, PDL, 16 whole layers in one CUDA graph (qkv writing the cache,
attention, o, gate/up, down) with the default tiles, the partials' buffer sized for 8,192 keys as a
captured step's is; median of interleaved trials. At 2,048 keys (16 splits of 128) pass 1 still
merges and o reads its output. Writes $OUT/merge_in_o.txt.

    python3 h200_merge_in_o.py [--ctx 640,1024,2048] [--trials 5]
"""
import argparse

import torch
from graph_timing import graph_time
from llama_gemv_layers import KV, D, H, layer_tiles, llama_layers, paged_context, per_length

import deepinfer_kernels as dk

ap = argparse.ArgumentParser()
ap.add_argument("--ctx", default="640,1024,2048")
ap.add_argument("--trials", type=int, default=5)
a = ap.parse_args()

dev, dt, PAGE, CAP = torch.device("cuda"), torch.bfloat16, 16, 8192
inputs = llama_layers(dev, dt)
layers, cos, sin, res0 = (inputs[k] for k in ("layers", "cos", "sin", "res0"))
CFG = layer_tiles(dev)
VARIANTS = ("merge in pass 1", "merged by o")


def one_length(ctx: int, lines: list[str]) -> None:
    tables, lens, pos, slot, caches = paged_context(ctx, dev, dt, PAGE)

    def layers_chain(v, res, cs):
        for ly, c in zip(layers, cs):
            qkv = dk.gemv_qkv_rotary(res, ly["qkv"], ly["n1"], 1e-5, cos, sin, pos, H, KV, config=CFG["qkv"],
                                     pdl=True, kv_cache=(c[0], c[1], slot))
            args = (qkv[:, :H * D].view(1, H, D), c[0], c[1], tables, lens, PAGE, D ** -0.5, None, CAP, 128)
            if v == "merged by o":
                at = dk.paged_decode_attention_partials(*args, pdl=True)
            else:
                at = dk.paged_decode_attention(*args, pdl=True, merge_in_pass=True).reshape(1, H * D)
            dk.gemv(at, ly["o"], residual=res, config=CFG["o"], pdl=True, evict="evict_first")
            act = dk.gemv(res, ly["gu"], norm_weight=ly["n2"], eps=1e-5, silu_mul=True, config=CFG["gu"], pdl=True,
                          evict="evict_first")
            dk.gemv(act, ly["down"], residual=res, config=CFG["down"], pdl=True, evict="evict_first")
        return res

    outs = {}
    for v in VARIANTS:  # one eager pass each from the same start: the two agree
        outs[v] = layers_chain(v, res0.clone(), [(k.clone(), x.clone()) for k, x in caches]).float()
    diff = (outs[VARIANTS[0]] - outs[VARIANTS[1]]).abs().max().item()
    scale = outs[VARIANTS[0]].abs().max().item()
    chains = {v: [] for v in VARIANTS}
    state = {v: (res0.clone(), [(k.clone(), x.clone()) for k, x in caches]) for v in VARIANTS}
    for _ in range(a.trials):
        for v in VARIANTS:
            chains[v].append(graph_time(lambda v=v: layers_chain(v, *state[v])))
    lines.append(f"ctx {ctx}: 16 layers' residual, max |difference| {diff:.3g} of max |value| {scale:.3g}")
    for v in VARIANTS:
        c = sorted(chains[v])[a.trials // 2]
        lines.append(f"ctx {ctx}: {v:16s} 16 layers {c:7.1f} us  (trials {', '.join(f'{x:.1f}' for x in chains[v])})")
    print("\n".join(lines[-3:]), flush=True)


per_length(one_length, a.ctx, "merge_in_o.txt")
