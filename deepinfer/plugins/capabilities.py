"""The optional part of the plugin API: what a plugin meets only when it goes beyond its slot's
required members (a capability the core looks for with ``isinstance``, or a device's fused kernels
and graphs), and what a model may offer a hook plugin. docs/writing-a-plugin.md, "The API", lists
them with the slot each belongs to."""
from deepinfer.core.capabilities import FusedKVWrite, HandlesSingleRuns, Rests, SeparatesWindowedKV, SkipsRounds
from deepinfer.core.fused_ops import FusedOps
from deepinfer.core.interfaces import DeviceGraphs
from deepinfer.core.model_registry import CountsExpertLoad, PlacesExperts

__all__ = [
    "CountsExpertLoad",    # [hooks] model capability: expert_load(), tokens per routed expert per MoE layer
    "DeviceGraphs",        # [device] what Device.graphs() returns: captures a step for replay
    "FusedKVWrite",        # [attention] capability: the device's fused qkv kernel writes the KV cache
    "FusedOps",            # [device] what Device.fused_ops() returns: the fused kernels' signatures
    "HandlesSingleRuns",   # [attention] capability: one-token runs inside verification graphs
    "PlacesExperts",       # [hooks] model capability: apply_placement(maps), experts re-placed on slots
    "Rests",               # [drafter] capability: rests_above(), no drafts while n or more decode
    "SeparatesWindowedKV", # [cache policy] capability: a KV pool of its own for sliding-window layers
    "SkipsRounds",         # [drafter] capability: says before a round whether it drafts (overlap stays on)
]
