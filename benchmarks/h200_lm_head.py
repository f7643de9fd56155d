"""H200: the batch-1 LM head (Llama-3.2-1B shape: 128,256 x 2,048, bf16) as cuBLAS after the final
RMSNorm kernel, against the single-token GEMV kernel with the norm folded in, over a few tiles.
Device time from CUDA-graph replays (5 calls a graph, median of 10 replays); each variant's logits
are checked against cuBLAS's first.

    python3 benchmarks/h200_lm_head.py"""
import itertools

import torch
import torch.nn.functional as F
from graph_timing import graph_time

import deepinfer_kernels as dk
from deepinfer_kernels.gemv import GemvConfig

torch.manual_seed(0)
dev, dt = torch.device("cuda"), torch.bfloat16
x = torch.randn(1, 2048, device=dev, dtype=dt)
nw = (1 + 0.1 * torch.randn(2048, device=dev)).to(dt)
w = (0.02 * torch.randn(128256, 2048, device=dev)).to(dt)
ref = F.linear(dk.rms_norm(x, nw, 1e-5), w).float()
variants = {"rms_norm kernel + cuBLAS": lambda: F.linear(dk.rms_norm(x, nw, 1e-5), w),
            "cuBLAS alone (no norm)": lambda: F.linear(x, w),
            "GEMV, norm folded, default tile": lambda: dk.gemv(x, w, norm_weight=nw, eps=1e-5)}
for bn, bk, warps in itertools.product((4, 8, 16), (512, 1024, 2048), (4, 8)):
    cfg = GemvConfig(bn, bk, 1, warps)
    variants[f"GEMV, norm folded, {bn} x {bk} / {warps}"] = lambda cfg=cfg: dk.gemv(x, w, norm_weight=nw, eps=1e-5,
                                                                                     config=cfg)
gb = w.numel() * 2 / 1e9
for name, fn in variants.items():
    diff = (fn().float() - ref).abs().max().item()
    us = graph_time(fn, reps=5, trials=10)
    print(f"{name:40s} {us:8.1f} us  {gb / us * 1e3:5.2f} TB/s  max diff {diff:.2e}", flush=True)
