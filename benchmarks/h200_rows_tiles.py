"""H200: the multi-row GEMVs' tiles (gemv_rows, gemv_rows_qkv_rotary) at 4, 6 and 16 tokens, as a
step runs them: each projection of 16 layers (distinct bf16 weights) as 16 launches with PDL in
one CUDA graph, per tile, against cuBLAS's plain matmuls of the same shapes (the epilogues' own
kernels not counted). Shapes: Llama-3.2-1B's layers and the demo target's (Qwen3, q/k norm).
Writes $OUT/rows_tiles.txt.

    python3 benchmarks/h200_rows_tiles.py [--rows 4,6,16]
"""
import argparse
import os

import torch
import triton
from graph_timing import graph_time

import deepinfer_kernels as dk
from deepinfer_kernels.gemv_rows import RowsConfig

dev = torch.device("cuda")
dt = torch.bfloat16
LAYERS = 16
TILES = [RowsConfig(16, 128, 4, 3), RowsConfig(16, 256, 4, 3), RowsConfig(16, 512, 4, 3),
         RowsConfig(16, 256, 8, 3), RowsConfig(16, 512, 8, 3), RowsConfig(16, 256, 4, 4),
         RowsConfig(16, 512, 8, 4), RowsConfig(16, 1024, 8, 3)]
MODELS = {"llama-1b": {"hid": 2048, "inter": 8192, "h": 32, "kv": 8, "d": 64, "qk_norm": False},
          "demo": {"hid": 384, "inter": 1024, "h": 6, "kv": 2, "d": 64, "qk_norm": True}}


def layers(m: dict) -> list[dict]:
    torch.manual_seed(0)
    hid, inter, d = m["hid"], m["inter"], m["d"]
    return [{"qkv": torch.randn((m["h"] + 2 * m["kv"]) * d, hid, device=dev, dtype=dt) * 0.02,
             "o": torch.randn(hid, m["h"] * d, device=dev, dtype=dt) * 0.02,
             "gu": torch.randn(2 * inter, hid, device=dev, dtype=dt) * 0.02,
             "down": torch.randn(hid, inter, device=dev, dtype=dt) * 0.02,
             "n": torch.rand(hid, device=dev, dtype=dt) + 0.5,
             "qn": torch.rand(d, device=dev, dtype=dt) + 0.5} for _ in range(LAYERS)]


def one_size(name: str, m: dict, ls: list[dict], rows: int, cos, sin) -> list[str]:
    """Each projection of ``ls`` at ``rows`` tokens: cuBLAS, then every tile; a line each."""
    hid, inter, d = m["hid"], m["inter"], m["d"]
    x = torch.randn(rows, hid, device=dev, dtype=dt)
    ins = {"qkv": x, "o": torch.randn(rows, m["h"] * d, device=dev, dtype=dt) * 0.1, "gu": x,
           "down": torch.randn(rows, inter, device=dev, dtype=dt) * 0.1}
    res = torch.randn(rows, hid, device=dev, dtype=dt)
    pos = torch.arange(600, 600 + rows, device=dev)
    qk_norm = m["qk_norm"]

    def proj(kind, cfg, ly):
        if kind == "qkv":
            qn = ly["qn"] if qk_norm else None
            c = RowsConfig(d // 2, cfg.block_k, cfg.num_warps, cfg.num_stages) if qn is not None else cfg
            return dk.gemv_rows_qkv_rotary(x, ly["qkv"], ly["n"], 1e-6, cos, sin, pos, m["h"], m["kv"],
                                           q_norm=qn, k_norm=qn, config=c, pdl=True)
        if kind == "gu":
            return dk.gemv_rows(x, ly["gu"], norm_weight=ly["n"], silu_mul=True, config=cfg, pdl=True)
        return dk.gemv_rows(ins[kind], ly[kind], residual=res, config=cfg, pdl=True)  # o, down

    lines = []
    for kind in ("qkv", "o", "gu", "down"):
        cub = graph_time(lambda kind=kind: [torch.mm(ins[kind], ly[kind].t()) for ly in ls])
        row = [f"{name:8s} M={rows:2d} {kind:4s} cuBLAS {cub:7.1f}"]
        for cfg in TILES:
            try:
                t = graph_time(lambda cfg=cfg, kind=kind: [proj(kind, cfg, ly) for ly in ls])
                row.append(f"{cfg.block_k}/{cfg.num_warps}/{cfg.num_stages} {t:7.1f}")
            except triton.runtime.errors.OutOfResources:  # a tile too large for shared memory
                row.append(f"{cfg.block_k}/{cfg.num_warps}/{cfg.num_stages} OutOfResources")
        lines.append("  ".join(row))
        print(lines[-1], flush=True)
    return lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="4,6,16")
    a = ap.parse_args()
    lines = [(f"us for {LAYERS} launches in one graph; tiles block_k/warps/stages (block_n 16; 32 for the "
              "demo's qkv: whole half heads for the q/k norm)")]
    for name, m in MODELS.items():
        ls = layers(m)
        ang = torch.outer(torch.arange(1024.0), torch.rand(m["d"] // 2))
        cos = torch.cat([ang, ang], -1).cos().to(dev, dt)
        sin = torch.cat([ang, ang], -1).sin().to(dev, dt)
        for rows in [int(r) for r in a.rows.split(",")]:
            lines += one_size(name, m, ls, rows, cos, sin)
    with open(os.path.join(os.environ.get("OUT", "."), "rows_tiles.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
