"""How fast this host runs Python and small torch calls: the figures that bound batch-1 decode
where a step's host work is longer than its device work. Prints the median of 5 timings of each:
a pure-Python loop of 10^6 additions, and 10^4 small CPU tensor additions (torch's dispatch)."""
from __future__ import annotations

import statistics
import time

import torch


def _python_loop() -> None:
    total = 0
    for i in range(1_000_000):
        total += i


def _torch_calls() -> None:
    a = torch.zeros(8)
    for _ in range(10_000):
        a = a + 1


def main() -> None:
    for name, fn in (("python loop 1e6", _python_loop), ("torch add x 1e4", _torch_calls)):
        times = []
        for _ in range(5):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        print(f"{name}: {statistics.median(times) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
