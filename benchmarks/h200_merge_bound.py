"""H200: an upper bound for moving decode attention's merge out of its kernel. Batch 1, Llama-3.2-1B
shape, bf16, PDL, 16 whole layers in one CUDA graph (qkv writing the cache, attention, o, gate/up,
down), median of interleaved trials: attention as now (pass 1 merges its splits: a counter, then
the partials' reads) against pass 1 writing its partials only (no counter, no merge; o then reads
a stale output, so only the times mean anything), each with the o GEMV's default tile and with 16
rows a program (what an o kernel reading the partials itself would need). Writes
$OUT/merge_bound.txt.

    python3 h200_merge_bound.py [--ctx 640,1024] [--trials 5]
"""
import argparse
import os
import sys

import torch
from graph_timing import graph_time
from llama_gemv_layers import HID, INTER, KV, LAYERS, D, H, llama_layers

import deepinfer_kernels as dk
from deepinfer_kernels.gemv import GemvConfig, default_config

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
CFG = {"qkv": default_config(H * D // 2 + KV * D, HID, dev, paired=True, row_quantum=D // 2),
       "o": default_config(HID, H * D, dev), "gu": default_config(INTER, HID, dev, paired=True),
       "down": default_config(HID, INTER, dev)}
O16 = GemvConfig(16, 2048, 1, 8)
VARIANTS = {"merge in pass 1, o default": (True, CFG["o"]), "no merge, o default": (False, CFG["o"]),
            "merge in pass 1, o 16 rows": (True, O16), "no merge, o 16 rows": (False, O16)}


def one_length(ctx: int, lines: list[str]) -> None:
    pages = -(-ctx // PAGE) + 1
    tables = torch.randperm(pages * 2, generator=torch.Generator().manual_seed(0))[:pages].to(torch.int32)
    tables = tables.reshape(1, -1).to(dev)
    lens = torch.tensor([ctx], dtype=torch.int32, device=dev)
    pos = torch.tensor([ctx - 1], device=dev)
    slot = (tables[0, (ctx - 1) // PAGE].long() * PAGE + (ctx - 1) % PAGE).reshape(1)
    caches = [(torch.randn(pages * 2 * PAGE, KV, D, device=dev, dtype=dt),
               torch.randn(pages * 2 * PAGE, KV, D, device=dev, dtype=dt)) for _ in range(LAYERS)]

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


lines: list[str] = []
for n in [int(c) for c in a.ctx.split(",")]:
    one_length(n, lines)
with open(os.path.join(os.environ.get("OUT", "."), "merge_bound.txt"), "w") as f:
    f.write("\n".join(lines) + "\n")
