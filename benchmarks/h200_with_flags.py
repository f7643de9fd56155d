"""Run a command with module flags of deepinfer_kernels._launch set (e.g. EARLY_TRIGGER=1):

    python3 benchmarks/h200_with_flags.py EARLY_TRIGGER=1 -- bench latency ...   (the deepinfer CLI)
    python3 benchmarks/h200_with_flags.py EARLY_TRIGGER=1 -- script.py args ...  (a Python script)
"""
import runpy
import sys

from deepinfer.cli import main
from deepinfer_kernels import _launch

split = sys.argv.index("--")
for item in sys.argv[1:split]:
    name, value = item.split("=", 1)
    if not hasattr(_launch, name):
        sys.exit(f"deepinfer_kernels._launch has no flag {name}")
    setattr(_launch, name, bool(int(value)))
rest = sys.argv[split + 1:]
if rest and rest[0].endswith(".py"):
    sys.argv = rest
    runpy.run_path(rest[0], run_name="__main__")
else:
    sys.exit(main(rest))
