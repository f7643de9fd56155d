"""Single-token GEMV tiles from a JSON file ({"qkv"|"o"|"gu"|"down": GemvConfig fields}, as
h200_gemv_tiles.py and h200_gemv_fullk.py write them) in place of default_config's, for the
Llama-3.2-1B shape (hidden 2,048, MLP 8,192, 32 + 2 x 8 heads of 64). Other shapes keep theirs."""
import json
import sys

import deepinfer_kernels.gemv  # noqa: F401 (the module, not the function the package exports)

SHAPES = {(1536, 2048, True): "qkv", (2048, 2048, False): "o", (8192, 2048, True): "gu", (2048, 8192, False): "down"}


def use_tiles(path: str) -> None:
    g = sys.modules["deepinfer_kernels.gemv"]
    with open(path) as f:
        best = {k: g.GemvConfig(**v) for k, v in json.load(f).items()}
    original = g.default_config

    def tuned(rows, k, device, paired=False, row_quantum=None, block_n=None):
        kind = SHAPES.get((rows, k, paired))
        if kind in best and block_n is None:
            return best[kind]
        return original(rows, k, device, paired, row_quantum, block_n)

    g.default_config = tuned
