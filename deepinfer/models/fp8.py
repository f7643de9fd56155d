"""DeepSeek's block-scaled FP8 checkpoints, dequantized as they are read.

A quantized weight W [N, K] is stored as float8 (e4m3) with ``W.weight_scale_inv`` [ceil(N/bn),
ceil(K/bk)] float32 beside it (``quantization_config.weight_block_size`` = [bn, bk]): the weight's
value is its float8 value times the scale of its block. Until an FP8 GEMM takes the float8 weights
themselves, the model holds them dequantized, in its own dtype.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from deepinfer.core.loader import WeightsError
from deepinfer.core.model_config import ModelConfig, ModelConfigError

SCALE_SUFFIX = "_scale_inv"
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def fp8_block_size(config: ModelConfig) -> tuple[int, int] | None:
    """The checkpoint's FP8 weight block (None: not quantized); refuses quantizations not supported."""
    q: dict[str, Any] | None = config.raw.get("quantization_config")
    if not q:
        return None
    method, fmt, block = q.get("quant_method"), q.get("fmt", "e4m3"), q.get("weight_block_size")
    if method != "fp8" or fmt != "e4m3" or not (isinstance(block, list | tuple) and len(block) == 2):
        raise ModelConfigError(f"{config.path}/config.json: quantization_config {q} is not supported; supported: "
                               "quant_method fp8, fmt e4m3, weight_block_size [rows, columns] (DeepSeek's "
                               "block-scaled FP8)")
    return int(block[0]), int(block[1])


def dequantize(weight: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """float32 values of a block-scaled float8 ``weight`` [N, K]."""
    n, k = weight.shape
    bn, bk = block
    want = (-(-n // bn), -(-k // bk))
    if tuple(scale_inv.shape) != want:
        raise WeightsError(f"an FP8 weight of shape {(n, k)} in blocks of {block} needs scales of shape {want}, "
                           f"not {tuple(scale_inv.shape)}")
    scales = scale_inv.float().repeat_interleave(bn, dim=0)[:n].repeat_interleave(bk, dim=1)[:, :k]
    return weight.float() * scales


def dequantized(weights: Iterable[tuple[str, torch.Tensor]], block: tuple[int, int]
                ) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors with each float8 weight paired with its scales and dequantized (a
    weight or scale waits for its partner, which may come later or from another shard)."""
    weights_by_name: dict[str, torch.Tensor] = {}
    scales_by_weight: dict[str, torch.Tensor] = {}
    for name, tensor in weights:
        if name.endswith(SCALE_SUFFIX):
            target = name[: -len(SCALE_SUFFIX)]
            if target in weights_by_name:
                yield target, dequantize(weights_by_name.pop(target), tensor, block)
            else:
                scales_by_weight[target] = tensor
        elif tensor.dtype in FP8_DTYPES:
            if name in scales_by_weight:
                yield name, dequantize(tensor, scales_by_weight.pop(name), block)
            else:
                weights_by_name[name] = tensor
        else:
            yield name, tensor
    unpaired = sorted(weights_by_name) + sorted(n + SCALE_SUFFIX for n in scales_by_weight)
    if unpaired:
        raise WeightsError(f"FP8 checkpoint: these tensors lack their weight or {SCALE_SUFFIX} partner: "
                           f"{unpaired[:8]}{' ...' if len(unpaired) > 8 else ''}")
