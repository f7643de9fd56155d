"""What a kernel launch costs the host on the H200 by what is queued ahead of it (session 34: the
verification's final norm and LM head took 131 and 82 us of host time a call, launched right
behind the verification graph's replay). The demo target's final norm (Triton) and LM head
(cuBLAS) on 6 rows, launched (a) on an idle device, (b) behind torch.cuda._sleep, (c) right behind
the replay of a captured graph of N small kernels (N = 20, 100, 300). Medians of 200 launches each,
host microseconds.

    python3 benchmarks/h200_launch_behind.py
"""
from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

from deepinfer.llm import LLM


def main() -> None:
    llm = LLM(None, progress=False, device="sm90", kv_cache_memory_gb=2)
    model = llm.engine.runner.model
    norm, w = model.model.norm, model.model.embed_tokens.weight
    h = torch.randn(6, w.shape[1], device="cuda", dtype=w.dtype)
    clock = time.perf_counter

    def launches(before) -> tuple[float, float]:
        ns, ls = [], []
        for _ in range(200):
            torch.cuda.synchronize()
            before()
            t0 = clock()
            x = norm(h)
            t1 = clock()
            F.linear(x, w)
            t2 = clock()
            ns.append((t1 - t0) * 1e6)
            ls.append((t2 - t1) * 1e6)
        torch.cuda.synchronize()
        return statistics.median(ns), statistics.median(ls)

    graphs = {}
    for n in (20, 100, 300):
        buf = torch.zeros(1024, device="cuda")
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            buf.add_(1)
            with torch.cuda.graph(g, stream=s):
                for _ in range(n):
                    buf.add_(1)
        torch.cuda.current_stream().wait_stream(s)
        graphs[n] = (g, buf)
    cases = {"idle": lambda: None, "behind _sleep(2e6 cycles)": lambda: torch.cuda._sleep(2_000_000)}
    for n, (g, _) in graphs.items():
        cases[f"behind a graph of {n} kernels"] = g.replay
        cases[f"behind _sleep + graph of {n}"] = lambda g=g: (torch.cuda._sleep(2_000_000), g.replay())
    for name, before in cases.items():
        launches(before)  # warm
        nm, lm = launches(before)
        print(f"{name:34s} norm {nm:7.1f} us  linear {lm:7.1f} us", flush=True)


if __name__ == "__main__":
    main()
