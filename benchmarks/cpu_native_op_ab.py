"""deepinfer's bfloat16 CPU kernel called through its C++ operator (``cpu_bf16_op.cpp``) against
the call through Python and ctypes (``cpu_bf16.use_native`` switches between them).

    python benchmarks/cpu_native_op_ab.py [--turns 3] [--batch 1] [--drafters none,deepspark]
        [--output-len 256] [--kernel-only]

First the calls alone: the demo target's 33 weights (8 layers' qkv, o, gate_up and down, then the
LM head) at one row, in turn, eagerly through ``bf16_linear`` and compiled (inductor's
``cpp_wrapper``, as the CPU draft's step runs: one function calling the 33 in turn, compiled once
for each way in), each way in two runs of 20 (after 6 untimed), in turns: median ms for the 33
calls. Then the engine: ``deepinfer bench spec --device cpu`` (8 prompts x ``--output-len`` tokens
at each batch, one repeat) in a process of its own for each way in, ``--turns`` times, the ways
alternating in order (a compiled draft keeps the operator it was traced with, so the two do not
share a process): tok/s, and for a drafter verified and accepted drafts a round.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import torch

SHAPES = [(640, 384), (384, 384), (2048, 384), (384, 1024)] * 8 + [(8192, 384)]


def calls_alone(turns: int = 2, calls: int = 20) -> None:
    from deepinfer_builtin import cpu, cpu_bf16
    if cpu_bf16.native_unavailable_reason():
        raise SystemExit(f"the C++ operator does not build here: {cpu_bf16.native_unavailable_reason()}")
    weights = [torch.randn(n, k).bfloat16() for n, k in SHAPES]
    xs = {k: torch.randn(1, k).bfloat16() for k in (384, 1024)}

    def step():  # (every output returned: compiled code would drop calls whose results nothing reads)
        return [cpu.bf16_linear(xs[w.shape[1]], w, kernel_rows=32, from_rows=32) for w in weights]

    compiled = {}
    for native in (True, False):
        cpu_bf16.use_native(native)
        fn = torch.compile(lambda: step(), fullgraph=True, options={"cpp_wrapper": True})
        with torch.inference_mode():
            fn()
        compiled[native] = fn
    print("the demo target's 33 weights at one row, median ms (C++ operator / Python)")
    for label, runs in (("eager", {n: step for n in (True, False)}), ("compiled", compiled)):
        times: dict[bool, list[float]] = {True: [], False: []}
        with torch.inference_mode():
            for turn in range(turns):
                for native in (True, False) if turn % 2 == 0 else (False, True):
                    cpu_bf16.use_native(native)
                    for i in range(calls + 6):
                        t = time.perf_counter()
                        runs[native]()
                        if i >= 6:
                            times[native].append(time.perf_counter() - t)
        cpu_bf16.use_native(True)
        print(f"  {label:8s} {1e3 * statistics.median(times[True]):.3f} / {1e3 * statistics.median(times[False]):.3f}")


def child(native: bool, argv: list[str]) -> int:
    from deepinfer.cli import main as cli
    from deepinfer_builtin.devices import cpu_bf16
    cpu_bf16.use_native(native)
    if native and not cpu_bf16.use_native():
        raise SystemExit(f"the C++ operator does not build here: {cpu_bf16.native_unavailable_reason()}")
    return cli(argv)


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        sys.exit(child(sys.argv[2] == "native", sys.argv[3:]))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--batch", default="1")
    ap.add_argument("--drafters", default="none,deepspark")
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--kernel-only", action="store_true", help="the calls alone")
    a = ap.parse_args()
    calls_alone()
    if a.kernel_only:
        return
    bench = ["bench", "spec", "--device", "cpu", "--batch", a.batch, "--drafters", a.drafters,
             "--output-len", str(a.output_len), "--repeats", "1"]
    rows: dict[tuple[str, str, str], list[list[str]]] = {}
    for turn in range(a.turns):
        for way in ("native", "python") if turn % 2 == 0 else ("python", "native"):
            done = subprocess.run([sys.executable, __file__, "--child", way, *bench], capture_output=True, text=True,
                                  check=False)
            if done.returncode:
                raise SystemExit(f"bench spec ({way}) failed:\n{done.stderr[-2000:]}")
            for line in done.stdout.splitlines():
                cells = line.split()
                if cells and cells[0] in a.drafters.split(",") and len(cells) >= 8:
                    rows.setdefault((cells[0], cells[1], way), []).append(cells)
    print(f"bench spec, {a.turns} turns (one process a run), tok/s by turn; median; verified / accepted")
    for (drafter, batch, way), runs in sorted(rows.items()):
        tok_s = [float(r[3]) for r in runs]
        spec = f"; {statistics.median(float(r[6]) for r in runs):.2f} / {statistics.median(float(r[7]) for r in runs):.2f}" \
            if drafter != "none" else ""
        print(f"  {drafter:10s} batch {batch:3s} {way:7s} " + ", ".join(f"{t:.1f}" for t in tok_s)
              + f"; median {statistics.median(tok_s):.1f}{spec}")


if __name__ == "__main__":
    main()
