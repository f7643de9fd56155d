"""H200: what a kernel boundary costs by itself. Chains of 80 launches (a batch-1 decode step's 64
GEMVs and 16 attention kernels) of a kernel that does almost nothing (each program waits for the
previous kernel, reads one value its predecessor wrote and writes one), in one CUDA graph, with
and without programmatic dependent launch, for several grid sizes. Writes $OUT/kernel_floor.txt."""
import os

import torch
import triton.language as tl
from graph_timing import graph_time

from deepinfer_kernels._launch import kernel


@kernel
def _step_kernel(x_ptr, y_ptr, PDL: tl.constexpr):
    i = tl.program_id(0)
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    tl.store(y_ptr + i, tl.load(x_ptr + i) + 1.0)


out_dir = os.environ.get("OUT", ".")
dev = torch.device("cuda")
lines = ["80 chained launches of a kernel that reads and writes one float a program, one graph: us a launch"]
for grid in (132, 512, 1024, 4096):
    bufs = [torch.zeros(grid, device=dev) for _ in range(2)]
    for pdl in (False, True):
        def chain(pdl=pdl, grid=grid, bufs=bufs):
            for j in range(80):
                _step_kernel[(grid,)](bufs[j % 2], bufs[(j + 1) % 2], PDL=pdl)
        t = graph_time(chain) / 80
        lines.append(f"  grid {grid:5d}  PDL {pdl!s:5s}  {t:6.2f} us")
        print(lines[-1], flush=True)
with open(f"{out_dir}/kernel_floor.txt", "w") as f:
    f.write("\n".join(lines) + "\n")
