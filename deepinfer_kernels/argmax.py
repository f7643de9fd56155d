"""Row-wise argmax of logits [B, V] in one launch spread over the vocabulary.

A plain reduction over a 128K vocabulary runs one block per row, tens of microseconds for a single
row. Here each program takes a chunk of a row and writes its maximum and that maximum's first
index; the row's last program to finish (an atomic counter, which it resets) picks the chunk with
the highest value, the first such chunk on ties: so the result is torch.argmax's, the first index
of the maximum, however the programs ran. NaN is not treated specially (logits have none), and
values are compared in float32 (float64 logits that differ only below that may tie differently).
Small vocabularies (``TORCH_UP_TO``) take torch's argmax itself.

``argmax_prob`` also gives the maximum's softmax probability (what a draft model's greedy step
reports as its confidence), in the same launch: each chunk adds up ``exp(x - m)`` over its entries
beside its maximum ``m``, and the last program rescales the chunks' sums to the row's maximum
``M``: the probability is ``1 / sum_c(s_c * exp(m_c - M))``. One launch instead of a float32 copy
of the logits, a softmax and a max.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_kernels._launch import counters, kernel, next_pow2


@kernel
def _argmax_kernel(x_ptr, val_ptr, idx_ptr, sum_ptr, count_ptr, out_ptr, prob_ptr, stride_x, V,
                   CHUNK: tl.constexpr, CHUNKS: tl.constexpr, CHUNKS_P: tl.constexpr, PROB: tl.constexpr,
                   PDL: tl.constexpr):
    row = tl.program_id(0)
    c = tl.program_id(1)
    if PDL:
        tl.extra.cuda.gdc_wait()  # the logits (and the counters' reset) are the previous kernels'
        tl.extra.cuda.gdc_launch_dependents()
    offs = c * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(x_ptr + row.to(tl.int64) * stride_x + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
    m = tl.max(x, 0)
    first = tl.min(tl.where(x == m, offs, 2147483647), 0)
    tl.store(val_ptr + row * CHUNKS + c, m)
    tl.store(idx_ptr + row * CHUNKS + c, first)
    if PROB:  # the chunk's softmax denominator relative to its own maximum
        tl.store(sum_ptr + row * CHUNKS + c, tl.sum(tl.exp(x - m), 0))
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
    if PROB:
        sums = tl.load(sum_ptr + row * CHUNKS + j, mask=last & (j < CHUNKS), other=0.0, cache_modifier=".cg")
        # (programs other than the last hold -inf everywhere: kept finite, their result unused;
        # in the last, the maximum's own entry makes the total at least 1)
        total = tl.sum(tl.where(j < CHUNKS, sums * tl.exp(vals - tl.maximum(best, -3.0e38)), 0.0), 0)
        prob = tl.zeros([CHUNKS_P], tl.float32) + 1.0 / tl.maximum(total, 1.0)
        tl.store(prob_ptr + row + j, prob, mask=last & (j == 0))
    tl.store(count_ptr + row + j, tl.zeros([CHUNKS_P], tl.int32), mask=last & (j == 0))


#: vocabularies up to this size go to torch's argmax unless a chunk is asked for: its one block a
#: row is as quick on the device there, and one launch costs the host far less than this kernel's
#: (which matters in the host-bound steps of small models)
TORCH_UP_TO = 16384


def argmax(logits: torch.Tensor, chunk: int | None = None, out: torch.Tensor | None = None,
           pdl: bool = False) -> torch.Tensor:
    """``logits.argmax(-1)`` for logits [B, V] (last dimension contiguous): int64 [B], written into
    ``out`` when given. ``chunk``: entries a program (default 4,096); without it, V up to
    ``TORCH_UP_TO`` takes torch's argmax. ``pdl``: launch the kernel with programmatic dependent
    launch (``pdl_supported``)."""
    _check(logits)
    if out is not None and (out.shape != logits.shape[:1] or out.dtype != torch.int64 or out.device != logits.device
                            or not out.is_contiguous()):
        raise ValueError(f"argmax: out must be a contiguous int64 [{logits.shape[0]}] on {logits.device}; got "
                         f"{out.dtype} {tuple(out.shape)} on {out.device}")
    if chunk is None and 0 < logits.shape[1] <= TORCH_UP_TO:
        return logits.argmax(-1) if out is None else torch.argmax(logits, -1, out=out)
    return _launch(logits, chunk, False, out, pdl)[1]


def argmax_prob(logits: torch.Tensor, chunk: int | None = None,
                pdl: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``logits.float().softmax(-1).max(-1)`` in one launch, as (probability float32 [B], index
    int64 [B]); the index is the first of the maximum, as :func:`argmax`'s. Any vocabulary size
    takes the kernel (this replaces three or four launches, not one). ``pdl`` as in :func:`argmax`."""
    _check(logits)
    return _launch(logits, chunk, True, pdl=pdl)


def _check(logits: torch.Tensor) -> None:
    if logits.dim() != 2 or logits.stride(1) != 1:
        raise ValueError(f"argmax takes logits [B, V], contiguous along V; got {tuple(logits.shape)} with "
                         f"strides {logits.stride()}")
    if logits.shape[0] and not logits.shape[1]:
        raise ValueError("argmax of an empty vocabulary")


def _launch(logits: torch.Tensor, chunk: int | None, prob: bool,
            out: torch.Tensor | None = None, pdl: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    b, v = logits.shape
    if out is None:
        out = torch.empty(b, dtype=torch.int64, device=logits.device)
    probs = torch.empty(b if prob else 0, dtype=torch.float32, device=logits.device)
    if b == 0:
        return probs, out
    chunk = chunk or min(4096, next_pow2(v))
    chunks = triton.cdiv(v, chunk)
    vals = torch.empty(b * chunks, dtype=torch.float32, device=logits.device)
    idxs = torch.empty(b * chunks, dtype=torch.int32, device=logits.device)
    sums = torch.empty(b * chunks if prob else 1, dtype=torch.float32, device=logits.device)
    cnt = counters(logits.device, b + next_pow2(chunks), "argmax")
    _argmax_kernel[(b, chunks)](logits, vals, idxs, sums, cnt, out, probs if prob else vals, logits.stride(0), v,
                                CHUNK=chunk, CHUNKS=chunks, CHUNKS_P=next_pow2(chunks), PROB=prob, PDL=pdl, num_warps=4)
    return probs, out


def argmax_ref(logits: torch.Tensor, chunk: int | None = None, out: torch.Tensor | None = None,
               pdl: bool = False) -> torch.Tensor:
    """Torch reference of :func:`argmax`."""
    return logits.argmax(-1) if out is None else torch.argmax(logits, -1, out=out)


def argmax_prob_ref(logits: torch.Tensor, chunk: int | None = None,
                    pdl: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch reference of :func:`argmax_prob`."""
    return logits.float().softmax(-1).max(-1)
