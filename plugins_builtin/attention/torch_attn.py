"""The `torch` attention backend: paged KV cache and attention in plain torch, on any device.

It is the reference every attention kernel is checked against. Each step gathers every
sequence's keys and values from its blocks into a padded batch and runs one masked
scaled-dot-product attention per layer; the masks (causal, length, sliding window) are built
once per step. A latent layer (``AttentionLayerSpec.value_dim``, MLA) keeps one tensor of keys,
[slots, 1, head_dim], and reads each value as its key's first value_dim dims.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from deepinfer.plugins import AttentionBackend, AttentionLayerSpec, KVGroupBatch, StepBatch
from deepinfer_builtin.attention.torch_invariant import attend_invariant


def _write_kv(kv_cache: torch.Tensor, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Keys and values into their slots of one layer's cache [2, slots, kv_heads, head_dim]."""
    kv_cache[0].index_copy_(0, slots, k.to(kv_cache.dtype))
    kv_cache[1].index_copy_(0, slots, v.to(kv_cache.dtype))


def _write_latent(kv_cache: torch.Tensor, slots: torch.Tensor, k: torch.Tensor) -> None:
    """Keys into their slots of one latent layer's cache [slots, 1, head_dim] (values are key prefixes)."""
    kv_cache.index_copy_(0, slots, k.to(kv_cache.dtype))


# The same as one opaque op, for steps under torch.compile: the compiler then updates the cache in
# place, where it would copy the whole cache every step to apply index_copy_. Declared with
# torch.library's schema API rather than custom_op, whose Python wrapper cost ~80 us a call here.
_LIB = torch.library.Library("deepinfer", "FRAGMENT")
_LIB.define("torch_kv_write(Tensor(a!) kv_cache, Tensor slots, Tensor k, Tensor v) -> ()")
_LIB.impl("torch_kv_write", _write_kv, "CompositeExplicitAutograd")
_LIB.impl("torch_kv_write", lambda kv_cache, slots, k, v: None, "Meta")
_LIB.define("torch_latent_write(Tensor(a!) kv_cache, Tensor slots, Tensor k) -> ()")
_LIB.impl("torch_latent_write", _write_latent, "CompositeExplicitAutograd")
_LIB.impl("torch_latent_write", lambda kv_cache, slots, k: None, "Meta")


#: on the CPU, steps of at most this many queries a sequence, in batches of several sequences,
#: attend through batched matmuls (``_attend``)
CPU_MATMUL_QUERIES = 16


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
            scale: float) -> torch.Tensor:
    """Attention of q [B, T, H, D] over k [B, n, kvh, D] and v [B, n, kvh, Dv] (mask [B or 1, 1, T, n],
    True: attend; query head h reads kv head h // (H / kvh)): [B, T, H, Dv].

    On the CPU, torch's scaled_dot_product_attention is slow for a few queries a sequence (its
    flash kernel; session 38, 6 heads over 2 kv heads, 200 keys): a half-precision decode of one
    sequence took 108 us against 43-64 us in float32, and decodes of 8 and 64 sequences took 0.7
    and 5.7 ms against 0.21 and 0.54 ms as two batched matmuls with the softmax in float32. So
    there, a lone one-token step computes in float32, and batches of several sequences with at
    most ``CPU_MATMUL_QUERIES`` queries each take the matmuls. Elsewhere (and for longer steps)
    scaled_dot_product_attention."""
    b, t, h, d = q.shape
    kvh, dv = k.shape[2], v.shape[3]
    if q.device.type == "cpu" and t <= CPU_MATMUL_QUERIES:
        half = q.dtype in (torch.bfloat16, torch.float16)
        if b == 1 and t == 1 and mask is None and half:
            out = F.scaled_dot_product_attention(q.transpose(1, 2).float(), k.transpose(1, 2).float(),
                                                 v.transpose(1, 2).float(), scale=scale, enable_gqa=h != kvh)
            return out.transpose(1, 2).to(q.dtype)
        if b > 1:
            g = h // kvh  # [B, kvh, T * g, D]: a kv head's queries, token by token
            qg = q.view(b, t, kvh, g, d).permute(0, 2, 1, 3, 4).reshape(b, kvh, t * g, d)
            scores = torch.matmul(qg, k.permute(0, 2, 3, 1)).float().mul_(scale)   # [B, kvh, T * g, n]
            if mask is not None:  # (a row with nothing to attend gets a uniform average, not NaN)
                lowest = torch.finfo(torch.float32).min
                scores = scores.view(b, kvh, t, g, -1).masked_fill_(~mask[:, :, :, None], lowest)
            probs = scores.view(b, kvh, t * g, -1).softmax(-1).to(q.dtype)
            out = torch.matmul(probs, v.permute(0, 2, 1, 3))                        # [B, kvh, T * g, Dv]
            return out.view(b, kvh, t, g, dv).permute(0, 2, 1, 3, 4).reshape(b, t, h, dv)
    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask,
                                          scale=scale, enable_gqa=h != kvh).transpose(1, 2)


