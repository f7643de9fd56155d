"""Token embedding: each token's row of the table, copied in one launch.

torch's embedding does the same copy, but a kernel of this package can be launched with
programmatic dependent launch: in a replayed decode step of one sequence it then starts while the
step's first kernel (which stages the token ids) finishes, and lets the first layer's qkv GEMV
start reading its weights while the row is copied.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_kernels._launch import kernel, next_pow2


@kernel
def _embedding_kernel(ids_ptr, w_ptr, out_ptr, stride_w, vocab, H, BLOCK: tl.constexpr, PDL: tl.constexpr):
    t = tl.program_id(0)
    c = tl.program_id(1)
    if PDL:
        tl.extra.cuda.gdc_wait()  # the ids are the previous kernel's
        tl.extra.cuda.gdc_launch_dependents()
    offs = c * BLOCK + tl.arange(0, BLOCK)
    tok = tl.load(ids_ptr + t).to(tl.int64)
    # (the engine admits only ids of the vocabulary; one outside it reads nothing and gives zeros)
    inside = (offs < H) & (tl.zeros([BLOCK], tl.int64) + tok >= 0) & (tl.zeros([BLOCK], tl.int64) + tok < vocab)
    row = tl.load(w_ptr + tok * stride_w + offs, mask=inside, other=0.0)
    tl.store(out_ptr + t.to(tl.int64) * H + offs, row, mask=offs < H)


def embedding(ids: torch.Tensor, weight: torch.Tensor, pdl: bool = False) -> torch.Tensor:
    """``weight[ids]`` for 1-D integer ids and a table [V, H] (rows contiguous): [len(ids), H] of
    the table's dtype. ``pdl``: launch with programmatic dependent launch (``pdl_supported``)."""
    if ids.dim() != 1 or ids.dtype not in (torch.int32, torch.int64) or weight.dim() != 2 \
            or weight.stride(1) != 1 or ids.device != weight.device:
        raise ValueError(f"embedding takes 1-D int32/int64 ids and a table [V, H] contiguous along H, on one device; "
                         f"got ids {ids.dtype} {tuple(ids.shape)} on {ids.device}, table {tuple(weight.shape)} with "
                         f"strides {weight.stride()} on {weight.device}")
    h = weight.shape[1]
    ids = ids.contiguous()  # the kernel reads id t at t
    out = torch.empty(ids.shape[0], h, dtype=weight.dtype, device=weight.device)
    if ids.numel() and h:
        block = min(4096, next_pow2(h))
        _embedding_kernel[(ids.shape[0], triton.cdiv(h, block))](ids, weight, out, weight.stride(0), weight.shape[0],
                                                                h, BLOCK=block, PDL=pdl, num_warps=4)
    return out


def embedding_ref(ids: torch.Tensor, weight: torch.Tensor, pdl: bool = False) -> torch.Tensor:
    """Torch reference of :func:`embedding`."""
    return torch.nn.functional.embedding(ids, weight)
