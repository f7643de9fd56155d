"""deepinfer's bfloat16 CPU kernel with AMX's tiles against its VDPBF16PS path, where this CPU has
AMX-BF16 (``cpu_bf16.use_amx`` switches between them in one process).

    python benchmarks/cpu_amx_ab.py [--batch 1,64] [--repeats 3] [--drafters none,deepspark] [--kernel-only]
        [--threads 1,2,8]

First the kernel alone: the demo target's 33 weights (8 layers' qkv, o, gate_up and down, then the
LM head) called in turn, as a decode step reads them (each mostly out of the cache by its next
call), at 1, 6, 16 and 32 rows, each path in two runs of 10 (after 6 untimed), in turns: median ms for
the 33 calls (through ``bf16_linear``, its checks included). Then the
engine: bench spec's workload (8 prompts x 256 tokens at batch 1, 64 requests at 64) for each
drafter's engine, the two paths taking turns run by run: tok/s and, for a drafter, tokens a step
and drafts verified and accepted a round. The engines' row limit for the kernel
(``bf16_kernel_rows``) stays the AMX build's default in both, so the paths differ in the kernel alone.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from deepinfer.bench.spec import Workload
from deepinfer.llm import LLM
from deepinfer_builtin.devices import cpu_bf16

SHAPES = [(640, 384), (384, 384), (2048, 384), (384, 1024)] * 8 + [(8192, 384)]


def kernel_steps(rows_list: list[int], calls: int = 20) -> None:
    weights = [torch.randn(n, k).bfloat16() for n, k in SHAPES]
    print("kernel: the demo target's 33 weights in turn, median ms (AMX / VDPBF16PS)")
    for rows in rows_list:
        xs = {k: torch.randn(rows, k).bfloat16() for k in (384, 1024)}
        times: dict[bool, list[float]] = {True: [], False: []}
        for turn in range(2):  # (each path a run of calls: AMX's units wake up slowly after a pause)
            for amx in (True, False) if turn == 0 else (False, True):
                cpu_bf16.use_amx(amx)
                for i in range(calls // 2 + 6):  # (the first 6 warm up: not timed)
                    t = time.perf_counter()
                    for w in weights:
                        cpu_bf16.bf16_linear(xs[w.shape[1]], w)
                    if i >= 6:
                        times[amx].append(time.perf_counter() - t)
        cpu_bf16.use_amx(True)
        print(f"  {rows:3d} rows: {1e3 * statistics.median(times[True]):.3f} / {1e3 * statistics.median(times[False]):.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", default="1,64")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--drafters", default="none,deepspark")
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--kernel-only", action="store_true", help="the kernel's part alone")
    ap.add_argument("--threads", default="", help="the kernel's part at each of these torch thread counts "
                    "(e.g. 1,2,8; default: torch's own)")
    a = ap.parse_args()
    if not cpu_bf16.use_amx():
        raise SystemExit(f"the kernel takes no AMX tiles here (its build: {cpu_bf16.kernel_kind()})")
    for threads in [int(t) for t in a.threads.split(",") if t] or [torch.get_num_threads()]:
        torch.set_num_threads(threads)
        print(f"{threads} threads")
        kernel_steps([1, 6, 16, 32])
    if a.kernel_only:
        return
    llms = {d: LLM(None, progress=False, device="cpu", plugins=[] if d == "none" else [d])
            for d in a.drafters.split(",")}
    work = {"prompts": 8, "input_len": 64, "output_len": a.output_len}
    for batch in map(int, a.batch.split(",")):
        wl = Workload(next(iter(llms.values())), batch, work)
        for llm in llms.values():
            wl.warm_up(llm)
        secs: dict[tuple[str, bool], list[float]] = {}
        counts: dict[tuple[str, bool], dict[str, float]] = {}
        for r in range(a.repeats):
            for amx in (True, False) if r % 2 == 0 else (False, True):
                cpu_bf16.use_amx(amx)
                for name, llm in llms.items():
                    m0 = llm.get_metrics()
                    secs.setdefault((name, amx), []).append(wl.run(llm))
                    m1 = llm.get_metrics()
                    acc = counts.setdefault((name, amx), {})
                    for key in ("deepinfer:spec_decode_num_drafts", "deepinfer:spec_decode_num_verified_tokens",
                                "deepinfer:spec_decode_num_accepted_tokens"):
                        acc[key] = acc.get(key, 0) + m1.get(key, 0) - m0.get(key, 0)
        cpu_bf16.use_amx(True)
        print(f"batch {batch}: {wl.groups * batch} prompts x {a.output_len} tokens, {a.repeats} runs each, in turns")
        for name in llms:
            cells = []
            for amx in (True, False):
                tok_s = wl.tokens * len(secs[name, amx]) / sum(secs[name, amx])
                m = counts[name, amx]
                drafts = m["deepinfer:spec_decode_num_drafts"]
                extra = (f" (verified {m['deepinfer:spec_decode_num_verified_tokens'] / drafts:.2f}, accepted "
                         f"{m['deepinfer:spec_decode_num_accepted_tokens'] / drafts:.2f})") if drafts else ""
                cells.append(f"{'AMX' if amx else 'VDPBF16PS'} {tok_s:.1f} tok/s{extra}")
            print(f"  {name:10s} " + "; ".join(cells))


if __name__ == "__main__":
    main()
