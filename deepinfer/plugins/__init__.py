"""The public plugin API: everything a plugin (built-in or third-party) may import from deepinfer.

A plugin subclasses one of the slot interfaces below, declares an ``Options`` pydantic model if
it takes options, and is registered as an entry point in its slot's group (docs/writing-a-plugin.md).
What a plugin meets only when it goes beyond its slot (optional capabilities, a device's fused
kernels and graphs, what a model offers hook plugins) is in ``deepinfer.plugins.capabilities``.
The machinery that finds and loads plugins (``deepinfer.plugins.discovery``, ``groups``,
``selection``) is the engine's, not a plugin's.
"""
from deepinfer.core.block_pool import Block
from deepinfer.core.context import EngineContext
from deepinfer.core.interfaces import (
    AttentionBackend,
    AttentionLayerSpec,
    CachePolicy,
    Device,
    Drafter,
    DraftProposal,
    NoOptions,
    PrefixMatch,
    ScheduledRequest,
    Scheduler,
    SchedulerOutput,
)
from deepinfer.core.kv_groups import KVGroupSpec
from deepinfer.core.request import Request, RequestStatus
from deepinfer.core.second_model import SecondModel
from deepinfer.core.step_batch import KVGroupBatch, StepBatch
from deepinfer.plugins.discovery import PluginError
from deepinfer.plugins.hookspecs import hookimpl

# (each name's slot in brackets; docs/writing-a-plugin.md, "The API", says more)
__all__ = [
    "AttentionBackend",    # [attention] the slot: KV layout and allocation, per-step metadata, forward
    "AttentionLayerSpec",  # [attention] one layer's heads, head size, scale, window and KV group
    "Block",               # [cache policy] one block of the KV pool: id, reference count, a policy's key
    "CachePolicy",         # [cache policy] the slot: which cached blocks a request reuses, what stays reusable
    "Device",              # [device] the slot: torch device, availability, memory budget, optional kernels
    "DraftProposal",       # [drafter] one request's drafts (and the distributions they were drawn from)
    "Drafter",             # [drafter] the slot: proposes draft tokens; the core verifies them
    "EngineContext",       # [every plugin] what it is built with: config, metrics, device, layers, KV manager
    "KVGroupBatch",        # [attention] one KV group's slots and block tables in a step (StepBatch.kv_groups)
    "KVGroupSpec",         # [cache policy] one KV group: its layers, window, and most live blocks per request
    "NoOptions",           # [every plugin] the Options model of a plugin that takes none
    "PluginError",         # [every plugin] raise it to refuse a configuration, saying what to do
    "PrefixMatch",         # [cache policy] match()'s answer: the blocks reused and the tokens they cover
    "Request",             # [every plugin] one sequence: its tokens, sampling params, status, KV block ids
    "RequestStatus",       # [every plugin] waiting, running, preempted, or finished and why
    "ScheduledRequest",    # [scheduler] one request of a step and how many tokens it computes
    "Scheduler",           # [scheduler] the slot: picks each step's requests and token counts
    "SchedulerOutput",     # [scheduler] one step: the requests, preempted victims, drafts to verify
    "SecondModel",         # [drafter] a second model beside the target, for a drafter that runs one
    "StepBatch",           # [attention] one step's flattened inputs, as build_metadata receives them
    "hookimpl",            # [hooks] marks a hook implementation (specs: deepinfer/plugins/hookspecs.py)
]
