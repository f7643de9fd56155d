"""A CUDA card's ceilings, as docs/benchmarks.md records them: a device-to-device copy (bytes read
and written) and an 8192^3 bf16 matmul on random data, each the mean of ten timed calls after three
warm-ups, five trials each (median and range printed); then what `deepinfer bench` measures for a
card with no recorded entry (deepinfer.bench.ceilings.measure), for comparison.

    python benchmarks/ceilings.py [--copy-gib 1] [--trials 5]
"""
from __future__ import annotations

import argparse
import statistics

import torch

from deepinfer.bench.ceilings import RECORDED, mean_seconds, measure


def mean_ms(fn, calls: int = 10) -> float:
    """Milliseconds one call takes (deepinfer.bench.ceilings.mean_seconds: three warm-ups first)."""
    return mean_seconds(fn, calls, torch.device("cuda")) * 1e3


def copy_tbs(dev: torch.device, nbytes: int) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    return 2 * nbytes / mean_ms(lambda: dst.copy_(src)) / 1e9


def matmul_tflops(dev: torch.device, m: int = 8192) -> float:
    a = torch.randn(m, m, dtype=torch.bfloat16, device=dev)
    b = torch.randn(m, m, dtype=torch.bfloat16, device=dev)
    return 2 * m ** 3 / mean_ms(lambda: torch.mm(a, b)) / 1e9


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--copy-gib", type=float, default=1.0, help="size of the copied buffer")
    ap.add_argument("--trials", type=int, default=5)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/ceilings.py needs a CUDA card")
    dev = torch.device("cuda")
    name = torch.cuda.get_device_name(dev)
    copy = [copy_tbs(dev, int(args.copy_gib * (1 << 30))) for _ in range(args.trials)]
    mm = [matmul_tflops(dev) for _ in range(args.trials)]
    print(f"{name}, torch {torch.__version__}")
    print(f"copy ({args.copy_gib:g} GiB, read + written): median {statistics.median(copy):.3f} TB/s "
          f"(range {min(copy):.3f}-{max(copy):.3f})")
    print(f"bf16 8192^3 matmul, random data: median {statistics.median(mm):.0f} TFLOP/s "
          f"(range {min(mm):.0f}-{max(mm):.0f})")
    got = measure(dev)
    print(f"deepinfer.bench.ceilings.measure: {got.bandwidth / 1e12:.3f} TB/s, {got.bf16_flops / 1e12:.0f} TFLOP/s")
    if name in RECORDED:
        c = RECORDED[name]
        print(f"recorded for {name}: {c.bandwidth / 1e12:.2f} TB/s, {c.bf16_flops / 1e12:.0f} TFLOP/s ({c.source})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
