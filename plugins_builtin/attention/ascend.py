"""The `ascend` attention backend: paged KV cache and attention through torch-npu's fused kernels.

KV layout, per layer: one tensor [2, num_blocks, block_size, num_kv_heads, head_dim]; [0] holds
keys and [1] values, each in the ND layout npu_scatter_pa_kv_cache (scenario 2) and
_npu_reshape_and_cache write, and viewed as [num_blocks, block_size, num_kv_heads * head_dim]
(the "(blocknum, blocksize, H)" paged layout) when npu_fused_infer_attention_score reads it.

Steps with any prefill or extend run one TND call per layer over all the step's tokens:
actual_seq_lengths are the cumulative query ends, actual_seq_lengths_kv each sequence's cached
plus new tokens, and the mask is the 2048x2048 compressed causal mask the sparse modes expect;
sparse_mode 3 (causal, lower-right aligned) for full layers, 4 (band) with pre_tokens W - 1 and
next_tokens 0 for sliding-window layers. Steps of decodes only run a BSH call (Q_S = 1), where the
documentation says sparse_mode and pre_tokens are ignored, so sliding windows there come from an
explicit (B, 1, 1, KV_S) mask instead.

Which torch-npu documentation each call follows: deepinfer_builtin.devices.ascend.ops.DOCUMENTED_AT.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from deepinfer.plugins import AttentionBackend, AttentionLayerSpec, EngineContext, NoOptions, StepBatch
from deepinfer_builtin.devices.ascend.ops import (
    INSTALL_HINT,
    TORCH_NPU_LIMITS,
    KernelLimits,
    import_torch_npu,
    torch_npu_installed,
)

NO_LIMIT = 2147483647  # the kernels' default for pre_tokens / next_tokens
COMPRESSED_MASK_SIZE = 2048


@dataclass(frozen=True, slots=True)
class AscendAttentionMetadata:
    slot_mapping: torch.Tensor            # [T]: int64, or int32 for _npu_reshape_and_cache
    block_table: torch.Tensor             # [B, max_blocks] int32
    decode_only: bool
    actual_seq_lengths: list[int] | None  # TND: cumulative query ends; None for decode-only steps
    actual_seq_lengths_kv: list[int]      # per sequence: cached + new tokens
    causal_mask: torch.Tensor | None      # [2048, 2048] compressed mask (True: masked); prefill steps
    window_masks: dict[int, torch.Tensor]  # decode-only steps: window -> [B, 1, 1, KV_S] (True: masked)


class AscendAttention(AttentionBackend):
    """Paged attention with npu_fused_infer_attention_score; KV writes with npu_scatter_pa_kv_cache."""

    name = "ascend-attention"
    Options = NoOptions

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return None if torch_npu_installed() else INSTALL_HINT

    def batch_invariance_unavailable(self) -> str | None:
        return ("npu_fused_infer_attention_score is not documented to reduce a query row the same way whatever "
                "the batch and the step kind, and nothing has been measured on an NPU")

    @classmethod
    def kernels(cls) -> tuple[Any, KernelLimits | None]:
        """The module providing the ops and its documented limits; the tests substitute stand-ins."""
        return import_torch_npu(), TORCH_NPU_LIMITS

    def __init__(self, options: NoOptions, ctx: EngineContext) -> None:
        super().__init__(options, ctx)
        self.npu, self.limits = self.kernels()
        if self.limits is not None:
            self.limits.check_block_size(ctx.config.block_size)
        if hasattr(self.npu, "npu_scatter_pa_kv_cache"):
            self.write_op = "npu_scatter_pa_kv_cache"
        elif hasattr(self.npu, "_npu_reshape_and_cache"):
            self.write_op = "_npu_reshape_and_cache"
        else:
            raise RuntimeError("this torch_npu has neither npu_scatter_pa_kv_cache nor _npu_reshape_and_cache "
                               "to write the KV cache; install a torch-npu from 2.5.1 on")
        self._causal_masks: dict[torch.device, torch.Tensor] = {}

    def kv_cache_bytes_per_block(self, layers: Sequence[AttentionLayerSpec], block_size: int,
                                 dtype: torch.dtype) -> int:
        size = torch.empty((), dtype=dtype).element_size()
        return sum(2 * block_size * s.num_kv_heads * s.head_dim * size for s in layers)

    def allocate_kv_cache(self, layers, num_blocks, block_size, dtype, device):
        if self.limits is not None:
            self.limits.check_block_size(block_size)
            for s in layers:
                self.limits.check_layer(s.head_dim, dtype)
        return [torch.zeros(2, num_blocks, block_size, s.num_kv_heads, s.head_dim, dtype=dtype, device=device)
                for s in layers]

    # -------------------------------------------------------------------------------- metadata
    def build_metadata(self, batch: StepBatch) -> AscendAttentionMetadata:
        slots = batch.slot_mapping
        if self.write_op == "_npu_reshape_and_cache":
            slots = slots.to(torch.int32)  # ATB's ReshapeAndCache takes int32 slot indices
        table = batch.block_tables.to(torch.int32)
        kv_lens = list(batch.seq_lens_cpu)
        if batch.is_decode_only:
            return AscendAttentionMetadata(slots, table, True, None, kv_lens, None,
                                           self._decode_window_masks(batch, table))
        ends, total = [], 0
        for n in batch.query_lens_cpu:
            total += n
            ends.append(total)
        return AscendAttentionMetadata(slots, table, False, ends, kv_lens,
                                       self._causal_mask(batch.input_ids.device), {})

    def _causal_mask(self, device: torch.device) -> torch.Tensor:
        # "optimised compressed lower-triangular matrix (2048*2048)" of sparse modes 2-4: True above
        # the diagonal (masked); the kernel places it per sequence from the lower-right corner
        if device not in self._causal_masks:
            n = COMPRESSED_MASK_SIZE
            self._causal_masks[device] = torch.triu(torch.ones(n, n, dtype=torch.bool, device=device), 1)
        return self._causal_masks[device]

    def _decode_window_masks(self, batch: StepBatch, table: torch.Tensor) -> dict[int, torch.Tensor]:
        windows = {s.sliding_window for s in self.ctx.layers if s.sliding_window is not None}
        if not windows:
            return {}
        # KV_S must cover the whole block table ("KV_S >= maxBlockNumPerSeq * blockSize")
        kv_s = table.shape[1] * batch.block_size
        pos = torch.arange(kv_s, device=table.device)[None, :]
        lens = batch.seq_lens.to(torch.long)[:, None]
        return {w: ((pos < lens - w) | (pos >= lens))[:, None, None, :] for w in windows}

    # --------------------------------------------------------------------------------- forward
    def forward(self, layer, q, k, v, kv_cache, metadata: AscendAttentionMetadata):
        self._write_kv(k, v, kv_cache, metadata)
        num_blocks, block_size = kv_cache.shape[1], kv_cache.shape[2]
        hidden = layer.num_kv_heads * layer.head_dim
        key = kv_cache[0].view(num_blocks, block_size, hidden)
        value = kv_cache[1].view(num_blocks, block_size, hidden)
        common = {"block_table": metadata.block_table, "block_size": block_size,
                  "actual_seq_lengths_kv": metadata.actual_seq_lengths_kv, "num_heads": layer.num_heads,
                  "num_key_value_heads": layer.num_kv_heads, "scale": layer.scale}
        if metadata.decode_only:
            out, _ = self.npu.npu_fused_infer_attention_score(
                q.reshape(q.shape[0], 1, layer.num_heads * layer.head_dim), key, value,
                atten_mask=metadata.window_masks.get(layer.sliding_window), input_layout="BSH",
                sparse_mode=0, **common)
            return out.view(q.shape[0], layer.num_heads, layer.head_dim)
        window = layer.sliding_window
        out, _ = self.npu.npu_fused_infer_attention_score(
            q.contiguous(), key, value, atten_mask=metadata.causal_mask, input_layout="TND",
            actual_seq_lengths=metadata.actual_seq_lengths,
            sparse_mode=3 if window is None else 4,
            # band: keep keys j with 0 <= i - j <= pre_tokens, i.e. the token and the W - 1 before it
            pre_tokens=NO_LIMIT if window is None else window - 1,
            next_tokens=NO_LIMIT if window is None else 0, **common)
        return out

    def _write_kv(self, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                  metadata: AscendAttentionMetadata) -> None:
        k = k.to(kv_cache.dtype).contiguous()
        v = v.to(kv_cache.dtype).contiguous()
        if self.write_op == "npu_scatter_pa_kv_cache":
            self.npu.npu_scatter_pa_kv_cache(k, v, kv_cache[0], kv_cache[1], metadata.slot_mapping)
        else:
            self.npu._npu_reshape_and_cache(key=k, value=v, key_cache=kv_cache[0], value_cache=kv_cache[1],
                                            slot_indices=metadata.slot_mapping)
