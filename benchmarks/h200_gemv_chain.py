"""H200: the four single-token projections of 16 Llama-3.2-1B-shaped layers (distinct weights,
bf16) as one CUDA graph, as a decode step runs them (without attention): GEMV kernels with and
without programmatic dependent launch, against cuBLAS plus the small kernels they replace. Also
each projection alone with the default tile, PDL on and off. Writes $OUT/gemv_chain.txt."""
import os
import sys

import torch
import torch.nn.functional as F
from graph_timing import graph_time
from llama_gemv_layers import INTER, KV, LAYERS, D, H, llama_layers

import deepinfer_kernels as dk

gemv_mod = sys.modules["deepinfer_kernels.gemv"]  # the module (the package exports a function of its name)

out_dir = os.environ.get("OUT", ".")
dev = torch.device("cuda")
dt = torch.bfloat16
inputs = llama_layers(dev, dt)
layers, cos, sin, pos, res0 = (inputs[k] for k in ("layers", "cos", "sin", "pos", "res0"))
weight_mb = sum(t.numel() * t.element_size() for ly in layers for k, t in ly.items() if k in ("qkv", "o", "gu", "down")) / 1e6


def fused_chain(pdl):
    res = res0.clone()
    for ly in layers:
        qkv = dk.gemv_qkv_rotary(res, ly["qkv"], ly["n1"], 1e-5, cos, sin, pos, H, KV, pdl=pdl)
        dk.gemv(qkv[:, :H * D], ly["o"], residual=res, pdl=pdl)
        act = dk.gemv(res, ly["gu"], norm_weight=ly["n2"], eps=1e-5, silu_mul=True, pdl=pdl)
        dk.gemv(act, ly["down"], residual=res, pdl=pdl)
    return res


def eager_chain():
    x, res = res0.clone(), torch.zeros_like(res0)
    for ly in layers:
        h, res = dk.rms_norm(x, ly["n1"], 1e-5, res)
        q, k, _ = F.linear(h, ly["qkv"]).split([H * D, KV * D, KV * D], -1)
        q, k = dk.apply_rotary(q.view(1, H, D), k.view(1, KV, D), cos, sin, pos)
        o = F.linear(q.reshape(1, -1), ly["o"])
        h, res = dk.rms_norm(o, ly["n2"], 1e-5, res)
        x = F.linear(dk.silu_and_mul(F.linear(h, ly["gu"])), ly["down"])
    return x


lines = [f"16 layers' projections, {weight_mb:.0f} MB of weights (one decode step without attention):"]
a, b = fused_chain(False), fused_chain(True)
lines.append(f"  PDL on and off give the same residual: {torch.equal(a, b)}")
best = {}
for name, fn, prefetch in (("cuBLAS + small kernels", eager_chain, True),
                           ("GEMV kernels", lambda: fused_chain(False), True),
                           ("GEMV kernels, PDL", lambda: fused_chain(True), True),
                           ("GEMV kernels, no prefetch", lambda: fused_chain(False), False),
                           ("GEMV kernels, PDL, no prefetch", lambda: fused_chain(True), False)):
    gemv_mod.PREFETCH = prefetch
    t = graph_time(fn)
    best[name] = t
    lines.append(f"  {name:32s} {t:8.1f} us  {weight_mb / t:.2f} TB/s")
    print(lines[-1], flush=True)
gemv_mod.PREFETCH = best["GEMV kernels, PDL"] <= best["GEMV kernels, PDL, no prefetch"]
lines.append(f"PREFETCH={gemv_mod.PREFETCH}")
print(lines[-1], flush=True)
x = res0
act_in = torch.randn(1, INTER, device=dev, dtype=dt) * 0.1
for name, fn in (("qkv_rotary", lambda p, ly: dk.gemv_qkv_rotary(x, ly["qkv"], ly["n1"], 1e-5, cos, sin, pos, H, KV, pdl=p)),
                 ("o_residual", lambda p, ly: dk.gemv(x, ly["o"], residual=res0, pdl=p)),
                 ("gate_up_silu", lambda p, ly: dk.gemv(x, ly["gu"], norm_weight=ly["n2"], eps=1e-5, silu_mul=True, pdl=p)),
                 ("down_residual", lambda p, ly: dk.gemv(act_in, ly["down"], residual=res0, pdl=p))):
    per = []
    for p in (False, True):
        per.append(graph_time(lambda fn=fn, p=p: [fn(p, ly) for ly in layers]) / LAYERS)
    lines.append(f"  {name:14s} default tile, a launch: {per[0]:.2f} us, with PDL {per[1]:.2f} us")
    print(lines[-1], flush=True)
with open(f"{out_dir}/gemv_chain.txt", "w") as f:
    f.write("\n".join(lines) + "\n")
