"""CPU stand-ins for the torch-npu ops the ascend plugins call, in plain torch, from the ops' docs.

Each stand-in accepts only the keywords the documented signature has (a misspelt keyword is a
TypeError, as it would be in torch-npu), checks the documented argument constraints the plugin
must satisfy (shapes, dtypes, layouts, sequence-length lists, block tables, masks) and computes
the documented result. They live in the tests only; nothing in deepinfer imports them.

Documentation followed (see also deepinfer_builtin.devices.ascend.ops.DOCUMENTED_AT):
- npu_fused_infer_attention_score: Ascend Extension for PyTorch 7.0.0 API reference
  (ptaoplist_001232) and Ascend/op-plugin docs/context/torch_npu-npu_fused_infer_attention_score.md:
  TND needs actual_seq_lengths as cumulative query ends; page attention needs block_table (int32,
  [B, >= maxBlockNumPerSeq]), actual_seq_lengths_kv per sequence and key/value as
  (blocknum, blocksize, H); atten_mask True means "not computed"; when Q_S is 1, sparse_mode and
  pre/next_tokens are ignored; sparse modes 3 and 4 take the 2048x2048 compressed lower-triangular
  mask and are aligned at the lower-right corner (hicann/ops-transformer sparse_mode_introduction.md);
  the band keeps keys j with -pre_tokens <= j - i <= next_tokens (torch-npu's own test builds it as
  triu(k=next_tokens + 1) + tril(k=-pre_tokens - 1)).
- npu_scatter_pa_kv_cache: op-plugin docs/context/torch_npu-npu_scatter_pa_kv_cache.md, scenario 2.
- _npu_reshape_and_cache: op-plugin's ATB schema (int32 slot_indices; caches [blocks, bs, N, D]).
- npu_rms_norm / npu_add_rms_norm: torch-npu 7.0.0 (y = x * rsqrt(mean(x^2) + eps) * gamma, float32
  statistics; rstd; the add variant also returns x1 + x2).
- npu_rotary_mul: op-plugin docs/context/torch_npu-npu_rotary_mul.md, half mode.

Deliberate relaxations, so tiny float32 CPU models can drive them: dtypes (the real attention
kernel takes float16/bfloat16 only), block sizes (the real paged mode takes multiples of 128 up to
512) and head_dim (TND takes 64, 128 or 192) are not checked here; the plugin checks those itself
against the real kernels' limits (deepinfer_builtin.devices.ascend.ops.TORCH_NPU_LIMITS).
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import torch

NO_LIMIT = 2147483647
MASK_DTYPES = (torch.bool, torch.int8, torch.uint8)


class DocViolation(AssertionError):
    """An argument breaks the op's documented constraints."""


def _need(cond: bool, what: str) -> None:
    if not cond:
        raise DocViolation(what)


def _compressed_causal(mask: torch.Tensor) -> None:
    _need(mask.dtype in MASK_DTYPES, f"atten_mask dtype {mask.dtype} is not bool/int8/uint8")
    m = mask.reshape(mask.shape[-2], mask.shape[-1])
    _need(mask.dim() <= 4 and mask.numel() == 2048 * 2048 and tuple(m.shape) == (2048, 2048),
          f"sparse modes 2-4 take the optimised 2048x2048 mask, got shape {tuple(mask.shape)}")
    expected = torch.triu(torch.ones(2048, 2048, dtype=torch.bool), 1)
    _need(torch.equal(m.bool().cpu(), expected), "the compressed mask must be the lower-triangular one")


