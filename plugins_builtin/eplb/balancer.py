"""The ``eplb`` hook plugin: re-places a mixture-of-experts model's experts on the expert-parallel
ranks every ``interval`` steps, from the expert load of the latest ``window`` steps.

The load comes from the model's counters (``CountsExpertLoad``), cumulative since the model was
loaded. Reading them waits for the device, so the window is kept as snapshots of the counters taken
only at the steps a placement needs (each placement's step and, ``window`` steps before it, the
window's start: two reads an interval), never every step. A placement goes to the model
(``PlacesExperts.apply_placement``), whose expert-parallel runtime moves the weights; it is applied
only where it makes the busiest rank less busy than the placement in force.
"""
from __future__ import annotations

import torch
from pydantic import BaseModel, ConfigDict, Field

from deepinfer.plugins import PluginError, hookimpl
from deepinfer.plugins.capabilities import CountsExpertLoad, PlacesExperts
from deepinfer_builtin.eplb.placement import check_sizes, identity_placement, imbalance, rebalance_experts

IMBALANCE = "deepinfer:eplb_imbalance"
PLANNED = "deepinfer:eplb_planned_imbalance"
REBALANCES = "deepinfer:eplb_rebalances"


class EPLBOptions(BaseModel):
    """The ``eplb`` config section."""

    model_config = ConfigDict(extra="forbid")
    window: int = Field(1000, ge=1, description="steps of expert load (the latest) a placement is made for")
    interval: int = Field(10_000, ge=1, description="steps between placements")
    num_redundant_experts: int = Field(0, ge=0, description="physical slots a MoE layer has beyond its experts")
    num_ranks: int = Field(8, ge=1, description="expert-parallel ranks (GPUs) the slots are spread over")
    num_nodes: int = Field(1, ge=1, description="nodes the ranks are on (groups of experts stay on one)")
    num_groups: int = Field(1, ge=1, description="expert groups the router picks within (DeepSeek-V3: n_group)")


class ExpertLoadBalancer:
    """Owns the window of expert load, the placement in force and the ``deepinfer:eplb_*`` metrics."""

    name = "eplb"
    Options = EPLBOptions

    def __init__(self, options: EPLBOptions) -> None:
        self.options = options
        self.model: CountsExpertLoad | PlacesExperts | None = None
        self.metrics = None
        self.num_steps = 0                               # steps that computed tokens since the engine started
        self.snapshots: dict[int, torch.Tensor] = {}     # step -> the load counters then [L, E]
        self.placement: torch.Tensor | None = None       # physical_to_logical in force [L, num_replicas]

    @property
    def num_replicas(self) -> int:
        return self.placement.shape[1]

    @hookimpl
    def deepinfer_config_finalized(self, config) -> None:
        """With expert parallelism the ranks and the redundant slots are the engine's: taken from its
        config, and refused where this plugin's options say otherwise."""
        if not config.enable_expert_parallel or config.world_size == 1:
            return
        engine = {"num_ranks": config.world_size, "num_redundant_experts": config.num_redundant_experts}
        for key, value in engine.items():
            if key in self.options.model_fields_set and getattr(self.options, key) != value:
                raise PluginError(f"plugin 'eplb': option {key} {getattr(self.options, key)} disagrees with the "
                                  f"engine's expert parallelism ({value}: {config.world_size} ranks, "
                                  f"num_redundant_experts {config.num_redundant_experts}); leave {key} out")
        self.options = self.options.model_copy(update=engine)

    @hookimpl
    def deepinfer_model_loaded(self, model) -> None:
        if not isinstance(model, CountsExpertLoad) or not isinstance(model, PlacesExperts):
            raise PluginError(f"plugin 'eplb' balances the routed experts of a mixture-of-experts model that counts "
                              f"their load and can re-place them (CountsExpertLoad, PlacesExperts, as DeepSeek-V2/V3 "
                              f"do); {type(model).__name__} does not: leave eplb out of plugins for this model")
        num_layers, num_logical = model.expert_load().shape
        o = self.options
        if num_layers == 0:
            raise PluginError("plugin 'eplb': this model has no MoE layers to balance; leave eplb out of plugins")
        try:
            check_sizes(num_logical, num_logical + o.num_redundant_experts, o.num_groups, o.num_nodes, o.num_ranks)
        except ValueError as e:
            raise PluginError(f"options of plugin 'eplb' do not fit this model's {num_logical} routed experts: {e}; "
                              "set num_redundant_experts, num_ranks, num_nodes and num_groups to match") from None
        self.model = model
        self.placement = identity_placement(num_layers, num_logical, num_logical + o.num_redundant_experts)

    @hookimpl
    def deepinfer_register_metrics(self, metrics) -> None:
        self.metrics = metrics
        metrics.gauge(IMBALANCE, "busiest expert-parallel rank's routed tokens over the mean rank's, summed over MoE "
                                 "layers, for the last window's load under the placement in force")
        metrics.gauge(PLANNED, "the same for the placement computed at the last interval")
        metrics.counter(REBALANCES, "expert placements applied")

    @hookimpl
    def deepinfer_engine_started(self) -> None:
        self.snapshots = {0: self.model.expert_load()}  # (after graph capture, whose padding rows counted)

    @hookimpl
    def deepinfer_step_end(self, num_tokens: int) -> None:
        if num_tokens == 0:  # (nothing ran)
            return
        self.num_steps += 1
        step, window, interval = self.num_steps, self.options.window, self.options.interval
        if step % interval == 0 or (step + window) % interval == 0:
            self.snapshots[step] = self.model.expert_load()
        if step % interval == 0:
            self.rebalance(self.window_load())
            self.snapshots = {s: c for s, c in self.snapshots.items() if s >= step + interval - window}

    def window_load(self) -> torch.Tensor:
        """Tokens each expert received in the latest ``window`` steps (fewer at first) [L, E]; after a
        reset of the counters (``LLM.reset_expert_load``) inside the window, those since the reset."""
        now = self.snapshots[self.num_steps]
        load = now - self.snapshots[max(self.num_steps - self.options.window, 0)]
        return now if (load < 0).any() else load

    def rebalance(self, load: torch.Tensor) -> None:
        """Measure the placement in force on ``load``, compute a new one, and apply it if it is better."""
        o = self.options
        current = imbalance(load, self.placement, o.num_ranks)
        self.metrics.set(IMBALANCE, current)
        if load.sum() == 0:  # (no routed token in the window: nothing to balance)
            return
        placed = rebalance_experts(load, self.num_replicas, o.num_groups, o.num_nodes, o.num_ranks)
        planned = imbalance(load, placed.physical_to_logical, o.num_ranks)
        self.metrics.set(PLANNED, planned)
        if planned < current:
            self.model.apply_placement(*placed)
            self.placement = placed.physical_to_logical
            self.metrics.inc(REBALANCES)
