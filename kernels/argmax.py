"""Row-wise argmax of logits [B, V] in one launch spread over the vocabulary.

A plain reduction over a 128K vocabulary runs one block per row, tens of microseconds for a single
row. Here each program takes a chunk of a row and writes its maximum and that maximum's first
index; the row's last program to finish (an atomic counter, which it resets) picks the chunk with
the highest value, the first such chunk on ties: so the result is torch.argmax's, the first index
of the maximum, however the programs ran. NaN is not treated specially (logits have none), and
values are compared in float32 (float64 logits that differ only below that may tie differently).
Small vocabularies (``TORCH_UP_TO``) take torch's argmax itself.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_kernels._launch import counters, kernel, next_pow2


@kernel
def _argmax_kernel(x_ptr, val_ptr, idx_ptr, count_ptr, out_ptr, stride_x, V,
                   CHUNK: tl.constexpr, CHUNKS: tl.constexpr, CHUNKS_P: tl.constexpr):
    row = tl.program_id(0)
    c = tl.program_id(1)
    offs = c * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(x_ptr + row.to(tl.int64) * stride_x + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
    m = tl.max(x, 0)
    first = tl.min(tl.where(x == m, offs, 2147483647), 0)
    tl.store(val_ptr + row * CHUNKS + c, m)
    tl.store(idx_ptr + row * CHUNKS + c, first)
    tl.debug_barrier()  # the chunk's result is stored before the release below
    done = tl.atomic_add(count_ptr + row, 1, sem="acq_rel")
    j = tl.arange(0, CHUNKS_P)
    # the test is broadcast to a vector: the interpreter rejects a scalar in a mask
    last = (tl.zeros([CHUNKS_P], tl.int32) + done) == CHUNKS - 1
    vals = tl.load(val_ptr + row * CHUNKS + j, mask=last & (j < CHUNKS), other=float("-inf"),
                   cache_modifier=".cg")
    idxs = tl.load(idx_ptr + row * CHUNKS + j, mask=last & (j < CHUNKS), other=2147483647, cache_modifier=".cg")
    best = tl.max(vals, 0)
    pick = tl.min(tl.where(vals == best, idxs, 2147483647), 0)
    out = tl.zeros([CHUNKS_P], tl.int64) + pick.to(tl.int64)
    tl.store(out_ptr + row + j, out, mask=last & (j == 0))
    tl.store(count_ptr + row + j, tl.zeros([CHUNKS_P], tl.int32), mask=last & (j == 0))


#: vocabularies up to this size go to torch's argmax unless a chunk is asked for: its one block a
#: row is as quick on the device there, and one launch costs the host far less than this kernel's
#: (which matters in the host-bound steps of small models)
TORCH_UP_TO = 16384


def argmax(logits: torch.Tensor, chunk: int | None = None) -> torch.Tensor:
    """``logits.argmax(-1)`` for logits [B, V] (last dimension contiguous): int64 [B]. ``chunk``:
    entries a program (default 4,096); without it, V up to ``TORCH_UP_TO`` takes torch's argmax."""
    if logits.dim() != 2 or logits.stride(1) != 1:
        raise ValueError(f"argmax takes logits [B, V], contiguous along V; got {tuple(logits.shape)} with "
                         f"strides {logits.stride()}")
    b, v = logits.shape
    if chunk is None and 0 < v <= TORCH_UP_TO:
        return logits.argmax(-1)
    out = torch.empty(b, dtype=torch.int64, device=logits.device)
    if b == 0:
        return out
    if v == 0:
        raise ValueError("argmax of an empty vocabulary")
    chunk = chunk or min(4096, next_pow2(v))
    chunks = triton.cdiv(v, chunk)
    vals = torch.empty(b * chunks, dtype=torch.float32, device=logits.device)
    idxs = torch.empty(b * chunks, dtype=torch.int32, device=logits.device)
    cnt = counters(logits.device, b + next_pow2(chunks), "argmax")
    _argmax_kernel[(b, chunks)](logits, vals, idxs, cnt, out, logits.stride(0), v, CHUNK=chunk, CHUNKS=chunks,
                                CHUNKS_P=next_pow2(chunks), num_warps=4)
    return out


def argmax_ref(logits: torch.Tensor, chunk: int | None = None) -> torch.Tensor:
    """Torch reference of :func:`argmax`."""
    return logits.argmax(-1)
