"""The `triton` attention backend: paged attention with the Triton kernels of deepinfer_kernels.

The KV cache has the torch backend's layout (per layer [2, num_blocks * block_size, kv_heads,
head_dim]; slot = block_id * block_size + offset), so the two backends are interchangeable. Each
layer writes its keys and values with one kernel (in a step of one token the device's fused qkv
kernel may write them instead: ``fused_kv_write``), then attends:

- a decode-only step (one query token per sequence) runs the split-KV decode kernel;
- any other step runs the prefill/extend kernel, and the one-token runs in it still go through
  the decode kernel, so a decoding sequence's numbers never depend on what it is batched with
  (in a verification graph, where every sequence has Q rows, the flagged one-token runs:
  ``StepBatch.single_runs``).

Runs compiled on NVIDIA GPUs, or in the Triton interpreter on the CPU (TRITON_INTERPRET=1 set
before triton is imported; float32/float16 only, slow, for tests).
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator

from deepinfer.plugins import AttentionBackend, AttentionLayerSpec, EngineContext, PluginError, StepBatch
from deepinfer.plugins.capabilities import FusedKVWrite, HandlesSingleRuns

NEEDS = "needs an NVIDIA GPU, or TRITON_INTERPRET=1 to run in the Triton interpreter on CPU"


def _kernels() -> Any:
    """deepinfer_kernels, imported on first use so that listing plugins never imports triton."""
    import deepinfer_kernels

    return deepinfer_kernels


class TritonAttentionOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    split_size: int = Field(256, ge=16, description="key positions per decode split (a multiple of 16); "
                                                    "fixed, so results do not depend on the batch (steps of a "
                                                    "single token: see single_token_split)")
    single_token_split: int | None = Field(128, ge=16, description="key positions per decode split in steps of a "
                                           "single token (batch-1 decode; None: split_size); a sequence decoded "
                                           "alone then gets other bits than in a batch, as it does from the "
                                           "devices' single-token GEMVs and cuBLAS")
    programmatic_launch: bool = Field(True, description="in steps of a single token (batch-1 decode), launch "
                                      "the KV write and decode kernels with programmatic dependent launch "
                                      "(compute capability 9.0+): each starts while the previous kernel finishes")
    single_token_fusion: bool = Field(True, description="in steps the device's GEMVs run (a single token, or a "
                                      "few), let the fused qkv kernel write the keys and values into the cache; "
                                      "in steps of a single token, also merge the decode splits in the first "
                                      "pass (the same numbers, two launches fewer a layer)")

    @field_validator("split_size", "single_token_split")
    @classmethod
    def _multiple_of_16(cls, v: int | None, info) -> int | None:
        if v is not None and v % 16:
            raise ValueError(f"{info.field_name} must be a multiple of 16, got {v}")
        return v


@dataclass(frozen=True, slots=True)
class TritonAttentionMetadata:
    """One step's inputs to the kernels, shared by every layer."""

    slot_mapping: torch.Tensor       # [T] int64
    query_start_loc: torch.Tensor    # [B+1] int32
    seq_lens: torch.Tensor           # [B] int32
    context_lens: torch.Tensor       # [B] int32
    block_tables: torch.Tensor       # [B, max_blocks] int32
    block_size: int
    max_query_len: int
    max_seq_len: int
    decode_only: bool
    # one-token runs of a mixed step, handed to the decode kernel (None: there are none)
    decode_rows: torch.Tensor | None = None         # [Bd] int64 rows of q
    decode_tables: torch.Tensor | None = None       # [Bd, max_blocks] int32
    decode_seq_lens: torch.Tensor | None = None     # [Bd] int32
    decode_max_seq_len: int = 0
    # in verification graphs: which of decode_rows (every sequence's first row) take the decode
    # kernel's output (one-token runs); None: all of them
    decode_select: torch.Tensor | None = None       # [Bd] bool
    #: KV groups after the first (sliding-window layers in a pool of their own): slots, tables,
    #: and the one-token runs' tables
    extra_groups: tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None], ...] = ()

    def group(self, g: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        return (self.slot_mapping, self.block_tables, self.decode_tables) if g == 0 else self.extra_groups[g - 1]


class TritonAttention(AttentionBackend, HandlesSingleRuns, FusedKVWrite):
    """Paged attention with Triton kernels: KV write, split-KV decode, prefill/extend over the cache."""

    name = "triton"
    Options = TritonAttentionOptions
    supports_graphs = True  # the decode path reads only device tensors; max_seq_len sizes its grid
    handles_single_runs = True
    supports_kv_groups = True
    #: latent layers (MLA): one cached row a token; decode by the absorbed MLA kernel, prefill by
    #: the prefill kernel with the whole row as the value (its first value_dim columns are the output)
    supports_latent_kv = True

    @classmethod
    def unavailable_reason(cls) -> str | None:
        try:
            kernels = _kernels()
        except Exception as exc:  # noqa: BLE001  (triton missing, or broken for this platform)
            return f"triton cannot be imported ({type(exc).__name__}: {exc}); install it with `pip install triton`"
        if kernels.triton_interpreted():
            return None
        if os.environ.get("TRITON_INTERPRET") == "1":
            return ("TRITON_INTERPRET=1 was set after triton had been imported, which triton ignores; "
                    "set it in the environment before the process starts")
        if not torch.cuda.is_available():
            return NEEDS
        return None

    def __init__(self, options: BaseModel, ctx: EngineContext) -> None:
        super().__init__(options, ctx)
        reason = self.unavailable_reason()
        if reason is not None:
            raise PluginError(f"attention plugin 'triton' cannot run here: {reason}")
        self.kernels = _kernels()
        self.single_split = self.options.single_token_split

    def batch_invariance_unavailable(self) -> str | None:
        return ("its decode kernel merges splits of the keys where its prefill kernel runs one pass over them, "
                "so a token decoded gets other bits than in a prefill or a verification; a batch-invariant "
                "mode of these kernels is not written yet (the torch attention plugin has one)")

    def kv_cache_bytes_per_block(self, layers: Sequence[AttentionLayerSpec], block_size: int,
                                 dtype: torch.dtype) -> int:
        size = torch.empty((), dtype=dtype).element_size()
        return sum((1 if spec.latent else 2) * block_size * spec.num_kv_heads * spec.head_dim * size
                   for spec in layers)

    def allocate_kv_cache(self, layers, num_blocks, block_size, dtype, device):
        interpreted = self.kernels.triton_interpreted()
        if not interpreted and torch.device(device).type != "cuda":
            raise ValueError(f"the triton attention plugin runs on CUDA devices, not {device}; pick an NVIDIA "
                             "device plugin, or set TRITON_INTERPRET=1 before starting to use the interpreter")
        if interpreted and dtype == torch.bfloat16:
            raise ValueError("the Triton interpreter computes bfloat16 wrongly; use dtype float32 or float16 "
                             "with TRITON_INTERPRET=1")
        for s in layers:
            if s.latent and s.sliding_window is not None:
                raise ValueError(f"layer {s.layer_idx}: the triton attention plugin has no sliding window for "
                                 "latent (MLA) layers")
        return [torch.zeros(num_blocks * block_size, 1, s.head_dim, dtype=dtype, device=device) if s.latent
                else torch.zeros(2, num_blocks * block_size, s.num_kv_heads, s.head_dim, dtype=dtype, device=device)
                for s in layers]

    def build_metadata(self, batch: StepBatch) -> TritonAttentionMetadata:
        common = {"slot_mapping": batch.slot_mapping, "query_start_loc": batch.query_start_loc,
                  "seq_lens": batch.seq_lens, "context_lens": batch.context_lens,
                  "block_tables": batch.block_tables, "block_size": batch.block_size,
                  "max_query_len": batch.max_query_len, "max_seq_len": batch.max_seq_len}
        if batch.single_runs is not None and not batch.is_decode_only:
            # a graph of Q rows per sequence: every sequence's first row also goes through the decode
            # kernel, whose output the one-token runs keep (decided on the device, from the flags)
            common["extra_groups"] = tuple((g.slot_mapping, g.block_tables, g.block_tables)
                                           for g in batch.kv_groups[1:])
            # (the other sequences get length 0 there: the decode kernel reads none of their keys)
            return TritonAttentionMetadata(
                decode_only=False, decode_rows=batch.query_start_loc[:-1].to(torch.long),
                decode_tables=batch.block_tables,
                decode_seq_lens=torch.where(batch.single_runs, batch.seq_lens, 0).to(torch.int32),
                decode_max_seq_len=batch.max_seq_len, decode_select=batch.single_runs, **common)
        singles = [] if batch.is_decode_only else [i for i, n in enumerate(batch.query_lens_cpu) if n == 1]
        idx = torch.tensor(singles, dtype=torch.long, device=batch.seq_lens.device) if singles else None
        common["extra_groups"] = tuple((g.slot_mapping, g.block_tables,
                                        None if idx is None else g.block_tables[idx].contiguous())
                                       for g in batch.kv_groups[1:])
        if batch.is_decode_only:
            return TritonAttentionMetadata(decode_only=True, **common)
        if idx is None:
            return TritonAttentionMetadata(decode_only=False, **common)
        return TritonAttentionMetadata(
            decode_only=False, decode_rows=batch.query_start_loc.to(torch.long)[idx],
            decode_tables=batch.block_tables[idx].contiguous(), decode_seq_lens=batch.seq_lens[idx].contiguous(),
            decode_max_seq_len=max(batch.seq_lens_cpu[i] for i in singles), **common)

    def fused_kv_write(self, layer: AttentionLayerSpec, kv_cache: torch.Tensor,
                       metadata: TritonAttentionMetadata) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        slots = metadata.group(layer.kv_group)[0]
        # (asked only by the device's GEMV path, which writes every token's key at its slot)
        if not self.options.single_token_fusion or layer.latent:
            return None
        return kv_cache[0], kv_cache[1], slots

    def forward(self, layer: AttentionLayerSpec, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None,
                kv_cache: torch.Tensor, metadata: TritonAttentionMetadata) -> torch.Tensor:
        if layer.latent:
            return self._latent(layer, q, k, kv_cache, metadata)
        kern, m = self.kernels, metadata
        k_cache, v_cache = kv_cache[0], kv_cache[1]
        slots, tables, decode_tables = m.group(layer.kv_group)
        # a single-token step: a chain of small kernels (the device's single-token GEMVs around
        # them launch the same way), each launched while the one before finishes
        single = q.shape[0] == 1
        pdl = single and self.options.programmatic_launch and kern.pdl_supported(q.device)
        if k is not None:  # (None: the fused qkv kernel wrote them, see fused_kv_write)
            kern.write_kv_cache(k, v, k_cache, v_cache, slots, pdl=pdl)  # negative slots are skipped
        split = self.options.split_size
        if single and self.single_split is not None:
            split = self.single_split
        if m.decode_only:
            return kern.paged_decode_attention(q, k_cache, v_cache, tables, m.seq_lens, m.block_size,
                                               layer.scale, layer.sliding_window, m.max_seq_len, split, pdl=pdl,
                                               merge_in_pass=single and self.options.single_token_fusion)
        out = kern.paged_prefill_attention(q, k_cache, v_cache, m.query_start_loc, m.seq_lens, m.context_lens,
                                           tables, m.block_size, layer.scale, layer.sliding_window,
                                           m.max_query_len,
                                           skip_single=m.decode_rows is not None and m.decode_select is None)
        if m.decode_rows is not None:
            single = kern.paged_decode_attention(
                q[m.decode_rows], k_cache, v_cache, decode_tables, m.decode_seq_lens, m.block_size,
                layer.scale, layer.sliding_window, m.decode_max_seq_len, split)
            if m.decode_select is not None:
                single = torch.where(m.decode_select[:, None, None], single, out[m.decode_rows])
            out[m.decode_rows] = single
        return out

    def _latent(self, layer: AttentionLayerSpec, q: torch.Tensor, k: torch.Tensor | None, cache: torch.Tensor,
                m: TritonAttentionMetadata) -> torch.Tensor:
        """A latent layer: q [T, H, D] (absorbed), k [T, 1, D] the new rows; returns [T, H, value_dim]."""
        kern, vd = self.kernels, layer.value_dim
        slots, tables, decode_tables = m.group(layer.kv_group)
        if k is not None:
            kern.write_mla_cache(k.reshape(-1, layer.head_dim), None, cache, slots)  # negative slots are skipped
        split = self.options.split_size
        if q.shape[0] == 1 and self.single_split is not None:
            split = self.single_split
        if m.decode_only:
            return kern.mla_decode_attention(q, cache, tables, m.seq_lens, m.block_size, vd, layer.scale,
                                             m.max_seq_len, split)
        # a row of more than 256 columns takes tiles of 16 queries and keys (each holds a whole row)
        tiles = {"block_m": 16, "block_n": 16} if layer.head_dim > 256 else {}
        out = kern.paged_prefill_attention(q, cache, cache, m.query_start_loc, m.seq_lens, m.context_lens, tables,
                                           m.block_size, layer.scale, None, m.max_query_len,
                                           skip_single=m.decode_rows is not None and m.decode_select is None,
                                           **tiles)[..., :vd]
        if m.decode_rows is not None:
            single = kern.mla_decode_attention(q[m.decode_rows], cache, decode_tables, m.decode_seq_lens,
                                               m.block_size, vd, layer.scale, m.decode_max_seq_len, split)
            if m.decode_select is not None:
                single = torch.where(m.decode_select[:, None, None], single, out[m.decode_rows])
            out[m.decode_rows] = single
        return out.contiguous()
