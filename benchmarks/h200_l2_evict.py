"""H200: L2 eviction hints on the single-token GEMVs' weight loads. A batch-1 decode step streams
about 2.5 GB of weights through a 50 MB L2, so by default nothing survives from one step to the
next. Here the 16 Llama-3.2-1B-shaped layers' projections plus the tied LM head (128,256 x 2,048)
run as one CUDA graph, replayed back to back as decode steps are, with each weight's loads marked
evict_first (streamed), evict_last (kept) or left at the default. Median of interleaved trials;
writes $OUT/l2_evict.txt."""
import os

import torch
from graph_timing import graph_time
from llama_gemv_layers import HID, KV, H, llama_layers

import deepinfer_kernels as dk

out_dir = os.environ.get("OUT", ".")
dev = torch.device("cuda")
dt = torch.bfloat16
inputs = llama_layers(dev, dt)
layers, cos, sin, pos, res0 = (inputs[k] for k in ("layers", "cos", "sin", "pos", "res0"))
head = torch.randn(128256, HID, device=dev, dtype=dt) * 0.02
D = cos.shape[-1]
MB = 1e6


def chain(policy):
    res = res0.clone()
    for i, ly in enumerate(layers):
        qkv = dk.gemv_qkv_rotary(res, ly["qkv"], ly["n1"], 1e-5, cos, sin, pos, H, KV, pdl=True,
                                 evict=policy(i, "qkv"))
        dk.gemv(qkv[:, :H * D], ly["o"], residual=res, pdl=True, evict=policy(i, "o"))
        act = dk.gemv(res, ly["gu"], norm_weight=ly["n2"], eps=1e-5, silu_mul=True, pdl=True, evict=policy(i, "gu"))
        dk.gemv(act, ly["down"], residual=res, pdl=True, evict=policy(i, "down"))
    return dk.gemv(res, head, pdl=True, evict=policy(-1, "head"))


def keep(names, upto_mb, rest="evict_first"):
    """evict_last for the named weights of the first layers until upto_mb, ``rest`` for the others."""
    kept, total = set(), 0.0
    for i, ly in enumerate(layers):
        for nm in ("qkv", "o", "gu", "down"):
            size = ly[nm].numel() * ly[nm].element_size() / MB
            if nm in names and total + size <= upto_mb:
                kept.add((i, nm))
                total += size
    return (lambda i, nm: "evict_last" if (i, nm) in kept else rest), total


variants = {"default": (lambda i, nm: "", 0.0), "all evict_first": (lambda i, nm: "evict_first", 0.0)}
for mb in (16, 24, 32, 40, 48):
    variants[f"keep qkv+o <= {mb} MB"] = keep(("qkv", "o"), mb)
for mb in (24, 40):
    variants[f"keep qkv+o+gu+down <= {mb} MB"] = keep(("qkv", "o", "gu", "down"), mb)
    variants[f"keep qkv+o <= {mb} MB, rest default"] = keep(("qkv", "o"), mb, rest="")
ref = chain(variants["default"][0]).clone()
lines = []
for name, (pol, kept) in variants.items():
    same = torch.equal(chain(pol), ref)
    lines.append(f"{name}: kept {kept:.1f} MB, same logits as default: {same}")
print("\n".join(lines), flush=True)
times = {name: [] for name in variants}
for trial in range(3):
    for name, (pol, _) in variants.items():
        times[name].append(graph_time(lambda pol=pol: chain(pol), trials=30))
for name, ts in times.items():
    ts.sort()
    lines.append(f"{name:40s} {ts[1]:8.1f} us (trials {', '.join(f'{t:.1f}' for t in ts)})")
    print(lines[-1], flush=True)
with open(f"{out_dir}/l2_evict.txt", "w") as f:
    f.write("\n".join(lines) + "\n")
