"""The engine's gauges: KV-cache usage, running and waiting requests (set after each step), and the
expert load of a model that counts it (``CountsExpertLoad``), read from the model's counters when
metrics are asked for, never in a step."""
from __future__ import annotations

import torch

from deepinfer.core.interfaces import Scheduler
from deepinfer.core.kv_manager import KVCacheManager
from deepinfer.core.metrics import Metrics
from deepinfer.core.model_registry import CountsExpertLoad


class EngineGauges:
    """Registers the gauges; ``update`` sets them (``with_experts``: the expert load too, which waits
    for the device, so it is read only when metrics are asked for)."""

    def __init__(self, metrics: Metrics, kv: KVCacheManager, scheduler: Scheduler, model: object) -> None:
        self.metrics, self.kv, self.scheduler = metrics, kv, scheduler
        for name in ("kv_cache_usage", "num_requests_running", "num_requests_waiting"):
            metrics.gauge(f"deepinfer:{name}")
        self.experts = ExpertLoadGauges.of(model, metrics)

    def update(self, with_experts: bool = False) -> None:
        m = self.metrics
        m.set("deepinfer:kv_cache_usage", self.kv.usage)
        m.set("deepinfer:num_requests_running", self.scheduler.num_running)
        m.set("deepinfer:num_requests_waiting", self.scheduler.num_waiting)
        if with_experts and self.experts is not None:
            self.experts.update()


EXPERT_GAUGES = {
    "deepinfer:moe_routed_tokens": "tokens routed to experts (top-k per token, summed over MoE layers) since "
                                   "the load or the last reset of the expert load counters",
    "deepinfer:moe_expert_load_imbalance": "busiest expert's tokens over the mean expert's, in the worst MoE layer",
}


class ExpertLoadGauges:
    """Registers the expert gauges, and sets them from the model's counters on ``update``."""

    def __init__(self, model: CountsExpertLoad, metrics: Metrics) -> None:
        self.model, self.metrics = model, metrics
        for name, text in EXPERT_GAUGES.items():
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
