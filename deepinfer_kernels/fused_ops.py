"""FusedOps: the bundle of kernels the CUDA devices offer the models."""
from __future__ import annotations

from deepinfer_kernels._launch import pdl_supported
from deepinfer_kernels.embedding import embedding
from deepinfer_kernels.gemv import gemv, gemv_qkv_rotary
from deepinfer_kernels.gemv_rows import MAX_ROWS, gemv_rows, gemv_rows_qkv_rotary, rows_supported


class FusedOps:
    """The fused kernels a CUDA device hands to the models (see ``Device.fused_ops``).

    ``single_token_gemv``: offer ``gemv`` and ``gemv_qkv_rotary`` (the models then run steps of a
    single token through them; None otherwise). ``pdl``: launch those with programmatic dependent
    launch where the GPU supports it, and with them the embedding and the argmax that precede and
    follow a step's GEMVs. ``l2_keep_bytes``: the GEMVs' weights that stay in the L2
    from one step to the next (loads marked evict_last), given to the weights in the order the GEMVs
    first read them (a step's first layers; a draft model's first, where its graphs are captured
    before the target's) to each that still fits; every other weight is
    streamed (evict_first), so that it does not push the kept ones out. 0 leaves every load at the
    default policy. The hints change no result, only what the L2 holds. ``gemv_rows``: steps of
    2 to this many tokens (at most 16) take ``gemv`` and ``gemv_qkv_rotary`` too, through the
    multi-row kernels (``takes_rows`` says which steps); 1: single-token steps only.
    ``grouped_topk`` and ``fused_moe``: a mixture-of-experts layer's routing and routed experts
    (DeepSeek-V2/V3), offered always.
    """

    def __init__(self, single_token_gemv: bool = True, pdl: bool = True, l2_keep_bytes: int = 0,
                 gemv_rows: int = MAX_ROWS) -> None:
        from deepinfer_kernels.activation import silu_and_mul
        from deepinfer_kernels.argmax import argmax, argmax_prob
        from deepinfer_kernels.chain_inputs import chain_inputs
        from deepinfer_kernels.moe_routing import grouped_topk
        from deepinfer_kernels.placeholders import STAGE_MAX_BYTES, resolve_placeholders, stage_inputs
        from deepinfer_kernels.rms_norm import rms_norm
        from deepinfer_kernels.rotary import apply_rotary

        self.rms_norm = rms_norm
        self.apply_rotary = apply_rotary
        self.silu_and_mul = silu_and_mul
        self.resolve_placeholders = resolve_placeholders
        self.chain_inputs = chain_inputs
        self.grouped_topk = grouped_topk  # DeepSeek's routing; with fused_moe, a MoE layer's routed experts
        self._stage_inputs = stage_inputs
        self.stage_max_bytes = STAGE_MAX_BYTES  # the most a step's staged inputs may take
        self.pdl = pdl
        self.l2_keep_bytes = l2_keep_bytes
        self._kept = 0
        self._evict: dict[int, str] = {}  # a weight's data pointer: its loads' policy
        self._argmax, self._argmax_prob = argmax, argmax_prob
        self.gemv = self._gemv if single_token_gemv else None
        self.gemv_qkv_rotary = self._gemv_qkv_rotary if single_token_gemv else None
        self.gemv_max_rows = max(1, min(int(gemv_rows), MAX_ROWS)) if single_token_gemv else 0

    def takes_rows(self, rows: int, head_dim: int | None = None, weights: int | None = None) -> bool:
        """Whether ``gemv`` and ``gemv_qkv_rotary`` take a step of ``rows`` tokens (of a model with
        heads of ``head_dim`` whose largest projection has ``weights`` weights)."""
        return rows == 1 and self.gemv_max_rows >= 1 or (1 < rows <= self.gemv_max_rows
                                                         and rows_supported(head_dim, weights))

    def _pdl(self, x) -> bool:
        return self.pdl and pdl_supported(x.device)

    def embedding(self, ids, weight):
        return embedding(ids, weight, pdl=self._pdl(weight))

    def stage_inputs(self, src, turn, dst, n_ids, values):
        return self._stage_inputs(src, turn, dst, n_ids, values, pdl=self._pdl(dst))

    def argmax(self, logits, chunk=None, out=None):
        return self._argmax(logits, chunk, out, pdl=self._pdl(logits))

    def argmax_prob(self, logits, chunk=None):
        return self._argmax_prob(logits, chunk, pdl=self._pdl(logits))

    def fp8_block_linear(self, x, weight, weight_scale_inv):
        """The block-scaled FP8 GEMM of a linear layer: x quantized per token in groups of 128 columns,
        then ``torch._scaled_mm``'s block recipe for 1,024 rows or more where it takes the shape (K a
        multiple of 512), the Triton kernel otherwise (the H100 bench: _scaled_mm 1.5-1.9x faster at
        4,096 rows, slower than Triton below a few hundred)."""
        from deepinfer_kernels.fp8_gemm import fp8_block_gemm, per_token_group_quant_fp8

        lead = x.shape[:-1]
        x2 = x.reshape(-1, x.shape[-1])
        k = x2.shape[1]
        backend = "scaled_mm" if x2.shape[0] >= 1024 and k % 512 == 0 and weight.shape[0] % 128 == 0 else "triton"
        xq, xs = per_token_group_quant_fp8(x2, column_major_scales=backend == "scaled_mm")
        out = fp8_block_gemm(xq, xs, weight, weight_scale_inv, x.dtype, backend=backend)
        return out.view(*lead, weight.shape[0])

    def fused_moe(self, x, w13, w2, topk_weights, topk_ids):
        """``deepinfer_kernels.fused_moe`` without its host-side id check (the ids come from the
        router; the check would sync, and cannot run inside a CUDA graph capture)."""
        from deepinfer_kernels.fused_moe import fused_moe

        return fused_moe(x, w13, w2, topk_weights, topk_ids, check_ids=False)

    def evict_policy(self, weight) -> str:
        """The L2 policy of ``weight``'s loads (see ``l2_keep_bytes``), fixed when first asked."""
        if not self.l2_keep_bytes:
            return ""
        key = weight.data_ptr()
        if key not in self._evict:
            size = weight.numel() * weight.element_size()
            keep = self._kept + size <= self.l2_keep_bytes
            self._kept += size if keep else 0
            self._evict[key] = "evict_last" if keep else "evict_first"
        return self._evict[key]

    def _gemv(self, x, weight, **kwargs):
        kwargs.setdefault("evict", self.evict_policy(weight))
        return (gemv if x.shape[0] == 1 else gemv_rows)(x, weight, pdl=self._pdl(x), **kwargs)

    def _gemv_qkv_rotary(self, x, weight, *args, **kwargs):
        kwargs.setdefault("evict", self.evict_policy(weight))
        return (gemv_qkv_rotary if x.shape[0] == 1 else gemv_rows_qkv_rotary)(x, weight, *args, pdl=self._pdl(x),
                                                                              **kwargs)
