"""The fused q | k | v projection of one token (the GEMV kernel of deepinfer_kernels.gemv in its
rotary mode), optionally writing the key and value into the paged cache and attending."""
from __future__ import annotations

from typing import NamedTuple

import torch

from deepinfer_kernels._launch import counters
from deepinfer_kernels.gemv import _ROTARY, GemvConfig, _check, _launch, default_config


class QkvAttention(NamedTuple):
    """Decode attention folded into :func:`gemv_qkv_rotary` (with ``kv_cache``): a kv head's
    programs run together (its q heads' rows, then its k's and v's), and the last of them to finish
    attends for the kv head's q heads over the paged cache, new token included, in one pass of
    online softmax (no splits: so a sequence's bits are not those of :func:`paged_decode_attention`).
    Other kv heads' projections go on meanwhile, so only the last kv head's attention adds to the
    kernel's time. For one short sequence (a batch-1 decode step) this saves the attention
    kernel's launch; a long sequence is read by a single program per kv head.

    ``block_tables`` [1, max_blocks] int32 and ``seq_lens`` [1] int32 as for the decode kernel;
    ``block_n`` keys a tile (None: 64); ``num_stages``: tiles loaded ahead in the key loop."""

    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    block_size: int
    scale: float
    sliding_window: int | None = None
    block_n: int | None = None
    num_stages: int = 3



def gemv_qkv_rotary(x: torch.Tensor, weight: torch.Tensor, norm_weight: torch.Tensor, eps: float,
                    cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor, num_heads: int,
                    num_kv_heads: int, q_norm: torch.Tensor | None = None, k_norm: torch.Tensor | None = None,
                    qk_eps: float = 1e-6, config: GemvConfig | None = None, pdl: bool = False,
                    kv_cache: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
                    attention: QkvAttention | None = None) -> torch.Tensor:
    """The fused q | k | v projection of one token: ``rotary(qk_norm(rms_norm(x) @ weight.T))``.

    weight [(H + 2 * KV) * D, K]; cos/sin tables [max_positions, D]; positions [1]. ``q_norm`` and
    ``k_norm`` [D] (Qwen3) normalise each q and k head first. Returns qkv [1, (H + 2 * KV) * D].
    ``kv_cache`` (k_cache, v_cache, slot): also write the token's key and value into the paged
    caches [num_slots, KV, D] at slot [1] (a negative slot: not written), as write_kv_cache
    would. ``attention`` (with ``kv_cache``): also attend (see :class:`QkvAttention`) and return
    the attention output [1, H, D] instead. ``pdl`` as in :func:`gemv`.
    """
    _check(x, weight, "gemv_qkv_rotary")
    d = cos.shape[-1] if cos.dim() == 2 else 0
    heads = num_heads + 2 * num_kv_heads
    if d == 0 or d % 2 or weight.shape[0] != heads * d or sin.shape != cos.shape or cos.stride(1) != 1:
        raise ValueError(f"gemv_qkv_rotary: weight {tuple(weight.shape)} must have (H + 2 KV) * D = "
                         f"{heads} * D rows, with cos/sin contiguous tables [max_positions, D]; got cos "
                         f"{tuple(cos.shape)}")
    if positions.shape != (1,) or norm_weight.shape != (x.shape[1],):
        raise ValueError(f"gemv_qkv_rotary takes one position and norm_weight [{x.shape[1]}]; got positions "
                         f"{tuple(positions.shape)}, norm_weight {tuple(norm_weight.shape)}")
    if (q_norm is None) != (k_norm is None) or (q_norm is not None and (q_norm.shape != (d,) or k_norm.shape != (d,))):
        raise ValueError(f"q_norm and k_norm must both be given, as weights [{d}], or both be None")
    half = d // 2
    if q_norm is not None and half & (half - 1):
        raise ValueError(f"gemv_qkv_rotary with q/k norm needs a power-of-two half head; head_dim is {d}")
    if config is None:  # the q/k norm needs whole heads in a program
        config = default_config(weight.shape[0] // 2, x.shape[1], x.device, paired=True, row_quantum=half,
                                block_n=half if q_norm is not None else None)
    cfg = config
    if q_norm is not None and cfg.block_n != half:
        raise ValueError(f"gemv_qkv_rotary with q/k norm takes whole heads: block_n must be {half}, not "
                         f"{cfg.block_n}")
    if half % cfg.block_n:
        raise ValueError(f"gemv_qkv_rotary: block_n {cfg.block_n} must divide the half head {half}")
    if kv_cache is not None:
        kc, vc, slot = kv_cache
        if kc.dim() != 3 or kc.shape[1:] != (num_kv_heads, d) or vc.shape != kc.shape or kc.stride(-1) != 1 \
                or vc.stride() != kc.stride() or vc.dtype != kc.dtype or not kc.dtype.is_floating_point \
                or slot.shape != (1,) or slot.dtype not in (torch.int32, torch.int64) \
                or {kc.device, vc.device, slot.device} != {x.device}:
            raise ValueError(f"gemv_qkv_rotary: kv_cache takes float caches [num_slots, {num_kv_heads}, {d}] of one "
                             f"dtype with equal strides and an int32/int64 slot [1], all on {x.device}; got "
                             f"{kc.dtype} {tuple(kc.shape)} on {kc.device} / {vc.dtype} {tuple(vc.shape)}, slot "
                             f"{slot.dtype} {tuple(slot.shape)} on {slot.device}")
    out = torch.empty(1, weight.shape[0], dtype=x.dtype, device=x.device)
    attend = None
    if attention is not None:
        attend = _attention_args(attention, kv_cache, num_heads, num_kv_heads, d, x)
    rotary = (cos, sin, positions, q_norm, k_norm, qk_eps, half, (num_heads + num_kv_heads) * d, num_heads * d)
    _launch(x, weight, out, weight.shape[0] // 2, cfg, _ROTARY, half, norm_weight=norm_weight, eps=eps,
            rotary=rotary, kv_write=kv_cache, attend=attend, pdl=pdl)
    return out if attend is None else attend[0]


