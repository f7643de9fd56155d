"""`deepinfer bench latency` with the decode attention of another copy of
kernels/paged_attention.py (an A/B of a kernel change in one call).

    python3 benchmarks/h200_latency_attn_from.py OLD.py -- <bench latency arguments>
"""
import importlib.util
import sys

import deepinfer_kernels
from deepinfer.cli import main

spec = importlib.util.spec_from_file_location("paged_attention_from", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
deepinfer_kernels.paged_decode_attention = mod.paged_decode_attention  # the triton plugin looks it up here
sys.exit(main(sys.argv[sys.argv.index("--") + 1:]))
