"""`deepinfer bench latency` with the decode attention of another copy of
kernels/paged_attention.py (an A/B of a kernel change in one call); kept for session 14's recorded
commands, the same as ``h200_latency_variant.py --attention OLD.py -- ...``.

    python3 benchmarks/h200_latency_attn_from.py OLD.py -- <bench latency arguments>
"""
import runpy
import sys
from pathlib import Path

sys.argv = [sys.argv[0], "--attention", *sys.argv[1:]]
runpy.run_path(str(Path(__file__).with_name("h200_latency_variant.py")), run_name="__main__")
