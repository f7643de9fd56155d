"""Model architectures by the ``architectures`` name of config.json, and the interface they implement."""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import replace
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from deepinfer.core.fused_ops import FusedOps
from deepinfer.core.interfaces import AttentionBackend, AttentionLayerSpec
from deepinfer.core.model_config import ModelConfig


class CausalLM(nn.Module, ABC):
    """A decoder-only model over flattened tokens; attention goes through the backend it is given."""

    def __init__(self, config: ModelConfig, attention: AttentionBackend) -> None:
        super().__init__()
        self.config = config
        self.attention = attention
        self.fused_ops: FusedOps | None = None  # the device's fused kernels, if it offers them (use_fused_ops)
        self.linear_op: Any = None  # the device's matmul for linear layers, if it offers one (use_linear_op)

    @abstractmethod
    def attention_layers(self) -> list[AttentionLayerSpec]: ...

    @abstractmethod
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[Any], attn_metadata: Any) -> torch.Tensor:
        """Hidden states [T, hidden] for the step's flattened tokens, before the final norm."""

    @abstractmethod
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [R, vocab] of R rows of ``forward``'s hidden states: the final norm, then the LM
        head (so that a step normalises only the rows it samples from)."""

    def use_fused_ops(self, ops: FusedOps | None) -> None:
        """Route norms, rotary embedding and activations through a device's fused kernels."""
        for module in self.modules():
            if hasattr(module, "fused_ops"):
                module.fused_ops = ops

    def use_linear_op(self, op: Any) -> None:
        """Route the linear layers and the LM head through a device's matmul (``Device.linear_op``)."""
        for module in self.modules():
            if hasattr(module, "linear_op"):
                module.linear_op = op

    def fp8_linears(self) -> list[nn.Module]:
        """The linear layers whose weights may be block-scaled FP8 (``quantization: fp8``): modules
        with ``quantize_fp8(op)``, none that another path reads the weight of directly. None here: a
        model family that supports FP8 names them."""
        return []

    def assign_kv_groups(self, groups: dict[int, int]) -> list[AttentionLayerSpec]:
        """Give layer i the KV group ``groups[i]`` (missing: 0); returns the new layer specs."""
        for module in self.modules():
            spec = getattr(module, "spec", None)
            if isinstance(spec, AttentionLayerSpec):
                module.spec = replace(spec, kv_group=groups.get(spec.layer_idx, 0))
        return self.attention_layers()

    @abstractmethod
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy checkpoint tensors in; raise on missing, unexpected or mis-shaped ones."""


@runtime_checkable
class CountsExpertLoad(Protocol):
    """A model with routed experts that counts, on the device, the tokens each expert receives
    (every token a step computes, top-k times; steps replayed from graphs count their padding rows)."""

    def expert_load(self) -> torch.Tensor:
        """int64 [num_moe_layers, num_routed_experts] on the host (reading it waits for the device)."""
        ...

    def reset_expert_load(self) -> None:
        """Set every count to 0."""
        ...


@runtime_checkable
class PlacesExperts(Protocol):
    """A model whose routed experts run on physical expert slots that an expert load balancer (a
    hook plugin) may re-place: ``num_physical`` slots a MoE layer, as many on each expert-parallel
    rank (slot p on rank p // (num_physical / num_ranks)). Until the first placement, slot p holds
    logical expert p mod num_logical."""

    def apply_placement(self, physical_to_logical: torch.Tensor, logical_to_physical: torch.Tensor,
                        logical_replica_count: torch.Tensor) -> None:
        """Hold and route by this placement from the next step on (the maps are on the host, int64):
        ``physical_to_logical`` [num_moe_layers, num_physical], the logical expert of each slot;
        ``logical_to_physical`` [num_moe_layers, num_logical, max_replicas], each expert's slots,
        lowest first, -1 padded; ``logical_replica_count`` [num_moe_layers, num_logical]. Called
        between steps by the process that runs the engine loop; raise ValueError for maps that do
        not fit the model."""
        ...


class UnsupportedArchitectureError(ValueError):
    """config.json names an architecture no registered model implements."""


class ModelRegistry:
    """Architecture name -> model class; the composition root fills it from entry points."""

    def __init__(self) -> None:
        self._models: dict[str, type[CausalLM]] = {}
        self._broken: dict[str, str] = {}  # architecture -> why its plugin failed to load

    def register(self, architecture: str, cls: type[CausalLM]) -> None:
        self._models[architecture] = cls

    def register_broken(self, architecture: str, reason: str) -> None:
        """A model plugin that failed to load: only a model of this architecture fails (with ``reason``)."""
        self._broken[architecture] = reason

    @property
    def architectures(self) -> list[str]:
        return sorted(self._models)

    def resolve(self, architecture: str) -> type[CausalLM]:
        try:
            return self._models[architecture]
        except KeyError:
            if architecture in self._broken:
                raise UnsupportedArchitectureError(self._broken[architecture]) from None
            raise UnsupportedArchitectureError(
                f"architecture {architecture!r} is not supported; supported: "
                f"{', '.join(self.architectures) or '(none registered)'}"
            ) from None
