"""The gauges of a model that counts its experts' load (``CountsExpertLoad``): read from the
model's counters when metrics are asked for, never in a step."""
from __future__ import annotations

import torch

from deepinfer.core.metrics import Metrics
from deepinfer.core.model_registry import CountsExpertLoad

GAUGES = {
    "deepinfer:moe_routed_tokens": "tokens routed to experts (top-k per token, summed over MoE layers) since "
                                   "the load or the last reset of the expert load counters",
    "deepinfer:moe_expert_load_imbalance": "busiest expert's tokens over the mean expert's, in the worst MoE layer",
}


class ExpertLoadGauges:
    """Registers the gauges, and sets them from the model's counters on ``update``."""

    def __init__(self, model: CountsExpertLoad, metrics: Metrics) -> None:
        self.model, self.metrics = model, metrics
        for name, text in GAUGES.items():
            metrics.gauge(name, text)

    @classmethod
    def of(cls, model: object, metrics: Metrics) -> ExpertLoadGauges | None:
        """The gauges of ``model``, or None for a model without expert load counters."""
        return cls(model, metrics) if isinstance(model, CountsExpertLoad) else None

    def update(self) -> None:
        load = self.model.expert_load().double()
        if load.numel() == 0:
            return
        mean = load.mean(dim=1)
        busiest = torch.where(mean > 0, load.amax(dim=1) / mean.clamp(min=1e-9), torch.zeros_like(mean))
        self.metrics.set("deepinfer:moe_routed_tokens", load.sum().item())
        self.metrics.set("deepinfer:moe_expert_load_imbalance", busiest.max().item())
