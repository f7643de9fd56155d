"""H200: decode attention and the output projection in one launch (``attention_o_proj``) against
the two kernels a batch-1 step runs now (split-KV attention merged in pass 1, then the residual
GEMV). Llama-3.2-1B shape, bf16, PDL, one CUDA graph each, median of interleaved trials: attention
+ o alone for 16 layers, and 16 whole layers (qkv writing the KV cache, attention + o, gate/up,
down), at several context lengths and tiles. Checks each against the current path first. Writes
$OUT/attn_o.txt.

    python3 h200_attn_o.py [--ctx 640,1024,2048] [--trials 5]
"""
import argparse
import os

import torch
from graph_timing import graph_time
from llama_gemv_layers import HID, INTER, KV, LAYERS, D, H, llama_layers

import deepinfer_kernels as dk
from deepinfer_kernels.gemv import default_config

ap = argparse.ArgumentParser()
ap.add_argument("--ctx", default="640,1024,2048")
ap.add_argument("--trials", type=int, default=5)
a = ap.parse_args()

dev, dt, PAGE = torch.device("cuda"), torch.bfloat16, 16
inputs = llama_layers(dev, dt)
layers, cos, sin, res0 = (inputs[k] for k in ("layers", "cos", "sin", "res0"))
CFG = {"qkv": default_config(H * D // 2 + KV * D, HID, dev, paired=True, row_quantum=D // 2),
       "o": default_config(HID, H * D, dev), "gu": default_config(INTER, HID, dev, paired=True),
       "down": default_config(HID, INTER, dev)}
# (rows a program, rows at once, keys a tile, warps); None: the two kernels of now
VARIANTS = {"split attention + o GEMV": None}
for t in ((128, 32, 64, 8), (256, 32, 64, 8), (64, 32, 64, 8), (128, 16, 64, 4), (128, 32, 32, 8),
          (128, 64, 64, 8), (128, 32, 128, 8), (256, 64, 64, 8)):
    VARIANTS["fused rows %d x%d keys %d warps %d" % t] = t


def one_length(ctx: int, lines: list[str]) -> None:
    pages = -(-ctx // PAGE) + 1
    tables = torch.randperm(pages * 2, generator=torch.Generator().manual_seed(0))[:pages].to(torch.int32)
    tables = tables.reshape(1, -1).to(dev)
    lens = torch.tensor([ctx], dtype=torch.int32, device=dev)
    pos = torch.tensor([ctx - 1], device=dev)
    slot = (tables[0, (ctx - 1) // PAGE].long() * PAGE + (ctx - 1) % PAGE).reshape(1)
    caches = [(torch.randn(pages * 2 * PAGE, KV, D, device=dev, dtype=dt),
               torch.randn(pages * 2 * PAGE, KV, D, device=dev, dtype=dt)) for _ in range(LAYERS)]
    qs = [torch.randn(1, H, D, device=dev, dtype=dt) for _ in range(LAYERS)]

    def attn_o(v, q, c, ly, res):
        t = VARIANTS[v]
        if t is None:
            at = dk.paged_decode_attention(q, c[0], c[1], tables, lens, PAGE, D ** -0.5, None, ctx, 128, pdl=True,
                                           merge_in_pass=True)
            return dk.gemv(at.reshape(1, H * D), ly["o"], residual=res, config=CFG["o"], pdl=True)
        return dk.attention_o_proj(q, c[0], c[1], tables, lens, PAGE, D ** -0.5, ly["o"], res, rows=t[0],
                                   block_n=t[1], block_keys=t[2], num_warps=t[3], pdl=True)

    def pairs_only(v, res):
        for q, c, ly in zip(qs, caches, layers):
            attn_o(v, q, c, ly, res)
        return res

    def layers_chain(v, res, cs):
        for ly, c in zip(layers, cs):
            qkv = dk.gemv_qkv_rotary(res, ly["qkv"], ly["n1"], 1e-5, cos, sin, pos, H, KV, config=CFG["qkv"],
                                     pdl=True, kv_cache=(c[0], c[1], slot))
            attn_o(v, qkv[:, :H * D].view(1, H, D), c, ly, res)
            act = dk.gemv(res, ly["gu"], norm_weight=ly["n2"], eps=1e-5, silu_mul=True, config=CFG["gu"], pdl=True)
            dk.gemv(act, ly["down"], residual=res, config=CFG["down"], pdl=True)
        return res

    base = "split attention + o GEMV"
    ref_pairs = pairs_only(base, res0.clone())
    ref_chain = layers_chain(base, res0.clone(), [(k.clone(), x.clone()) for k, x in caches])
    for v in VARIANTS:
        e1 = (pairs_only(v, res0.clone()).float() - ref_pairs.float()).abs().max().item()
        e2 = (layers_chain(v, res0.clone(), [(k.clone(), x.clone()) for k, x in caches]).float()
              - ref_chain.float()).abs().max().item()
        lines.append(f"ctx {ctx}: {v:36s} max abs diff against the split path: 16 attention+o {e1:.2e}, "
                     f"16 layers {e2:.2e} (residual scale {ref_chain.float().abs().max().item():.1f})")
        print(lines[-1], flush=True)
    times = {v: [] for v in VARIANTS}
    chains = {v: [] for v in VARIANTS}
    state = {v: (res0.clone(), [(k.clone(), x.clone()) for k, x in caches]) for v in VARIANTS}
    for _ in range(a.trials):
        for v in VARIANTS:
            times[v].append(graph_time(lambda v=v: pairs_only(v, state[v][0])))
            chains[v].append(graph_time(lambda v=v: layers_chain(v, *state[v])))
    for v in VARIANTS:
        t, c = sorted(times[v])[a.trials // 2], sorted(chains[v])[a.trials // 2]
        lines.append(f"ctx {ctx}: {v:36s} 16 attention+o {t:7.1f} us ({t / 16:.2f} a layer);"
                     f" 16 layers {c:7.1f} us  (trials {', '.join(f'{x:.1f}' for x in chains[v])})")
        print(lines[-1], flush=True)


lines: list[str] = []
for n in [int(c) for c in a.ctx.split(",")]:
    one_length(n, lines)
with open(os.path.join(os.environ.get("OUT", "."), "attn_o.txt"), "w") as f:
    f.write("\n".join(lines) + "\n")
