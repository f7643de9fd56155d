"""`deepinfer bench latency` with the single-token GEMV tiles of a JSON file (h200_gemv_tiles.py's
gemv_best.json: {"qkv"|"o"|"gu"|"down": GemvConfig fields}) in place of default_config's, for the
Llama-3.2-1B shape (hidden 2048, MLP 8192, 32 + 2 x 8 heads of 64).

    python3 benchmarks/h200_latency_with.py BEST.json -- <bench latency arguments>
"""
import json
import sys

import deepinfer_kernels.gemv  # noqa: F401 (the module, not the function the package exports)
from deepinfer.cli import main

g = sys.modules["deepinfer_kernels.gemv"]

with open(sys.argv[1]) as f:
    best = {k: g.GemvConfig(**v) for k, v in json.load(f).items()}
shapes = {(1536, 2048, True): "qkv", (2048, 2048, False): "o", (8192, 2048, True): "gu", (2048, 8192, False): "down"}
original = g.default_config


def tuned(rows, k, device, paired=False, row_quantum=None, block_n=None):
    kind = shapes.get((rows, k, paired))
    return best[kind] if kind in best and block_n is None else original(rows, k, device, paired, row_quantum, block_n)


g.default_config = tuned
sys.exit(main(sys.argv[sys.argv.index("--") + 1:]))
