"""`deepinfer bench latency` with parts of this session's batch-1 changes undone (an A/B in one
call): ``--attention FILE`` takes decode attention from another copy of
kernels/paged_attention.py; ``--no-stage`` turns off replays that read their inputs from host
memory (each step then copies them to the device before its replay). Flags removed with the
changes they undid: ``--mlp BI,BK,BN,R,W`` (session 18's call b: the single-token MLP kernel's
tile, at bc1fed5) and ``--no-qkv-embed`` (session 17's call c: the embedding in its own kernel,
at e00a496).

    python3 benchmarks/h200_latency_variant.py [--attention OLD.py] [--no-stage] -- <bench latency arguments>
"""
import importlib.util
import sys

import deepinfer_kernels
import deepinfer_kernels.placeholders
from deepinfer.cli import main

ours = sys.argv[1:sys.argv.index("--")]
if "--attention" in ours:
    spec = importlib.util.spec_from_file_location("paged_attention_from", ours[ours.index("--attention") + 1])
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    deepinfer_kernels.paged_decode_attention = mod.paged_decode_attention  # the triton plugin looks it up here
if "--no-stage" in ours:
    deepinfer_kernels.placeholders.STAGE_MAX_BYTES = 0  # FusedOps reads it when the device makes them
sys.exit(main(sys.argv[sys.argv.index("--") + 1:]))
