"""H200: single-token GEMV tiles measured as a decode step runs them. Each projection of 16
Llama-3.2-1B-shaped layers (distinct weights, bf16, 1,946 MB in all) runs as 16 launches with PDL
in one CUDA graph, per tile; then the whole 16-layer chain with each projection's best tile
against the defaults, interleaved. Writes $OUT/gemv_tiles.txt and the best tiles to
$OUT/gemv_best.json (GemvConfig fields per projection)."""
import dataclasses
import json
import os

import torch
from graph_timing import graph_time
from llama_gemv_layers import HID, INTER, KV, LAYERS, D, H, llama_layers

import deepinfer_kernels as dk
from deepinfer_kernels.gemv import GemvConfig, default_config

out_dir = os.environ.get("OUT", ".")
dev = torch.device("cuda")
dt = torch.bfloat16
SMS = torch.cuda.get_device_properties(dev).multi_processor_count
inputs = llama_layers(dev, dt)
layers, cos, sin, pos, res0 = (inputs[k] for k in ("layers", "cos", "sin", "pos", "res0"))
x0 = torch.randn(1, HID, device=dev, dtype=dt)
act0 = torch.randn(1, INTER, device=dev, dtype=dt) * 0.1
MB = {k: layers[0][k].numel() * 2 / 1e6 for k in ("qkv", "o", "gu", "down")}


def run(kind, cfg, ly, res):
    if kind == "qkv":
        return dk.gemv_qkv_rotary(res, ly["qkv"], ly["n1"], 1e-5, cos, sin, pos, H, KV, config=cfg, pdl=True)
    if kind == "o":
        return dk.gemv(x0, ly["o"], residual=res, config=cfg, pdl=True)
    if kind == "gu":
        return dk.gemv(res, ly["gu"], norm_weight=ly["n2"], eps=1e-5, silu_mul=True, config=cfg, pdl=True)
    return dk.gemv(act0, ly["down"], residual=res, config=cfg, pdl=True)


DEFAULTS = {"qkv": default_config(H * D // 2 + KV * D, HID, dev, paired=True, row_quantum=D // 2),
            "o": default_config(HID, H * D, dev), "gu": default_config(INTER, HID, dev, paired=True),
            "down": default_config(HID, INTER, dev)}
ROWS = {"qkv": (H + 2 * KV) * D // 2, "o": HID, "gu": INTER, "down": HID}
TILES = {"qkv": [(2, 512, 4), (4, 512, 4), (4, 256, 2), (8, 512, 8), (4, 1024, 8), (8, 256, 4), (4, 512, 8)],
         "o": [(4, 2048, 8), (8, 1024, 8), (8, 512, 4), (16, 512, 8), (8, 2048, 8), (4, 1024, 8), (16, 256, 4)],
         "gu": [(8, 256, 2), (16, 256, 4), (16, 128, 2), (32, 128, 4), (16, 512, 8), (8, 256, 4), (32, 256, 8)],
         "down": [(4, 2048, 4), (8, 1024, 8), (16, 512, 8), (8, 512, 4), (16, 1024, 8), (8, 1024, 4), (4, 1024, 8),
                  (8, 2048, 16)]}


def candidates(kind):
    yield DEFAULTS[kind]
    for bn, bk, w in TILES[kind]:
        yield GemvConfig(bn, bk, 1, w)
        yield GemvConfig(bn, bk, 1, w, prefetch=False)


lines = [f"{SMS} SMs; per projection: 16 launches with PDL in one graph, us a launch and TB/s"]
best = {}
for kind in ("qkv", "o", "gu", "down"):
    res = res0.clone()
    rows = []
    for cfg in candidates(kind):
        try:
            t = graph_time(lambda cfg=cfg, kind=kind, res=res: [run(kind, cfg, ly, res) for ly in layers]) / LAYERS
        except Exception as e:  # noqa: BLE001 (a tile that does not compile here: shared memory, registers)
            lines.append(f"  {kind:5s} {cfg}: failed: {type(e).__name__}: {str(e)[:120]}")
            continue
        rows.append((t, cfg))
        lines.append(f"  {kind:5s} bn={cfg.block_n:2d} bk={cfg.block_k:4d} split={cfg.split_k} warps={cfg.num_warps:2d} "
                     f"prefetch={cfg.prefetch!s:5s} {t:6.2f} us  {MB[kind] / t:.2f} TB/s")
        print(lines[-1], flush=True)
    rows.sort(key=lambda r: r[0])
    best[kind] = rows[0][1]
    lines.append(f"  {kind}: best {rows[0][1]} at {rows[0][0]:.2f} us")


def chain(cfgs):
    res = res0.clone()
    for ly in layers:
        qkv = run("qkv", cfgs["qkv"], ly, res)
        dk.gemv(qkv[:, :H * D], ly["o"], residual=res, config=cfgs["o"], pdl=True)
        act = dk.gemv(res, ly["gu"], norm_weight=ly["n2"], eps=1e-5, silu_mul=True, config=cfgs["gu"], pdl=True)
        dk.gemv(act, ly["down"], residual=res, config=cfgs["down"], pdl=True)
    return res


total = sum(MB.values()) * LAYERS
lines.append("16-layer chain (qkv, o, gate/up, down with PDL), interleaved trials:")
times = {"defaults": [], "best": []}
for _ in range(3):
    for name, cfgs in (("defaults", DEFAULTS), ("best", best)):
        times[name].append(graph_time(lambda cfgs=cfgs: chain(cfgs)))
for name, ts in times.items():
    t = sorted(ts)[1]
    lines.append(f"  {name:9s} {t:8.1f} us  {total / t:.2f} TB/s  (trials {', '.join(f'{v:.1f}' for v in ts)})")
with open(f"{out_dir}/gemv_tiles.txt", "w") as f:
    f.write("\n".join(lines) + "\n")
print("\n".join(lines[-4:]))
with open(f"{out_dir}/gemv_best.json", "w") as f:
    json.dump({k: dataclasses.asdict(v) for k, v in best.items()}, f)
