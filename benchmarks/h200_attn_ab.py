"""H200: single-token decode attention of session 14 (the merge's splits read at once, the first
tile's block-table entries read with the length) against the kernel before it (``--old FILE``: a
copy of the earlier kernels/paged_attention.py). Llama-3.2-1B shape, bf16, PDL, splits of 128
merged in pass 1, as the triton plugin runs batch 1. Times, in one CUDA graph each, median of
interleaved trials: 16 attention launches alone (each layer its own cache), and 16 whole layers (qkv
writing the KV cache, attention, o, gate/up, down); checks each against the other's output first.
Writes $OUT/attn_ab.txt.

    python3 h200_attn_ab.py --old paged_attention_old.py [--ctx 640,1024]
"""
import argparse
import importlib.util

import torch
from graph_timing import graph_time
from llama_gemv_layers import KV, LAYERS, D, H, layer_tiles, llama_layers, paged_context, per_length

import deepinfer_kernels as dk

ap = argparse.ArgumentParser()
ap.add_argument("--old", required=True)
ap.add_argument("--ctx", default="640,1024")
ap.add_argument("--trials", type=int, default=5)
a = ap.parse_args()
spec = importlib.util.spec_from_file_location("paged_attention_old", a.old)
old = importlib.util.module_from_spec(spec)
spec.loader.exec_module(old)

dev, dt, PAGE = torch.device("cuda"), torch.bfloat16, 16
inputs = llama_layers(dev, dt)
layers, cos, sin, res0 = (inputs[k] for k in ("layers", "cos", "sin", "res0"))
CFG = layer_tiles(dev)
KERNELS = {"new": dk.paged_decode_attention, "old": old.paged_decode_attention}
VARIANTS = {"old split 128": ("old", 128), "new split 128": ("new", 128), "new split 64": ("new", 64),
            "new split 256": ("new", 256)}
def one_length(ctx: int, lines: list[str]) -> None:
    tables, lens, pos, slot, caches = paged_context(ctx, dev, dt, PAGE)
    qs = [torch.randn(1, H, D, device=dev, dtype=dt) for _ in range(LAYERS)]

    def attn_only(v):
        kern, split = KERNELS[VARIANTS[v][0]], VARIANTS[v][1]
        return [kern(q, c[0], c[1], tables, lens, PAGE, D ** -0.5, None, ctx, split, pdl=True, merge_in_pass=True)
                for q, c in zip(qs, caches)]

    def layers_chain(v, res, cs):
        kern, split = KERNELS[VARIANTS[v][0]], VARIANTS[v][1]
        for ly, c in zip(layers, cs):
            qkv = dk.gemv_qkv_rotary(res, ly["qkv"], ly["n1"], 1e-5, cos, sin, pos, H, KV, config=CFG["qkv"],
                                     pdl=True, kv_cache=(c[0], c[1], slot))
            at = kern(qkv[:, :H * D].view(1, H, D), c[0], c[1], tables, lens, PAGE, D ** -0.5, None, ctx, split,
                      pdl=True, merge_in_pass=True)
            dk.gemv(at.reshape(1, H * D), ly["o"], residual=res, config=CFG["o"], pdl=True)
            act = dk.gemv(res, ly["gu"], norm_weight=ly["n2"], eps=1e-5, silu_mul=True, config=CFG["gu"], pdl=True)
            dk.gemv(act, ly["down"], residual=res, config=CFG["down"], pdl=True)
        return res

    ref = attn_only("old split 128")
    for v in VARIANTS:
        got = attn_only(v)
        err = max((x.float() - y.float()).abs().max().item() for x, y in zip(got, ref))
        lines.append(f"ctx {ctx}: {v:16s} attention max abs diff against old split 128: {err:.2e}")
        print(lines[-1], flush=True)
    times = {v: [] for v in VARIANTS}
    chains = {v: [] for v in VARIANTS}
    state = {v: (res0.clone(), [(k.clone(), x.clone()) for k, x in caches]) for v in VARIANTS}
    for _ in range(a.trials):
        for v in VARIANTS:
            times[v].append(graph_time(lambda v=v: attn_only(v)))
            chains[v].append(graph_time(lambda v=v: layers_chain(v, *state[v])))
    for v in VARIANTS:
        t, c = sorted(times[v])[a.trials // 2], sorted(chains[v])[a.trials // 2]
        lines.append(f"ctx {ctx}: {v:16s} 16 attention launches {t:7.1f} us ({t / 16:.2f} a layer);"
                     f" 16 layers {c:7.1f} us  (trials {', '.join(f'{x:.1f}' for x in chains[v])})")
        print(lines[-1], flush=True)
per_length(one_length, a.ctx, "attn_ab.txt")
