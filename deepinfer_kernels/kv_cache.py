"""KV-cache write: scatter this step's keys and values into the paged cache.

The cache of one layer is a pair of tensors [num_slots, kv_heads, head_dim] (the torch backend
keeps both in one [2, num_slots, kv_heads, head_dim] tensor; pass ``cache[0]`` and ``cache[1]``).
Token ``t`` goes to slot ``slot_mapping[t]`` (block_id * block_size + offset); a negative slot
means "do not write" (padding, or a token whose KV is already cached).

MLA (DeepSeek) caches one latent row per token instead, [num_slots, 1, D] = [latent | rope key]:
``write_mla_cache``.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_kernels._launch import kernel, next_pow2


@kernel(do_not_specialize=["num_tokens"])
def _write_kv_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr, num_tokens,
                     stride_kt, stride_kh, stride_vt, stride_vh, stride_cs, stride_ch,
                     NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                     BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr):
    if PDL:  # launched early (programmatic dependent launch): wait for the previous kernel first
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)[:, None, None]  # this program's tokens
    slot = tl.load(slot_ptr + t, mask=t < num_tokens, other=-1).to(tl.int64)
    h = tl.arange(0, BLOCK_H)[None, :, None]
    d = tl.arange(0, BLOCK_D)[None, None, :]
    dst = slot * stride_cs + h * stride_ch + d
    mask = (h < NUM_HEADS) & (d < HEAD_DIM) & (slot >= 0)
    k = tl.load(k_ptr + t * stride_kt + h * stride_kh + d, mask=mask)
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    v = tl.load(v_ptr + t * stride_vt + h * stride_vh + d, mask=mask)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def write_kv_cache(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   slot_mapping: torch.Tensor, pdl: bool = False) -> None:
    """Write k, v [T, kv_heads, head_dim] into the caches [num_slots, kv_heads, head_dim] in place.
    ``pdl``: launch with programmatic dependent launch (the kernel waits for the previous one).
    One token a program on a GPU; off one (the interpreter, whose cost is per program and
    operation, not per element) up to 64 a program."""
    t, h, d = k.shape
    if v.shape != k.shape or k_cache.shape[1:] != (h, d) or v_cache.shape != k_cache.shape:
        raise ValueError(f"k {tuple(k.shape)} / v {tuple(v.shape)} do not fit the caches "
                         f"{tuple(k_cache.shape)} / {tuple(v_cache.shape)}; expected [T, {h}, {d}] "
                         f"and [num_slots, {h}, {d}]")
    if slot_mapping.shape != (t,):
        raise ValueError(f"slot_mapping has shape {tuple(slot_mapping.shape)}, expected ({t},)")
    if t == 0:
        return
    if k.stride(-1) != 1 or v.stride(-1) != 1:
        k, v = k.contiguous(), v.contiguous()
    if k_cache.stride(-1) != 1 or k_cache.stride() != v_cache.stride():
        raise ValueError("the key and value caches must share strides, with the last dimension contiguous")
    block_t = 1 if k.device.type == "cuda" else min(next_pow2(t), 64)
    _write_kv_kernel[(triton.cdiv(t, block_t),)](
        k, v, k_cache, v_cache, slot_mapping, t, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1),
        NUM_HEADS=h, HEAD_DIM=d, BLOCK_T=block_t, BLOCK_H=next_pow2(h), BLOCK_D=next_pow2(d), PDL=pdl)


def write_kv_cache_ref(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                       slot_mapping: torch.Tensor, pdl: bool = False) -> None:
    """Torch reference of :func:`write_kv_cache`."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].to(torch.long)
    k_cache.index_copy_(0, slots, k[keep].to(k_cache.dtype))
    v_cache.index_copy_(0, slots, v[keep].to(v_cache.dtype))


