"""`deepinfer bench latency` with the single-token GEMV tiles of a JSON file in place of
default_config's (see gemv_tiles_patch.py).

    python3 benchmarks/h200_latency_with.py BEST.json -- <bench latency arguments>
"""
import sys

from gemv_tiles_patch import use_tiles

from deepinfer.cli import main

use_tiles(sys.argv[1])
sys.exit(main(sys.argv[sys.argv.index("--") + 1:]))
