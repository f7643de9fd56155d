"""The `torch` attention backend: paged KV cache and attention in plain torch, on any device.

It is the reference every attention kernel is checked against. Each step gathers every
sequence's keys and values from its blocks into a padded batch and runs one masked
scaled-dot-product attention per layer; the masks (causal, length, sliding window) are built
once per step.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from deepinfer.plugins import AttentionBackend, AttentionLayerSpec, StepBatch


@dataclass(frozen=True, slots=True)
class TorchAttentionMetadata:
    slot_mapping: torch.Tensor     # [T]
    q_index: torch.Tensor | None   # [B, max_q] into the T tokens (None: decode, one token each)
    out_index: torch.Tensor | None  # [T] into the flattened [B * max_q] rows
    kv_slots: dict[int | None, torch.Tensor]  # window -> [B, n_kv] cache slots of the keys to read
    masks: dict[int | None, torch.Tensor | None]  # window -> [B, 1, max_q, n_kv] (True: attend)


class TorchAttention(AttentionBackend):
    """Reference paged attention: prefill, extend and decode; full and sliding-window layers."""

    name = "torch"

    def kv_cache_bytes_per_block(self, layers: Sequence[AttentionLayerSpec], block_size: int,
                                 dtype: torch.dtype) -> int:
        size = torch.empty((), dtype=dtype).element_size()
        return sum(2 * block_size * spec.num_kv_heads * spec.head_dim * size for spec in layers)

    def allocate_kv_cache(self, layers, num_blocks, block_size, dtype, device):
        self._layer_windows = {s.sliding_window for s in layers if s.sliding_window is not None}
        # [2, num_blocks * block_size, kv_heads, head_dim]: slot s holds token s % block_size of
        # block s // block_size
        return [torch.zeros(2, num_blocks * block_size, s.num_kv_heads, s.head_dim, dtype=dtype,
                            device=device) for s in layers]

    def build_metadata(self, batch: StepBatch) -> TorchAttentionMetadata:
        dev = batch.input_ids.device
        b, max_q, max_kv, bs = batch.num_seqs, batch.max_query_len, batch.max_seq_len, batch.block_size
        q_lens = torch.tensor(batch.query_lens_cpu, device=dev)
        seq_lens = batch.seq_lens.to(torch.long)
        offs = torch.arange(max_q, device=dev)
        valid_q = offs[None, :] < q_lens[:, None]                                 # [B, max_q]
        q_pos = batch.context_lens.to(torch.long)[:, None] + offs[None, :]         # [B, max_q]
        q_pos = torch.where(valid_q, q_pos, torch.zeros_like(q_pos))  # pads look at key 0 only
        if max_q == 1:
            q_index = out_index = None
        else:
            starts = batch.query_start_loc[:-1].to(torch.long)
            q_index = torch.where(valid_q, starts[:, None] + offs[None, :], torch.zeros_like(q_pos))
            out_index = valid_q.flatten().nonzero().squeeze(1)
        n_blocks = -(-max_kv // bs)
        tables = batch.block_tables[:, :n_blocks].to(torch.long)
        kv_slots = (tables[:, :, None] * bs + torch.arange(bs, device=dev)).reshape(b, -1)[:, :max_kv]
        windows = self._windows
        if max_q == 1 and min(batch.seq_lens_cpu) == max_kv:
            # decodes of equal length need no mask: read exactly each window's keys (a masked
            # attention costs a fixed ~0.1 ms per layer on CPU, the cost of a whole small layer)
            slots = {w: kv_slots[:, max(0, max_kv - w):] for w in windows}
            return TorchAttentionMetadata(batch.slot_mapping, None, None, {None: kv_slots, **slots},
                                          {w: None for w in (None, *windows)})
        kv_pos = torch.arange(max_kv, device=dev)
        base = (kv_pos[None, None, :] <= q_pos[:, :, None]) & (kv_pos[None, None, :] < seq_lens[:, None, None])
        masks: dict[int | None, torch.Tensor | None] = {None: base[:, None]}
        for w in windows:
            masks[w] = (base & (q_pos[:, :, None] - kv_pos[None, None, :] < w))[:, None]
        return TorchAttentionMetadata(batch.slot_mapping, q_index, out_index,
                                      dict.fromkeys((None, *windows), kv_slots), masks)

    @property
    def _windows(self) -> set[int]:
        return getattr(self, "_layer_windows", set())

    def forward(self, layer, q, k, v, kv_cache, metadata: TorchAttentionMetadata):
        kv_cache[0].index_copy_(0, metadata.slot_mapping, k.to(kv_cache.dtype))
        kv_cache[1].index_copy_(0, metadata.slot_mapping, v.to(kv_cache.dtype))
        slots = metadata.kv_slots[layer.sliding_window]
        shape = (*slots.shape, layer.num_kv_heads, layer.head_dim)
        # index_select over flat slots is several times faster on CPU than advanced indexing
        keys = kv_cache[0].index_select(0, slots.flatten()).view(shape)     # [B, n_kv, kvh, D]
        values = kv_cache[1].index_select(0, slots.flatten()).view(shape)
        if metadata.q_index is None:
            qb = q[:, None]                       # [B, 1, H, D]
        else:
            qb = q[metadata.q_index]              # [B, max_q, H, D]
        out = F.scaled_dot_product_attention(
            qb.transpose(1, 2), keys.transpose(1, 2).to(q.dtype), values.transpose(1, 2).to(q.dtype),
            attn_mask=metadata.masks[layer.sliding_window], scale=layer.scale,
            enable_gqa=layer.num_heads != layer.num_kv_heads,
        ).transpose(1, 2)                         # [B, max_q, H, D]
        if metadata.q_index is None:
            return out[:, 0]
        return out.reshape(-1, layer.num_heads, layer.head_dim)[metadata.out_index]