def _attention_args(at: QkvAttention, kv_cache, num_heads: int, num_kv_heads: int, d: int, x: torch.Tensor):
    """What the kernel's attention needs: (output, the arguments, counters, group, keys a tile)."""
    if kv_cache is None:
        raise ValueError("gemv_qkv_rotary: attention needs kv_cache (it attends over the cache the token is written to)")
    if num_heads % num_kv_heads:
        raise ValueError(f"gemv_qkv_rotary: attention needs the {num_heads} q heads in groups of the "
                         f"{num_kv_heads} kv heads")
    tables, lens = at.block_tables, at.seq_lens
    if tables.dim() != 2 or tables.shape[0] != 1 or tables.dtype != torch.int32 or tables.stride(-1) != 1 \
            or lens.shape != (1,) or lens.dtype != torch.int32 or {tables.device, lens.device} != {x.device}:
        raise ValueError(f"gemv_qkv_rotary: attention takes int32 block_tables [1, max_blocks] (contiguous rows) "
                         f"and seq_lens [1] on {x.device}; got {tables.dtype} {tuple(tables.shape)} on "
                         f"{tables.device}, {lens.dtype} {tuple(lens.shape)} on {lens.device}")
    block_n = at.block_n or 64
    if block_n < 16 or block_n & (block_n - 1) or at.block_size < 1 or at.num_stages < 1:
        raise ValueError(f"gemv_qkv_rotary: attention needs block_n a power of two of at least 16, a positive "
                         f"block_size and num_stages; got {block_n}, {at.block_size}, {at.num_stages}")
    if at.sliding_window is not None and at.sliding_window < 1:
        raise ValueError(f"gemv_qkv_rotary: sliding_window must be positive or None; got {at.sliding_window}")
    out = torch.empty(1, num_heads, d, dtype=x.dtype, device=x.device)
    return out, at, counters(x.device, num_kv_heads, "qkv_attention"), num_heads // num_kv_heads, block_n
