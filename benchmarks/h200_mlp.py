"""H200: a single token's gated MLP as one kernel (gemv_mlp) against gate/up then down (two GEMVs).
Batch 1, Llama-3.2-1B shape, bf16, PDL, 16 whole layers in one CUDA graph (qkv writing the cache,
attention, o, then the MLP), median of interleaved trials, the residual after 16 layers checked
against the two GEMVs'. Tiles: block_i channels a program (rows of gate and up, columns of down),
block_k gate/up columns a step, block_n down rows a step, reducers, warps; "T": down stored
transposed [I, K]. It lost (docs/benchmarks.md, session 18); the kernel and this script's hooks in
llama_gemv_layers.layer_chain (``mlp``, ``down_t``) were removed after, so it runs at bc1fed5 only. Writes $OUT/mlp.txt, and the fastest tile's name to $OUT/mlp_best.txt.

    python3 h200_mlp.py [--ctx 640] [--trials 5] [--set sweep|final]
"""
import os
import sys

from llama_gemv_layers import chain_variants

from deepinfer_kernels.mlp import MlpConfig

SWEEP = {"two GEMVs": {}, "mlp default": {"mlp": True}, "mlp default T": {"mlp": True, "down_t": True}}
for bi, bk, bn, red, w in ((32, 256, 256, 32, 8), (32, 128, 128, 32, 4), (32, 64, 128, 32, 4), (32, 128, 128, 16, 4),
                           (32, 128, 128, 64, 4), (16, 256, 512, 32, 8), (16, 128, 256, 32, 4), (16, 256, 256, 32, 4),
                           (16, 128, 128, 32, 4), (64, 32, 128, 64, 8), (64, 64, 128, 32, 8)):
    SWEEP[f"mlp {bi},{bk},{bn},{red},{w}"] = {"mlp": MlpConfig(bi, bk, bn, red, w)}
sets = {"sweep": SWEEP, "final": {"two GEMVs": {}, "mlp default": {"mlp": True}}}
name = sys.argv[sys.argv.index("--set") + 1] if "--set" in sys.argv else "sweep"
chain_variants(sets[name], "mlp.txt", default_ctx="640")
best = {}
with open(os.path.join(os.environ.get("OUT", "."), "mlp.txt")) as f:
    lines = f.read().splitlines()
for line in lines:
    if "(trials" in line:
        label, us = line.split(": ", 1)[1].split(" 16 layers ")
        best[label.strip()] = float(us.split()[0])
with open(os.path.join(os.environ.get("OUT", "."), "mlp_best.txt"), "w") as f:
    f.write(min(best, key=best.get) + "\n")
