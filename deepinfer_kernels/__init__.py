"""Triton kernels and their torch references (no deepinfer imports).

Each kernel ``f`` has a plain-torch ``f_ref`` beside it with the same signature; tests compare the
two under TRITON_INTERPRET=1 on the CPU (float32/float16) and compiled on a GPU (bfloat16).
Importing this package needs triton; it never initialises CUDA.
"""
from deepinfer_kernels._launch import pdl_supported, triton_interpreted
from deepinfer_kernels.activation import silu_and_mul, silu_and_mul_ref
from deepinfer_kernels.argmax import argmax, argmax_prob, argmax_prob_ref, argmax_ref
from deepinfer_kernels.chain_inputs import chain_inputs
from deepinfer_kernels.embedding import embedding, embedding_ref
from deepinfer_kernels.fp8_gemm import (
    block_quantize_fp8,
    dequantize_block_fp8,
    fp8_block_gemm,
    fp8_block_gemm_ref,
    per_token_group_quant_fp8,
    per_token_group_quant_fp8_ref,
)
from deepinfer_kernels.fused_moe import MoeConfig, fused_moe, fused_moe_ref
from deepinfer_kernels.fused_ops import FusedOps
from deepinfer_kernels.gemv import GemvConfig, gemv, gemv_qkv_rotary, gemv_qkv_rotary_ref, gemv_ref
from deepinfer_kernels.gemv_rows import (
    RowsConfig,
    gemv_rows,
    gemv_rows_qkv_rotary,
    gemv_rows_qkv_rotary_ref,
    gemv_rows_ref,
    rows_supported,
)
from deepinfer_kernels.kv_cache import write_kv_cache, write_kv_cache_ref, write_mla_cache, write_mla_cache_ref
from deepinfer_kernels.mla_attention import mla_decode_attention, mla_decode_attention_ref
from deepinfer_kernels.moe_align import MoeAlignment, moe_align, moe_align_ref
from deepinfer_kernels.moe_routing import grouped_topk, grouped_topk_ref
from deepinfer_kernels.paged_attention import (
    DEFAULT_SPLIT,
    num_decode_splits,
    paged_decode_attention,
    paged_decode_attention_ref,
)
from deepinfer_kernels.placeholders import (
    resolve_placeholders,
    resolve_placeholders_ref,
    stage_inputs,
    stage_inputs_ref,
)
from deepinfer_kernels.prefill_attention import paged_prefill_attention, paged_prefill_attention_ref
from deepinfer_kernels.rms_norm import rms_norm, rms_norm_ref
from deepinfer_kernels.rotary import apply_rotary, apply_rotary_ref

__all__ = [
    "DEFAULT_SPLIT",
    "FusedOps",
    "GemvConfig",
    "MoeAlignment",
    "MoeConfig",
    "RowsConfig",
    "apply_rotary",
    "apply_rotary_ref",
    "argmax",
    "argmax_prob",
    "argmax_prob_ref",
    "argmax_ref",
    "block_quantize_fp8",
    "chain_inputs",
    "dequantize_block_fp8",
    "embedding",
    "embedding_ref",
    "fp8_block_gemm",
    "fp8_block_gemm_ref",
    "fused_moe",
    "fused_moe_ref",
    "gemv",
    "gemv_qkv_rotary",
    "gemv_qkv_rotary_ref",
    "gemv_ref",
    "gemv_rows",
    "gemv_rows_qkv_rotary",
    "gemv_rows_qkv_rotary_ref",
    "gemv_rows_ref",
    "grouped_topk",
    "grouped_topk_ref",
    "mla_decode_attention",
    "mla_decode_attention_ref",
    "moe_align",
    "moe_align_ref",
    "num_decode_splits",
    "paged_decode_attention",
    "paged_decode_attention_ref",
    "paged_prefill_attention",
    "paged_prefill_attention_ref",
    "pdl_supported",
    "per_token_group_quant_fp8",
    "per_token_group_quant_fp8_ref",
    "resolve_placeholders",
    "resolve_placeholders_ref",
    "rms_norm",
    "rms_norm_ref",
    "rows_supported",
    "silu_and_mul",
    "silu_and_mul_ref",
    "stage_inputs",
    "stage_inputs_ref",
    "triton_interpreted",
    "write_kv_cache",
    "write_kv_cache_ref",
    "write_mla_cache",
    "write_mla_cache_ref",
]