@dataclass(frozen=True, slots=True)
class TorchAttentionMetadata:
    writes: tuple[tuple[torch.Tensor, torch.Tensor | None], ...]  # per KV group: slots to write, rows of T
    q_index: torch.Tensor | None   # [B, max_q] into the T tokens (None: decode, one token each)
    out_index: torch.Tensor | None  # [T] into the flattened [B * max_q] rows
    kv_slots: dict[tuple[int, int | None], torch.Tensor]  # (group, window) -> [B, n_kv] slots of keys to read
    masks: dict[int | None, torch.Tensor | None]  # window -> [B, 1, max_q, n_kv] (True: attend)
    one_seq: bool = False  # one sequence of several tokens: its rows are the batch's, in order


class TorchAttention(AttentionBackend):
    """Reference paged attention: prefill, extend and decode; full, sliding-window and latent layers."""

    name = "torch"
    supports_kv_groups = True
    supports_latent_kv = True

    def batch_invariance_unavailable(self) -> str | None:
        return None

    @property
    def invariant(self) -> bool:
        """``--batch-invariant``: every step attends through ``attend_invariant``."""
        return bool(getattr(getattr(self.ctx, "config", None), "batch_invariant", False))

    def kv_cache_bytes_per_block(self, layers: Sequence[AttentionLayerSpec], block_size: int,
                                 dtype: torch.dtype) -> int:
        size = torch.empty((), dtype=dtype).element_size()
        return sum((1 if spec.latent else 2) * block_size * spec.num_kv_heads * spec.head_dim * size
                   for spec in layers)

    def allocate_kv_cache(self, layers, num_blocks, block_size, dtype, device):
        self._layer_keys = getattr(self, "_layer_keys", set()) | {(s.kv_group, s.sliding_window) for s in layers}
        # [2, num_blocks * block_size, kv_heads, head_dim]: slot s holds token s % block_size of
        # block s // block_size; a latent layer keeps keys alone: [num_blocks * block_size, 1, head_dim]
        return [torch.zeros(*(() if s.latent else (2,)), num_blocks * block_size, s.num_kv_heads, s.head_dim,
                            dtype=dtype, device=device) for s in layers]

    def build_metadata(self, batch: StepBatch) -> TorchAttentionMetadata:
        dev = batch.input_ids.device
        b, max_q, max_kv, bs = batch.num_seqs, batch.max_query_len, batch.max_seq_len, batch.block_size
        n_blocks = -(-max_kv // bs)
        groups = batch.kv_groups or (KVGroupBatch(batch.slot_mapping, batch.block_tables, None),)
        writes = tuple((g.slot_mapping if g.write_rows is None else g.slot_mapping[g.write_rows], g.write_rows)
                       for g in groups)
        group_slots = {}
        for g, grp in enumerate(groups):
            tables = grp.block_tables[:, :n_blocks].to(torch.long)
            group_slots[g] = (tables[:, :, None] * bs + torch.arange(bs, device=dev)).reshape(b, -1)[:, :max_kv]
        keys = self._keys | {(0, None)}
        windows = {w for _, w in keys if w is not None}
        if max_q == 1 and min(batch.seq_lens_cpu) == max_kv and not self.invariant:
            # decodes of equal length need no mask: read exactly each window's keys (a masked
            # attention costs a fixed ~0.1 ms per layer on CPU, the cost of a whole small layer)
            slots = {(g, w): group_slots[g][:, max(0, max_kv - w) if w else 0:] for g, w in keys}
            return TorchAttentionMetadata(writes, None, None, slots, {w: None for w in (None, *windows)})
        q_lens = torch.tensor(batch.query_lens_cpu, device=dev)
        seq_lens = batch.seq_lens.to(torch.long)
        offs = torch.arange(max_q, device=dev)
        valid_q = offs[None, :] < q_lens[:, None]                                 # [B, max_q]
        q_pos = batch.context_lens.to(torch.long)[:, None] + offs[None, :]         # [B, max_q]
        q_pos = torch.where(valid_q, q_pos, torch.zeros_like(q_pos))  # pads look at key 0 only
        one_seq = b == 1 and max_q > 1
        if max_q == 1 or one_seq:  # (one sequence: q[None] and out[0] need no gathers)
            q_index = out_index = None
        else:
            starts = batch.query_start_loc[:-1].to(torch.long)
            q_index = torch.where(valid_q, starts[:, None] + offs[None, :], torch.zeros_like(q_pos))
            out_index = valid_q.flatten().nonzero().squeeze(1)
        kv_pos = torch.arange(max_kv, device=dev)
        base = (kv_pos[None, None, :] <= q_pos[:, :, None]) & (kv_pos[None, None, :] < seq_lens[:, None, None])
        masks: dict[int | None, torch.Tensor | None] = {None: base[:, None]}
        for w in windows:
            masks[w] = (base & (q_pos[:, :, None] - kv_pos[None, None, :] < w))[:, None]
        return TorchAttentionMetadata(writes, q_index, out_index, {(g, w): group_slots[g] for g, w in keys}, masks,
                                      one_seq)

    def sequence_metadata(self, slots: torch.Tensor, q: int) -> TorchAttentionMetadata:
        """``build_metadata``'s result for a step of one sequence of ``len(slots)`` keys whose last
        ``q`` are new, without a StepBatch: ``slots`` [n] int64 holds each key's cache slot, in order.
        For the draft's compiled step (draft_compile.py): inside the engine about 0.2 ms a step
        cheaper than a StepBatch and ``build_metadata`` (session 29). Layers of KV group 0 only (a
        draft's: only a target's sliding-window layers may keep a pool of their own)."""
        keys = self._keys | {(0, None)}
        if any(g for g, _ in keys):
            raise ValueError("sequence_metadata serves one KV group only; this model's layers use "
                             f"{sorted({g for g, _ in keys})}")
        n = slots.shape[0]
        windows = {w for _, w in keys if w is not None}
        row, writes = slots[None], ((slots[n - q:].clone(), None),)
        if q == 1:  # (as a decode of build_metadata: each window reads exactly its keys, no mask)
            # slice the 1-D slots, then add the batch dimension: each view's stride is then its own
            # length at every length; a slice of ``row`` would keep stride n, which the compiled
            # step's guards check (draft_compile.py)
            kv_slots = {(0, w): slots[max(0, n - w) if w else 0:][None] for _, w in keys}
            return TorchAttentionMetadata(writes, None, None, kv_slots, {w: None for w in (None, *windows)})
        kv_pos = torch.arange(n, device=slots.device)
        q_pos = kv_pos[n - q:]
        base = kv_pos[None, None, :] <= q_pos[None, :, None]                    # [1, q, n]
        masks: dict[int | None, torch.Tensor | None] = {None: base[:, None]}
        for w in windows:
            masks[w] = (base & (q_pos[None, :, None] - kv_pos[None, None, :] < w))[:, None]
        return TorchAttentionMetadata(writes, None, None, dict.fromkeys(keys, row), masks, q > 1)

    def mark_dynamic(self, metadata: TorchAttentionMetadata) -> None:
        """Tell torch.compile that the keys read (and the masks' columns) vary in number from step
        to step (one compiled step serves every length)."""
        for slots in metadata.kv_slots.values():
            torch._dynamo.mark_dynamic(slots, 1)
        for mask in metadata.masks.values():
            if mask is not None:
                torch._dynamo.mark_dynamic(mask, 3)

    @property
    def _keys(self) -> set[tuple[int, int | None]]:
        return getattr(self, "_layer_keys", set())

    def forward(self, layer, q, k, v, kv_cache, metadata: TorchAttentionMetadata):
        write_slots, rows = metadata.writes[layer.kv_group]
        if layer.latent:
            return self._forward_latent(layer, q, k, kv_cache, metadata, write_slots, rows)
        if rows is not None:  # tokens whose KV is cached already are not rewritten
            k, v = k[rows], v[rows]
        (torch.ops.deepinfer.torch_kv_write if torch.compiler.is_compiling() else _write_kv)(kv_cache, write_slots, k, v)
        slots = metadata.kv_slots[layer.kv_group, layer.sliding_window]
        shape = (*slots.shape, layer.num_kv_heads, layer.head_dim)
        # index_select over flat slots is several times faster on CPU than advanced indexing
        keys = kv_cache[0].index_select(0, slots.flatten()).view(shape)     # [B, n_kv, kvh, D]
        values = kv_cache[1].index_select(0, slots.flatten()).view(shape)
        return self._attend_batch(layer, q, keys, values, metadata)

    def _forward_latent(self, layer, q, k, kv_cache, metadata: TorchAttentionMetadata, write_slots, rows):
        """A latent layer: write the keys alone, read each value as its key's first value_dim dims."""
        if k is not None:
            if rows is not None:
                k = k[rows]
            (torch.ops.deepinfer.torch_latent_write if torch.compiler.is_compiling() else _write_latent)(
                kv_cache, write_slots, k)
        slots = metadata.kv_slots[layer.kv_group, layer.sliding_window]
        keys = kv_cache.index_select(0, slots.flatten()).view(*slots.shape, layer.num_kv_heads, layer.head_dim)
        return self._attend_batch(layer, q, keys, keys[..., :layer.value_dim], metadata)

    def _attend_batch(self, layer, q, keys, values, metadata: TorchAttentionMetadata) -> torch.Tensor:
        """q [T, H, D] over the gathered keys and values of each sequence: [T, H, Dv]."""
        if metadata.one_seq:
            qb = q[None]                          # [1, T, H, D]
        elif metadata.q_index is None:
            qb = q[:, None]                       # [B, 1, H, D]
        else:
            qb = q[metadata.q_index]              # [B, max_q, H, D]
        attend = attend_invariant if self.invariant else _attend  # (the former: keys counted from position 0)
        out = attend(qb, keys.to(q.dtype), values.to(q.dtype), metadata.masks[layer.sliding_window], layer.scale)
        if metadata.q_index is None:
            return out[0] if metadata.one_seq else out[:, 0]
        return out.reshape(-1, layer.num_heads, values.shape[-1])[metadata.out_index]