@kernel
def _write_mla_kernel(c_ptr, pe_ptr, cache_ptr, slot_ptr, stride_ct, stride_pt, stride_cs,
                      LATENT: tl.constexpr, ROPE: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_R: tl.constexpr):
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    dl = tl.arange(0, BLOCK_L)
    keep_l = ((tl.zeros([BLOCK_L], tl.int64) + slot) >= 0) & (dl < LATENT)  # (no scalar in a mask: see above)
    c = tl.load(c_ptr + t * stride_ct + dl, mask=keep_l)
    tl.store(cache_ptr + slot * stride_cs + dl, c.to(cache_ptr.dtype.element_ty), mask=keep_l)
    if ROPE > 0:
        dr = tl.arange(0, BLOCK_R)
        keep_r = ((tl.zeros([BLOCK_R], tl.int64) + slot) >= 0) & (dr < ROPE)
        pe = tl.load(pe_ptr + t * stride_pt + dr, mask=keep_r)
        tl.store(cache_ptr + slot * stride_cs + LATENT + dr, pe.to(cache_ptr.dtype.element_ty), mask=keep_r)


def write_mla_cache(kv_c: torch.Tensor, k_pe: torch.Tensor | None, kv_cache: torch.Tensor,
                    slot_mapping: torch.Tensor) -> None:
    """Write MLA's latent rows into the cache [num_slots, 1, D] in place: row t = [kv_c[t] | k_pe[t]]
    goes to slot ``slot_mapping[t]`` (negative: skipped). kv_c [T, value_dim] and k_pe [T, D - value_dim]
    (each may be [T, 1, width], and a strided view of a fused projection); with k_pe None, kv_c is
    the whole row [T, D]."""
    if kv_c.dim() == 3 and kv_c.shape[1] == 1:
        kv_c = kv_c[:, 0]
    if k_pe is not None and k_pe.dim() == 3 and k_pe.shape[1] == 1:
        k_pe = k_pe[:, 0]
    t, latent = kv_c.shape if kv_c.dim() == 2 else (-1, -1)
    rope = 0 if k_pe is None else k_pe.shape[-1]
    if latent < 0 or (k_pe is not None and k_pe.shape != (t, rope)) or kv_cache.dim() != 3 \
            or kv_cache.shape[1:] != (1, latent + rope):
        raise ValueError(f"kv_c {tuple(kv_c.shape)} and k_pe {None if k_pe is None else tuple(k_pe.shape)} do not "
                         f"fit the cache {tuple(kv_cache.shape)}; expected [T, value_dim] and [T, rope_dim] (or one "
                         "[T, D] row) and a cache [num_slots, 1, value_dim + rope_dim]")
    if slot_mapping.shape != (t,):
        raise ValueError(f"slot_mapping has shape {tuple(slot_mapping.shape)}, expected ({t},)")
    if t == 0:
        return
    if kv_c.stride(-1) != 1:
        kv_c = kv_c.contiguous()
    if k_pe is not None and k_pe.stride(-1) != 1:
        k_pe = k_pe.contiguous()
    if kv_cache.stride(-1) != 1:
        raise ValueError("kv_cache must be contiguous in its last dimension")
    pe = kv_c if k_pe is None else k_pe
    _write_mla_kernel[(t,)](kv_c, pe, kv_cache, slot_mapping, kv_c.stride(0), pe.stride(0), kv_cache.stride(0),
                            LATENT=latent, ROPE=rope, BLOCK_L=next_pow2(latent), BLOCK_R=next_pow2(rope))


def write_mla_cache_ref(kv_c: torch.Tensor, k_pe: torch.Tensor | None, kv_cache: torch.Tensor,
                        slot_mapping: torch.Tensor) -> None:
    """Torch reference of :func:`write_mla_cache`."""
    row = kv_c.reshape(kv_c.shape[0], -1) if k_pe is None else \
        torch.cat([kv_c.reshape(kv_c.shape[0], -1), k_pe.reshape(k_pe.shape[0], -1)], -1)
    keep = slot_mapping >= 0
    kv_cache.index_copy_(0, slot_mapping[keep].to(torch.long), row[keep, None].to(kv_cache.dtype))
