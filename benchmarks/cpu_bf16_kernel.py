"""Times deepinfer's bfloat16 kernel against torch's bfloat16 matmul and the float32 route
(``widened_linear``) on the demo pair's linear shapes, by rows; where the kernel takes AMX's tiles,
also with them off ("no-amx": VDPBF16PS; its time includes two ctypes calls that switch them).

    python benchmarks/cpu_bf16_kernel.py --rows 1,2,4,6,8,16,64,128,256

Prints the median microseconds of each (shape, rows, route); the routes take turns call by call, so
that a machine whose speed drifts slows them alike.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from deepinfer_builtin.devices import cpu_bf16
from deepinfer_builtin.devices.cpu import widened_linear

#: (N, K) of the demo target's qkv, o, gate_up, down and LM head, and the demo draft's LM head
SHAPES = [(640, 384), (384, 384), (2048, 384), (384, 1024), (8192, 384), (8192, 256)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="1,2,4,6,8,16,64,128,256")
    ap.add_argument("--calls", type=int, default=60)
    args = ap.parse_args()
    assert cpu_bf16.unavailable_reason() is None, cpu_bf16.unavailable_reason()
    routes = {"torch": F.linear, "kernel": cpu_bf16.bf16_linear,
              "float32": lambda x, w: widened_linear(x, w, from_rows=1)}
    if cpu_bf16.use_amx():
        routes["no-amx"] = lambda x, w: (cpu_bf16.use_amx(False), cpu_bf16.bf16_linear(x, w), cpu_bf16.use_amx(True))[1]
    print(f"{'N x K':>12} {'rows':>5} " + " ".join(f"{r:>9}" for r in routes) + "   (median us a call)")
    for n, k in SHAPES:
        w = torch.randn(n, k).bfloat16()
        for rows in map(int, args.rows.split(",")):
            x = torch.randn(rows, k).bfloat16()
            times: dict[str, list[float]] = {r: [] for r in routes}
            for i in range(args.calls + 3):
                for name, fn in routes.items():
                    t = time.perf_counter()
                    fn(x, w)
                    if i >= 3:
                        times[name].append(time.perf_counter() - t)
            print(f"{n:>5} x {k:<4} {rows:>5} " + " ".join(f"{statistics.median(v) * 1e6:9.0f}" for v in times.values()))


if __name__ == "__main__":
    main()
