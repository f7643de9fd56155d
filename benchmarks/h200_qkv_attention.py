"""H200: decode attention folded into the single-token qkv GEMV (QkvAttention) against the chain of
the qkv GEMV (writing the KV cache) and the decode attention kernel (split 128, merged in its first
pass), both with PDL, in 16 Llama-3.2-1B-shaped layers (qkv, attention, o, gate/up, down; bf16) over
a 640-token context in pages of 16, one CUDA graph per variant, interleaved trials. Checks each
variant's attention output against the torch reference first. Writes $OUT/qkv_attention.txt."""
import os
import sys

import torch
from graph_timing import graph_time
from llama_gemv_layers import HID, KV, LAYERS, D, H, llama_layers

import deepinfer_kernels as dk

out_dir = os.environ.get("OUT", ".")
dev = torch.device("cuda")
dt = torch.bfloat16
CTX = int(sys.argv[1]) if len(sys.argv) > 1 else 640
PAGE = 16
inputs = llama_layers(dev, dt)
layers, cos, sin, res0 = (inputs[k] for k in ("layers", "cos", "sin", "res0"))
pos = torch.tensor([CTX - 1], device=dev)
pages = -(-CTX // PAGE) + 1
g = torch.Generator().manual_seed(0)
tables = torch.randperm(pages * 2, generator=g)[:pages].to(torch.int32).reshape(1, -1).to(dev)
lens = torch.tensor([CTX], dtype=torch.int32, device=dev)
caches = [(torch.randn(pages * 2 * PAGE, KV, D, device=dev, dtype=dt),
           torch.randn(pages * 2 * PAGE, KV, D, device=dev, dtype=dt)) for _ in range(LAYERS)]
slot = (tables[0, (CTX - 1) // PAGE].long() * PAGE + (CTX - 1) % PAGE).reshape(1)
scale = D ** -0.5


def attend(ly, c, res, variant):
    args = (res, ly["qkv"], ly["n1"], 1e-5, cos, sin, pos, H, KV)
    if variant is None:
        qkv = dk.gemv_qkv_rotary(*args, pdl=True, kv_cache=(c[0], c[1], slot))
        return dk.paged_decode_attention(qkv[:, :H * D].view(1, H, D), c[0], c[1], tables, lens, PAGE, scale,
                                         None, CTX, 128, pdl=True, merge_in_pass=True)
    bn, st = variant
    at = dk.QkvAttention(tables, lens, PAGE, scale, None, block_n=bn, num_stages=st)
    return dk.gemv_qkv_rotary(*args, pdl=True, kv_cache=(c[0], c[1], slot), attention=at)


def chain(variant):
    res = res0.clone()
    for ly, c in zip(layers, caches):
        a = attend(ly, c, res, variant)
        dk.gemv(a.reshape(1, H * D), ly["o"], residual=res, pdl=True)
        act = dk.gemv(res, ly["gu"], norm_weight=ly["n2"], eps=1e-5, silu_mul=True, pdl=True)
        dk.gemv(act, ly["down"], residual=res, pdl=True)
    return res


VARIANTS = {"unfused (qkv + decode attention)": None, "fused bn=64 st=3": (64, 3), "fused bn=64 st=2": (64, 2),
            "fused bn=32 st=4": (32, 4), "fused bn=128 st=2": (128, 2), "fused bn=64 st=1": (64, 1)}
lines = [f"context {CTX}, pages of {PAGE}; attention output against the reference (max abs diff), layer 0"]
ok = {}
for name, v in VARIANTS.items():
    c = (caches[0][0].clone(), caches[0][1].clone())
    try:
        got = attend(layers[0], c, res0.clone(), v)
        ref = dk.gemv_qkv_rotary_ref(res0.clone(), layers[0]["qkv"], layers[0]["n1"], 1e-5, cos, sin, pos, H, KV,
                                     kv_cache=(c[0].clone(), c[1].clone(), slot),
                                     attention=dk.QkvAttention(tables, lens, PAGE, scale))
        err = (got.float() - ref.float()).abs().max().item()
        ok[name] = err < 3e-2
        lines.append(f"  {name:34s} max abs diff {err:.2e} {'ok' if ok[name] else 'WRONG'}")
    except Exception as e:  # noqa: BLE001 (a variant that does not compile here)
        lines.append(f"  {name:34s} failed: {type(e).__name__}: {str(e)[:200]}")
    print(lines[-1], flush=True)
lines.append("16 layers (qkv, attention, o, gate/up, down with PDL), one graph, us; median of 3 interleaved trials")
times = {n: [] for n in VARIANTS if ok.get(n)}
for _ in range(3):
    for name in times:
        times[name].append(graph_time(lambda v=VARIANTS[name]: chain(v)))
for name, ts in times.items():
    lines.append(f"  {name:34s} {sorted(ts)[1]:8.1f} us  (trials {', '.join(f'{t:.1f}' for t in ts)})")
with open(f"{out_dir}/qkv_attention_{CTX}.txt", "w") as f:
    f.write("\n".join(lines) + "\n")
print("\n".join(lines))