def _gather_kv(cache: torch.Tensor, table_row: torch.Tensor, kv_len: int, kv_heads: int) -> torch.Tensor:
    block_size = cache.shape[1]
    blocks = table_row[: math.ceil(kv_len / block_size)].long()
    return cache[blocks].reshape(-1, kv_heads, cache.shape[2] // kv_heads)[:kv_len]


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor, scale: float) -> torch.Tensor:
    """q [Sq, N, D], k/v [Skv, KVN, D], keep [Sq, Skv] -> [Sq, N, D] (query head h uses kv head h // G)."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1).float()
    v = v.repeat_interleave(group, dim=1).float()
    scores = torch.einsum("qnd,knd->nqk", q.float(), k) * scale
    scores = scores.masked_fill(~keep[None], float("-inf"))
    return torch.einsum("nqk,knd->qnd", scores.softmax(-1), v).to(q.dtype)


def npu_fused_infer_attention_score(query, key, value, *, pse_shift=None, atten_mask=None, actual_seq_lengths=None,
                                    actual_seq_lengths_kv=None, block_table=None, num_heads=1, scale=1.0,
                                    pre_tokens=NO_LIMIT, next_tokens=NO_LIMIT, input_layout="BSH",
                                    num_key_value_heads=0, sparse_mode=0, inner_precise=0, block_size=0,
                                    softmax_lse_flag=False):
    _need(pse_shift is None and not softmax_lse_flag, "the stand-in covers no pse_shift / softmax_lse")
    _need(query.is_contiguous(), "query must be contiguous")
    kv_heads = num_key_value_heads or num_heads
    _need(num_heads % kv_heads == 0 and num_heads // kv_heads <= 64, "num_heads must be a multiple of "
          "num_key_value_heads, at most 64 times it")
    # page attention: key/value (blocknum, blocksize, H), block_table int32 [B, >= maxBlockNumPerSeq]
    _need(block_table is not None, "the stand-in covers page attention only (block_table given)")
    _need(key.dim() == 3 and key.shape == value.shape, f"paged key/value must be (blocknum, blocksize, H), "
          f"the same for both; got {tuple(key.shape)} and {tuple(value.shape)}")
    _need(block_size == key.shape[1], f"block_size {block_size} differs from the cache's {key.shape[1]}")
    _need(block_table.dtype == torch.int32 and block_table.dim() == 2, "block_table must be 2-D int32")
    _need(isinstance(actual_seq_lengths_kv, (list, tuple)) and all(isinstance(n, int) for n in actual_seq_lengths_kv),
          "page attention needs actual_seq_lengths_kv as a list of ints")
    batch = block_table.shape[0]
    _need(len(actual_seq_lengths_kv) == batch, "actual_seq_lengths_kv needs one length per sequence")
    _need(max(actual_seq_lengths_kv) <= block_table.shape[1] * block_size,
          "block_table's second dimension is shorter than maxBlockNumPerSeq")
    if input_layout == "TND":
        return _tnd(query, key, value, atten_mask, actual_seq_lengths, actual_seq_lengths_kv, block_table,
                    num_heads, kv_heads, scale, pre_tokens, next_tokens, sparse_mode)
    _need(input_layout == "BSH", f"the stand-in covers TND and BSH, not {input_layout}")
    return _bsh_decode(query, key, value, atten_mask, actual_seq_lengths, actual_seq_lengths_kv, block_table,
                       num_heads, kv_heads, scale)


def _tnd(query, key, value, atten_mask, q_ends, kv_lens, table, num_heads, kv_heads, scale, pre, nxt, sparse_mode):
    _need(query.dim() == 3 and query.shape[1] == num_heads, "TND query must be [T, num_heads, D]")
    _need(isinstance(q_ends, (list, tuple)) and all(isinstance(n, int) for n in q_ends),
          "TND needs actual_seq_lengths as a list of ints")
    _need(len(q_ends) == table.shape[0], "actual_seq_lengths sets the batch: one entry per block_table row")
    _need(all(b >= a for a, b in zip([0, *q_ends], q_ends)), "actual_seq_lengths must be cumulative (non-decreasing)")
    _need(q_ends[-1] == query.shape[0], f"the last cumulative length {q_ends[-1]} must be T={query.shape[0]}")
    _need(key.shape[2] == kv_heads * query.shape[2], "key's H must be num_key_value_heads * D")
    if sparse_mode == 0:
        _need(atten_mask is None, "TND with sparse_mode 0 takes no mask")
    else:
        _need(sparse_mode in (3, 4), f"TND supports sparse_mode 0, 3 and 4 here, not {sparse_mode}")
        _need(atten_mask is not None, f"sparse_mode {sparse_mode} needs the compressed mask")
        _compressed_causal(atten_mask)
    out = torch.empty_like(query)
    start = 0
    for b, end in enumerate(q_ends):
        sq, skv = end - start, kv_lens[b]
        _need(sq <= skv, f"sequence {b}: {sq} queries but only {skv} keys")
        pos = torch.arange(skv - sq, skv)[:, None]  # lower-right alignment
        j = torch.arange(skv)[None, :]
        if sparse_mode == 3:
            keep = j <= pos
        elif sparse_mode == 4:
            keep = (pos - j <= pre) & (j - pos <= nxt)
        else:
            keep = torch.ones(sq, skv, dtype=torch.bool)
        k = _gather_kv(key, table[b], skv, kv_heads)
        v = _gather_kv(value, table[b], skv, kv_heads)
        out[start:end] = _attend(query[start:end], k, v, keep.to(query.device), scale)
        start = end
    return out, torch.zeros(1)


def _bsh_decode(query, key, value, atten_mask, q_lens, kv_lens, table, num_heads, kv_heads, scale):
    _need(query.dim() == 3 and query.shape[1] == 1, "the stand-in covers BSH with Q_S = 1 (decode) only")
    _need(q_lens is None, "decode passes no actual_seq_lengths (Q_S is the query's S)")
    batch, d = query.shape[0], query.shape[2] // num_heads
    _need(query.shape[2] == num_heads * d and key.shape[2] == kv_heads * d, "BSH: H must be N * D")
    _need(batch == table.shape[0], "query batch and block_table rows differ")
    kv_s = table.shape[1] * key.shape[1]
    if atten_mask is not None:
        _need(atten_mask.dtype in MASK_DTYPES, f"atten_mask dtype {atten_mask.dtype} is not bool/int8/uint8")
        _need(atten_mask.shape[0] == batch and atten_mask.numel() == batch * atten_mask.shape[-1]
              and atten_mask.shape[-1] >= kv_s, "Q_S=1 masks are (B, KV_S), (B, 1, KV_S) or (B, 1, 1, KV_S) "
              "with KV_S >= maxBlockNumPerSeq * blockSize")
    # Q_S = 1: sparse_mode, pre_tokens and next_tokens are ignored, whatever they are
    q = query.view(batch, num_heads, d)
    out = torch.empty_like(q)
    for b in range(batch):
        keep = torch.ones(1, kv_lens[b], dtype=torch.bool)
        if atten_mask is not None:
            keep &= ~atten_mask[b].reshape(-1)[: kv_lens[b]].bool()[None]
        k = _gather_kv(key, table[b], kv_lens[b], kv_heads)
        v = _gather_kv(value, table[b], kv_lens[b], kv_heads)
        out[b] = _attend(q[b : b + 1], k, v, keep, scale)[0]
    return out.view(batch, 1, num_heads * d), torch.zeros(1)


def _check_cache_write(key, value, key_cache, value_cache, slots, name: str) -> None:
    _need(all(t.is_contiguous() for t in (key, value, key_cache, value_cache, slots)), f"{name}: inputs must be contiguous")
    _need(key.dim() == 3 and value.dim() == 3 and key.shape[:2] == value.shape[:2],
          f"{name}: key/value must be [tokens, heads, head_size]")
    _need(key_cache.dim() == 4 and key_cache.shape[2:] == key.shape[1:] and value_cache.shape[2:] == value.shape[1:],
          f"{name}: caches must be [num_blocks, block_size, heads, head_size]")
    _need(key.dtype == value.dtype == key_cache.dtype == value_cache.dtype, f"{name}: dtypes must all match")
    _need(slots.dim() == 1 and slots.shape[0] == key.shape[0], f"{name}: one slot per token")
    capacity = key_cache.shape[0] * key_cache.shape[1]
    _need(bool((slots >= 0).all() and (slots < capacity).all()), f"{name}: slots outside [0, blocks * block_size)")
    _need(slots.unique().numel() == slots.numel(), f"{name}: slots must not repeat")


def _write(key, value, key_cache, value_cache, slots) -> None:
    heads, d = key.shape[1], key.shape[2]
    key_cache.view(-1, heads, d)[slots.long()] = key
    value_cache.view(-1, heads, value.shape[2])[slots.long()] = value


def npu_scatter_pa_kv_cache(key, value, key_cache, value_cache, slot_mapping, *, compress_lens=None,
                            compress_seq_offsets=None, seq_lens=None):
    _need(compress_lens is None and compress_seq_offsets is None and seq_lens is None, "scenario 2 takes no "
          "compression arguments")
    _need(slot_mapping.dtype in (torch.int32, torch.int64), "slot_mapping must be int32 or int64")
    _check_cache_write(key, value, key_cache, value_cache, slot_mapping, "npu_scatter_pa_kv_cache")
    _write(key, value, key_cache, value_cache, slot_mapping)


def _npu_reshape_and_cache(key, value, key_cache, value_cache, slot_indices):
    _need(slot_indices.dtype == torch.int32, "_npu_reshape_and_cache takes int32 slot_indices")
    _check_cache_write(key, value, key_cache, value_cache, slot_indices, "_npu_reshape_and_cache")
    _write(key, value, key_cache, value_cache, slot_indices)


def npu_rms_norm(x, gamma, epsilon=1e-6):
    h = x.float()
    rstd = torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + epsilon)
    return (h * rstd * gamma.float()).to(x.dtype), rstd


def npu_add_rms_norm(x1, x2, gamma, epsilon=1e-6):
    summed = x1 + x2
    y, rstd = npu_rms_norm(summed, gamma, epsilon)
    return y, rstd, summed


def npu_rotary_mul(input, r1, r2, rotary_mode="half"):
    _need(rotary_mode == "half", "the stand-in covers half mode")
    _need(input.dim() == r1.dim() == r2.dim() == 4, "input, r1 and r2 must be 4-D")
    _need(input.shape[-1] % 2 == 0 and r1.shape[-1] == input.shape[-1], "D must be even and match r1/r2")
    # BSND input: r1/r2 are 1S1D, BS1D or BSND
    _need(r1.shape[2] in (1, input.shape[2]) and r1.shape[1] == input.shape[1], "r1/r2 must be 1S1D, BS1D or BSND")
    x1, x2 = torch.chunk(input, 2, -1)
    return r1 * input + r2 * torch.cat((-x2, x1), dim=-1)


OPS = ("npu_fused_infer_attention_score", "npu_scatter_pa_kv_cache", "_npu_reshape_and_cache", "npu_rms_norm",
       "npu_add_rms_norm", "npu_rotary_mul")


def standin_npu(missing: tuple[str, ...] = ()) -> SimpleNamespace:
    """A torch_npu look-alike holding the stand-ins (less ``missing``); ``calls`` logs every call."""
    ns = SimpleNamespace(calls=[])
    for name in OPS:
        if name not in missing:
            setattr(ns, name, _logged(ns.calls, name, globals()[name]))
    return ns


def _logged(log: list, name: str, fn):
    def call(*args, **kwargs):
        log.append((name, kwargs.get("input_layout"), kwargs.get("sparse_mode"), kwargs.get("atten_mask") is not None,
                    kwargs.get("pre_tokens")))
        return fn(*args, **kwargs)
    return call
