"""DeepSeek-V2/V3 checkpoint names -> the model's parameters.

As the Hugging Face checkpoints name them, except: each layer's routed experts
(``mlp.experts.{e}.{gate,up,down}_proj.weight``) are stacked into ``mlp.w13`` [E, 2I, D] (gate rows,
then up rows) and ``mlp.w2`` [E, D, I] (transformers' in-memory stacks, ``mlp.experts.gate_up_proj``
and ``mlp.experts.down_proj``, are taken too); gate_proj and up_proj of dense and shared-expert MLPs
fill ``gate_up_proj``; the router (``mlp.gate``) stays float32 whatever the model's dtype; layers past
``num_hidden_layers`` (V3's multi-token-prediction layer) and rotary buffers are skipped; FP8
weights with their ``weight_scale_inv`` are dequantized to the model's dtype (``fp8.py``).
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import torch

from deepinfer.core.loader import WeightsError
from deepinfer.models.fp8 import dequantized

if TYPE_CHECKING:
    from deepinfer.models.deepseek import DeepseekV2ForCausalLM

_EXPERT = re.compile(r"^(.*\.mlp)\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
_STACKED = {"gate_up_proj": "w13", "down_proj": "w2"}  # transformers' stacked expert tensors
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def _destination(name: str, params: dict[str, torch.Tensor]) -> tuple[str, torch.Tensor] | None:
    """The parameter a checkpoint tensor fills and the view of it that it fills (None: unknown)."""
    if m := _EXPERT.match(name):
        prefix, e, proj = m.group(1), int(m.group(2)), m.group(3)
        if proj == "down_proj":
            target = f"{prefix}.w2"
            return (target, params[target][e]) if target in params else None
        target = f"{prefix}.w13"
        if target not in params:
            return None
        half = params[target].shape[1] // 2
        return target, params[target][e, :half] if proj == "gate_proj" else params[target][e, half:]
    parts = name.split(".")
    if len(parts) >= 3 and parts[-2] == "experts" and parts[-1] in _STACKED:
        target = ".".join(parts[:-2] + [_STACKED[parts[-1]]])
        return (target, params[target]) if target in params else None
    if len(parts) >= 2 and parts[-2] in ("gate_proj", "up_proj") and parts[-1] == "weight":
        target = ".".join(parts[:-2] + ["gate_up_proj", "weight"])
        if target not in params:
            return None
        half = params[target].shape[0] // 2
        return target, params[target][:half] if parts[-2] == "gate_proj" else params[target][half:]
    return (name, params[name]) if name in params else None


def _kept(model: DeepseekV2ForCausalLM, weights: Iterable[tuple[str, torch.Tensor]]
          ) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors the model may use: not rotary buffers, layers past num_hidden_layers, a tied
    LM head, or empty tensors (shared experts of size 0)."""
    n_layers = model.config.num_hidden_layers
    for name, tensor in weights:
        layer = _LAYER.match(name)
        if ("rotary_emb" in name or (layer is not None and int(layer.group(1)) >= n_layers)
                or (name == "lm_head.weight" and model.lm_head is None) or tensor.numel() == 0):
            continue
        yield name, tensor


def load_checkpoint(model: DeepseekV2ForCausalLM, weights: Iterable[tuple[str, torch.Tensor]],
                    fp8_block: tuple[int, int] | None = None) -> None:
    """Copy every tensor in (block-scaled FP8 weights dequantized first, ``fp8_block``); raise on
    unknown, mis-shaped or missing ones."""
    for moe in model.moe_layers():  # the router computes in float32 (as DeepSeek and transformers keep it)
        for p in (moe.gate.weight, moe.gate.e_score_correction_bias):
            if p is not None:
                p.data = p.data.float()
    params = {n: p.data for n, p in model.named_parameters()}
    filled = dict.fromkeys(params, 0)  # elements copied
    unexpected: list[str] = []
    weights = _kept(model, weights)
    for name, tensor in (weights if fp8_block is None else dequantized(weights, fp8_block)):
        found = _destination(name, params)
        if found is None:
            unexpected.append(name)
            continue
        target, dest = found
        if tuple(dest.shape) != tuple(tensor.shape):
            raise WeightsError(f"weight {name!r} has shape {tuple(tensor.shape)}, the model expects "
                               f"{tuple(dest.shape)}")
        dest.copy_(tensor)
        filled[target] += dest.numel()
    if unexpected:
        raise WeightsError(f"checkpoint has tensors this {model.config.architecture} does not use: "
                           f"{unexpected[:8]}{' ...' if len(unexpected) > 8 else ''}")
    missing = sorted(n for n, p in params.items() if filled[n] < p.numel())
    if missing:
        raise WeightsError(f"checkpoint lacks tensors for: {missing[:8]}{' ...' if len(missing) > 8 else ''}")
